"""`aot-cache` on real small bundles (built on the CPU by the session fixture `small_bundles`)."""

import dataclasses
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from cute_aot.aot import binary_info
from cute_aot.aot.planning import plan_from_misses
from cute_aot.aot.tools.aot_cache.cli import main, parse_age, parse_size
from cute_aot.aot.tools.aot_cache.facts import gc as overlay_gc
from cute_aot.artifacts import fatbin as fatbin_format
from cute_aot.artifacts.bundle import parse_manifest, read_bundle, read_manifest
from cute_aot.artifacts.bundle_writer import encode_bundle
from cute_aot.artifacts.core.errors import BinaryInspectionError, ElfError, ToolNotFoundError
from cute_aot.artifacts.elf import read_dynamic, read_sections
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.kernels import Dispatch, KernelFamily, TensorArg, families, family
from cute_aot.kernels.contract import parse_ints
from cute_aot.kernels.keys import KernelKey
from cute_aot.kernels.router_gemm import RouterProblem, dispatch
from cute_aot.runtime import overlay
from cute_aot.runtime.misses import forget_recorded, record_miss
from tests.stubs import installed_families

from .conftest import PROBLEMS

HAS_TOOLS = bool(binary_info.find_tool("cuobjdump") and binary_info.find_tool("nvdisasm"))
needs_tools = pytest.mark.skipif(not HAS_TOOLS, reason="needs cuobjdump and nvdisasm")
DOT, SPLITK = PROBLEMS  # (2, 256, 4096) -> dot-product key, (12, 256, 7168) -> split-K key


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch, settings_scope):
    """Own cache dir and miss log, no bundles from the environment (in this process: the
    commands run through CliRunner), wide tables."""
    settings_scope(
        CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"),
        CUTE_AOT_BUNDLES=None,
        CUTE_AOT_MISS_LOG=None,
        CUTE_AOT_MODE=None,
    )
    monkeypatch.setenv("COLUMNS", "250")
    return tmp_path / "cache"


def _by_arch(built):
    folder, paths, _plan = built
    return folder, {read_manifest(path).arch: path for path in paths}


@pytest.fixture
def bundles(stub_bundles):
    """{arch: bundle path} of the session's stub-kernel bundles, and their folder."""
    return _by_arch(stub_bundles)


@pytest.fixture
def real_bundles(small_bundles):
    """The same, with real cross-compiled kernels: for what reads their GPU code."""
    return _by_arch(small_bundles)


def run(*args, code: int = 0):
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert result.exit_code == code, result.output
    return result


def run_json(*args, code: int = 0):
    return json.loads(run(*args, "--json", code=code).stdout)


def rewrite(source: Path, target: Path, change) -> Path:
    """A copy of a bundle whose manifest `change` edited, every hash recomputed (sound bytes,
    wrong meaning)."""
    manifest, library = read_bundle(source)
    _, data = encode_bundle(change(manifest), library)
    target.write_bytes(data)
    return target


def with_entries(manifest: Manifest, entries) -> Manifest:
    return dataclasses.replace(manifest, entries=tuple(entries))


def entry_for(manifest: Manifest, problem) -> Entry:
    return manifest.entry_by_id()[dispatch(*problem, manifest.arch).id]


def shape_text(problem) -> str:
    """(M, N, K), as RouterProblem holds it -> `M,N,K`, as explain reads it."""
    return ",".join(map(str, problem))


# -- ls ------------------------------------------------------------------------------------------
def test_ls_lists_bundles_with_their_facts(bundles):
    folder, by_arch = bundles
    listing = run_json("ls", folder)
    rows = {row["arch"]: row for row in listing["bundles"]}
    assert set(rows) == {"sm_90a", "sm_100a"}
    for arch, row in rows.items():
        manifest = read_manifest(by_arch[arch])
        assert row["status"] == "ok" and row["source"] == "argument"
        assert row["keys"] == 2 == len(manifest.entries)
        assert row["families"]["router_gemm"]["keys"] == 2
        assert row["families"]["router_gemm"]["version"] == 1
        assert row["file_size"] == by_arch[arch].stat().st_size
        assert row["toolchain"] == manifest.toolchain
        assert row["created_by"].startswith("cute-aot ")
    assert listing["overlay"] == []
    table = run("ls", folder).stdout
    assert "sm_90a" in table and "router_gemm v1" in table and "tvm-ffi" in table


def test_ls_in_a_pipe_keeps_every_path_whole(bundles, tmp_path):
    """Where release pipelines read it (stdout not a terminal: a pipe, a CI log), a long path
    stays on one row instead of folding into fragments at 80 columns."""
    _, by_arch = bundles
    deep = tmp_path / ("a-folder-name-long-enough-to-fold-" * 3) / "release-2026-12-04"
    deep.mkdir(parents=True)
    target = deep / by_arch["sm_90a"].name
    shutil.copy(by_arch["sm_90a"], target)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run(
        [sys.executable, "-m", "cute_aot.aot.tools.aot_cache.cli", "ls", str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert piped.returncode == 0, piped.stderr
    (row,) = [line for line in piped.stdout.splitlines() if str(target) in line]
    assert "sm_90a" in row


def test_ls_creates_no_overlay_key(bundles, tmp_path):
    """Listing reads; with an empty overlay it fingerprints nothing, so the overlay's signing
    key (made on first use by a JIT publish) is not created as a side effect of `ls`."""
    folder, _ = bundles
    listing = run_json("ls", folder)
    assert listing["overlay"] == [] and len(listing["bundles"]) == 2
    assert not overlay.signing_key_path().exists()
    assert not (tmp_path / "cache").exists()


def test_ls_reads_cute_aot_bundles_and_shows_the_overlay(bundles, settings_scope):
    folder, by_arch = bundles
    settings_scope(CUTE_AOT_BUNDLES=str(by_arch["sm_90a"]))
    key = dispatch(3, 128, 2880, "sm_90a")
    published = overlay.overlay_path(key, "sm_90a")
    published.parent.mkdir(parents=True)
    published.write_bytes(by_arch["sm_90a"].read_bytes())
    listing = run_json("ls")
    assert [row["path"] for row in listing["bundles"]] == [str(by_arch["sm_90a"])]
    assert listing["bundles"][0]["source"] == "CUTE_AOT_BUNDLES"
    [group] = listing["overlay"]
    assert group["family"] == "router_gemm" and group["status"] == "current"
    assert group["arch"] == "sm_90a" and group["keys"] == 1
    assert run_json("ls", "--no-overlay")["overlay"] == []


def test_ls_reports_an_unreadable_bundle_and_fails(bundles, tmp_path):
    _, by_arch = bundles
    junk = tmp_path / "junk.cuteaot"
    junk.write_bytes(b"not a bundle at all, just bytes" * 4)
    listing = run_json("ls", by_arch["sm_90a"], junk, code=1)
    assert [row["status"] for row in listing["bundles"]] == ["ok", "error"]
    assert "bad magic" in listing["bundles"][1]["error"]


# -- show ----------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_tools
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_show_reports_resources_read_from_each_cubin(real_bundles, arch):
    _, by_arch = real_bundles
    report = run_json("show", by_arch[arch])
    entries = {entry["key_id"]: entry for entry in report["entries"]}
    manifest, library = read_bundle(by_arch[arch])
    assert set(entries) == {entry.key_id for entry in manifest.entries}
    sm = fatbin_format.sm_number(arch)
    for entry in entries.values():
        assert entry["sm"] == [sm]
        fatbin = fatbin_format.find_fatbin(library, entry["fatbin_sha256"])
        assert fatbin is not None and len(fatbin) == entry["fatbin_size"]
        [kernel] = entry["kernels"]
        assert kernel["name"].startswith("kernel_") and 0 < kernel["registers"] <= 255
        assert kernel["stack"] == 0 and kernel["instruction_classes"]["total"] > 0
    split_k = entries[dispatch(*SPLITK, arch).id]["kernels"][0]["instruction_classes"]
    dot = entries[dispatch(*DOT, arch).id]["kernels"][0]["instruction_classes"]
    # the split-K kernel is mma.sync + ldmatrix + cp.async; the dot kernel is loads and shuffles
    assert split_k["HMMA"] > 0 and split_k["LDSM"] > 0 and split_k["LDGSTS"] > 0
    assert "HMMA" not in dot and dot["SHFL"] > 0 and dot["LDG"] > 0
    assert report["note"] is None


@pytest.mark.slow
@needs_tools
def test_show_one_key_in_detail(real_bundles):
    _, by_arch = real_bundles
    key = dispatch(*SPLITK, "sm_90a")
    text = run("show", by_arch["sm_90a"], "--key", key.id[:6]).stdout
    assert key.symbol in text and "split_k" in text
    assert "mma.sync (warp-level tensor cores)" in text and "most frequent opcodes" in text
    report = run_json("show", by_arch["sm_90a"], "--key", key.symbol)
    assert [entry["key_id"] for entry in report["entries"]] == [key.id]
    filtered = run_json("show", by_arch["sm_90a"], "--family", "router_gemm")
    assert len(filtered["entries"]) == 2


def test_show_refuses_unknown_keys_and_families(bundles):
    _, by_arch = bundles
    missing = run("show", by_arch["sm_90a"], "--key", "ffffffff", code=1)
    assert "no entry 'ffffffff' in this sm_90a bundle" in missing.stderr
    assert str(by_arch["sm_90a"]) in missing.stderr
    other = run("show", by_arch["sm_90a"], "--family", "moe_gemm", code=1)
    assert "family moe_gemm" in other.stderr


def test_show_says_when_resources_were_not_recorded(bundles, tmp_path):
    _, by_arch = bundles
    bare = rewrite(
        by_arch["sm_90a"],
        tmp_path / "bare.cuteaot",
        lambda m: with_entries(m, [dataclasses.replace(e, gpu_binary=None) for e in m.entries]),
    )
    report = run_json("show", bare)
    assert all(entry["kernels"] is None for entry in report["entries"])
    assert all(entry["fatbin_sha256"] is None for entry in report["entries"])
    assert "2 of 2 entries record no resources" in report["note"]
    assert "not recorded" in run("show", bare).stdout


# -- verify --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_verify_passes_sound_bundles(real_bundles):
    folder, _ = real_bundles
    result = run_json("verify", folder)
    assert result["ok"] and result["failures"] == [] and len(result["bundles"]) == 2
    for report in result["bundles"]:
        status = {check["check"]: check["status"] for check in report["checks"]}
        assert status["integrity"] == status["loader"] == status["sources"] == "ok"
        assert status["arch"] == "skip"  # no GPU here
        assert status["kernels"] == "ok"  # fatbin hashes are recorded even without cuobjdump
    assert "2 bundle(s) verified" in run("verify", folder).stdout


def _flip(source: Path, target: Path, offset: int) -> Path:
    data = bytearray(source.read_bytes())
    data[offset] ^= 0x01
    target.write_bytes(bytes(data))
    return target


def test_verify_fails_on_a_corrupted_payload_and_names_it(bundles, tmp_path):
    _, by_arch = bundles
    corrupt = _flip(by_arch["sm_90a"], tmp_path / "corrupt.cuteaot", -200)
    result = CliRunner().invoke(main, ["verify", str(by_arch["sm_100a"]), str(corrupt), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert not report["ok"]
    good, bad = report["bundles"]
    assert good["ok"] and not bad["ok"]
    assert bad["checks"] == [
        {
            "check": "integrity",
            "status": "fail",
            "detail": "payload hash mismatch (payload corrupted)",
        }
    ]
    assert f"FAILED {corrupt}: integrity: payload hash mismatch" in result.stderr


def test_verify_fails_on_a_corrupted_manifest(bundles, tmp_path):
    _, by_arch = bundles
    corrupt = _flip(by_arch["sm_90a"], tmp_path / "corrupt.cuteaot", 200)  # inside the manifest
    result = run("verify", corrupt, code=1)
    assert "manifest hash mismatch" in result.stderr


@pytest.mark.slow
def test_verify_finds_a_kernel_whose_fatbin_is_not_in_the_library(real_bundles, tmp_path):
    _, by_arch = real_bundles

    def lie(manifest):
        first, *rest = manifest.entries
        binary = {**first.gpu_binary, "fatbin_sha256": "0" * 64}
        return with_entries(manifest, [dataclasses.replace(first, gpu_binary=binary), *rest])

    forged = rewrite(by_arch["sm_90a"], tmp_path / "forged.cuteaot", lie)
    report = run_json("verify", forged, code=1)
    kernels = next(c for c in report["bundles"][0]["checks"] if c["check"] == "kernels")
    assert (
        kernels["status"] == "fail"
        and "0000000000000000) is not in the library" in kernels["detail"]
    )


def test_verify_finds_a_key_that_does_not_match_its_id(bundles, tmp_path):
    _, by_arch = bundles

    def swap_key(manifest):
        first, *rest = manifest.entries
        return with_entries(
            manifest, [dataclasses.replace(first, key={**first.key, "pdl": False}), *rest]
        )

    forged = rewrite(by_arch["sm_90a"], tmp_path / "forged.cuteaot", swap_key)
    report = run_json("verify", forged, code=1)
    loader = next(c for c in report["bundles"][0]["checks"] if c["check"] == "loader")
    assert loader["status"] == "fail" and "gives id" in loader["detail"]


def test_verify_fails_a_bundle_built_from_other_kernel_sources(bundles, tmp_path):
    _, by_arch = bundles

    def other_sources(manifest):
        families = {"router_gemm": {**manifest.families["router_gemm"], "source_hash": "f" * 64}}
        return dataclasses.replace(manifest, families=families)

    stale = rewrite(by_arch["sm_90a"], tmp_path / "stale.cuteaot", other_sources)
    result = run("verify", stale, code=1)
    assert "sources: stale for router_gemm: kernel source hash differs" in result.stderr


def test_verify_applies_the_gpu_architecture_rules(bundles):
    folder, by_arch = bundles
    # a folder: the other architecture's bundle is skipped, as loading the folder would
    report = run_json("verify", folder, "--gpu-arch", "sm90a")
    arch = {
        r["arch"]: next(c for c in r["checks"] if c["check"] == "arch") for r in report["bundles"]
    }
    assert arch["sm_90a"]["status"] == "ok" and arch["sm_100a"]["status"] == "skip"
    # a file named explicitly must fit
    wrong = run("verify", by_arch["sm_100a"], "--gpu-arch", "sm_90a", code=1)
    assert "built for sm_100a, this GPU needs sm_90a" in wrong.stderr
    # nothing for this GPU at all
    none = run("verify", folder, "--gpu-arch", "sm_103a", code=1)
    assert "no bundle for this GPU's architecture sm_103a" in none.stderr


def test_verify_with_nothing_to_verify_fails():
    assert "nothing to verify" in run("verify", code=1).stderr


# -- explain -------------------------------------------------------------------------------------
@pytest.mark.parametrize("problem", PROBLEMS)
def test_explain_finds_the_bundle_entry_for_each_shape(bundles, problem):
    folder, by_arch = bundles
    shape = shape_text(problem)
    report = run_json("explain", "router_gemm", "--shape", shape, "--bundle", folder)
    decisions = {d["arch"]: d for d in report["decisions"]}
    assert set(decisions) == {"sm_90a", "sm_100a", "sm_103a"}
    for arch in ("sm_90a", "sm_100a"):
        decision, key = decisions[arch], dispatch(*problem, arch)
        assert decision["key_id"] == key.id and decision["describe"] == key.describe()
        assert decision["source"] == "bundle" and decision["path"] == str(by_arch[arch])
        assert entry_for(read_manifest(by_arch[arch]), problem).symbol == decision["symbol"]
        kind = "dot-product" if key.backend == "dot" else "split-K"
        assert kind in decision["dispatch"]
    assert decisions["sm_103a"]["source"] == "jit"  # no sm_103a bundle: a miss
    text = run("explain", "router_gemm", "--shape", shape, "--bundle", folder).stdout
    assert f"bundle: {by_arch['sm_90a']}" in text


def test_explain_uses_the_tuned_table_and_says_so():
    # sm100 table (tuned.json): (K=4096, N=256) at M=8 -> split_k 8, 5 stages
    [decision] = run_json("explain", "router_gemm", "--shape", "8,256,4096", "--arch", "sm_100a")[
        "decisions"
    ]
    assert decision["key"]["split_k"] == 8 and decision["key"]["num_stages"] == 5
    assert "table row (K=4096, N=256, M in [5, 8])" in decision["dispatch"]
    assert "package defaults (router_gemm/tuned.json)" in decision["dispatch"]
    # sm_90a: the table aot-tune measured on an H200, named with its provenance
    [decision] = run_json("explain", "router_gemm", "--shape", "8,256,4096", "--arch", "sm_90a")[
        "decisions"
    ]
    assert "table row (K=4096, N=256, M in [8])" in decision["dispatch"]
    assert "aot-tune: NVIDIA H200" in decision["dispatch"]


def test_explain_follows_the_miss_path(bundles, isolated):
    folder, _ = bundles
    args = [
        "explain",
        "router_gemm",
        "--shape",
        "3,128,2880",
        "--arch",
        "sm_90a",
        "--bundle",
        folder,
    ]
    key = dispatch(3, 128, 2880, "sm_90a")
    [miss] = run_json(*args)["decisions"]
    assert miss["source"] == "jit" and miss["key_id"] == key.id
    assert "none of the 1 usable sm_90a bundle(s) holds the key" in miss["why"]
    assert str(isolated / "misses.jsonl") in miss["why"]
    [aot] = run_json(*args, "--mode", "aot")["decisions"]
    assert aot["source"] == "error" and "KernelNotFoundError" in aot["why"]
    published = overlay.overlay_path(key, "sm_90a")
    published.parent.mkdir(parents=True)
    published.write_bytes(b"a one-kernel bundle")
    [hit] = run_json(*args)["decisions"]
    assert hit["source"] == "overlay" and hit["path"] == str(published)
    [jit] = run_json(*args, "--mode", "jit")["decisions"]
    assert jit["source"] == "jit" and "mode jit" in jit["why"]


def test_explain_skips_a_stale_bundle_and_a_named_file_of_another_arch(bundles, tmp_path):
    _, by_arch = bundles

    def other_sources(manifest):
        families = {"router_gemm": {**manifest.families["router_gemm"], "source_hash": "f" * 64}}
        return dataclasses.replace(manifest, families=families)

    stale = rewrite(by_arch["sm_90a"], tmp_path / "stale.cuteaot", other_sources)
    shape = shape_text(DOT)
    report = run_json(
        "explain",
        "router_gemm",
        "--shape",
        shape,
        "--bundle",
        stale,
        "--bundle",
        by_arch["sm_100a"],
        "--arch",
        "sm_90a",
    )
    [decision] = report["decisions"]
    assert decision["source"] == "jit"
    notes = " ".join(decision["notes"])
    assert "is not used for it: kernel source hash differs" in notes
    assert "built for sm_100a: loading it by name on an sm_90a GPU raises" in notes


def test_explain_refuses_bad_problems():
    assert "M,N,K" in run("explain", "router_gemm", "--shape", "12x7168", code=2).output
    bad_k = run("explain", "router_gemm", "--shape", "2,256,7167", code=1)
    assert "K % 8 == 0" in bad_k.stderr
    fp16 = run("explain", "router_gemm", "--shape", "2,256,4096", "--dtype", "fp16", code=1)
    assert "x float16" in fp16.stderr


def test_explain_neither_imports_cutlass_nor_loads_a_library(bundles, tmp_path):
    folder, by_arch = bundles
    # A bundle's library is mapped from <cache dir>/libs/<sha256>.so or, where the cache dir is
    # not writable, from memfd:cute-aot-<sha256[:16]>.so: both names hold the first 16 hex digits
    # of its sha256. (Looking for "cute-aot" would also match a venv under a folder of that name.)
    digests = [read_manifest(path).library["sha256"][:16] for path in by_arch.values()]
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from cute_aot.aot.tools.aot_cache.cli import main\n"
        f"main(['explain', 'router_gemm', '--shape', '12,256,7168', '--bundle', {str(folder)!r}],"
        " standalone_mode=False)\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'cutlass' not in sys.modules, 'cutlass imported'\n"
        "assert 'tvm_ffi' not in sys.modules, 'tvm_ffi imported'\n"
        "assert 'libtvm_ffi' not in maps, 'libtvm_ffi was loaded'\n"
        f"loaded = [d for d in {digests!r} if d in maps]\n"
        "assert not loaded, f'bundle libraries mapped: {loaded}'\n"
        f"assert not Path({str(tmp_path / 'cache' / 'libs')!r}).exists(), "
        "'a library was unpacked'\n"
    )
    env = {**os.environ, "CUTE_AOT_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "bundle:" in result.stdout


@dataclasses.dataclass(frozen=True)
class ToyKey(KernelKey):
    FAMILY = "toy_scale"

    n: int
    vector: int


class ToyFamily(KernelFamily):
    """A family of another project's: one input, built for sm_90a only, no describe() on keys."""

    name = "toy_scale"
    version = 3
    Key = ToyKey
    archs = ("sm_90a",)
    abi = (TensorArg("x", "float32", 1), TensorArg("out", "float32", 1, output=True))
    builder = "toy_scale_not_importable"
    shape_syntax = "N"

    def parse_problem(self, text, dtypes=None):
        (n,) = parse_ints(self, text, "N")
        return (n, dtypes or "float32")

    def dispatch(self, problem, arch):
        n, _dtype = problem
        vector = 4 if n % 4 == 0 else 1
        return Dispatch(ToyKey(n, vector), f"N={n} {'is' if vector == 4 else 'is not'} % 4 == 0")

    def describe_problem(self, problem):
        return {"n": problem[0], "dtype": problem[1]}


@pytest.fixture
def toy_package(tmp_path):
    """ToyFamily installed next to the real ones, by the entry point of another package; its
    .dist-info folder."""
    with installed_families(tmp_path / "site", toy_scale=f"{__name__}:ToyFamily") as info:
        yield info


@pytest.fixture
def toy_family(toy_package):
    return families()["toy_scale"]


def test_explain_serves_any_installed_family_with_its_own_reason(toy_family):
    report = run_json("explain", "toy_scale", "--shape", "64", "--dtype", "fp32")
    assert report["problem"] == {"n": 64, "dtype": "float32"} and report["family_version"] == 3
    [decision] = report["decisions"]  # default: the family's own architectures
    key = ToyKey(64, 4)
    assert decision["arch"] == "sm_90a" and decision["key_id"] == key.id
    assert decision["dispatch"] == "N=64 is % 4 == 0"
    assert decision["describe"] == "n=64 vector=4"  # a key without describe(): its fields
    assert decision["source"] == "jit" and decision["why"].startswith("a miss: no usable sm_90a")
    text = run("explain", "toy_scale", "--shape", "6", "--arch", "sm_90a").stdout
    assert "toy_scale N=6 DTYPE=float32" in text and "N=6 is not % 4 == 0" in text
    aot = run_json("explain", "toy_scale", "--shape", "64", "--mode", "aot")["decisions"][0]
    assert "aot-build --shape toy_scale:N" in aot["why"]


def test_explain_says_when_a_family_is_not_built_for_the_arch(toy_family):
    report = run_json(
        "explain", "toy_scale", "--shape", "64", "--arch", "sm_90a", "--arch", "sm100a"
    )
    served, refused = report["decisions"]
    assert served["source"] == "jit"
    assert refused["arch"] == "sm_100a" and refused["source"] == "error"
    assert refused["key_id"] is None and refused["path"] is None
    assert "family toy_scale is not built for sm_100a: it supports sm_90a" in refused["why"]
    text = run("explain", "toy_scale", "--shape", "64", "--arch", "sm_100a").stdout
    assert "sm_100a: no key" in text and "it supports sm_90a" in text


def test_explain_finds_families_when_it_runs_and_refuses_unknown_ones(toy_package):
    unknown = run("explain", "no_such_family", "--shape", "1", code=2)
    assert "'no_such_family' is not an installed kernel family" in unknown.output
    assert "router_gemm" in unknown.output and "toy_scale" in unknown.output
    from cute_aot import kernels

    shutil.rmtree(toy_package)  # uninstalled as pip does, and found again in this process:
    kernels.forget_families()  # no list fixed at import time
    assert (
        "'toy_scale' is not an installed"
        in run("explain", "toy_scale", "--shape", "1", code=2).output
    )


def test_explain_reads_router_dtypes_as_before():
    problem = RouterProblem(5, 256, 4096)
    expected = family("router_gemm").dispatch(problem, "sm_90a")
    for dtype in ([], ["--dtype", "bf16"], ["--dtype", "bf16,bfloat16"]):
        report = run_json(
            "explain", "router_gemm", "--shape", "5,256,4096", "--arch", "sm_90a", *dtype
        )
        [decision] = report["decisions"]
        assert decision["dispatch"] == expected.reason and decision["key_id"] == expected.key.id
        assert report["problem"] == {
            "m": 5,
            "k": 4096,
            "n": 256,
            "x_dtype": "bfloat16",
            "w_dtype": "bfloat16",
        }
    bad = run("explain", "router_gemm", "--shape", "5,256,4096", "--dtype", "a,b,c", code=2)
    assert "is not DTYPE or X_DTYPE,W_DTYPE" in bad.output


# -- diff ----------------------------------------------------------------------------------------
def test_diff_reports_added_removed_and_changed_keys(bundles, tmp_path):
    _, by_arch = bundles
    old = by_arch["sm_90a"]
    assert run_json("diff", old, old) == {
        "a": str(old),
        "b": str(old),
        "bundle": {},
        "tables": {},
        "added": [],
        "removed": [],
        "changed": [],
        "unchanged": 2,
    }
    dot_id, split_id = dispatch(*DOT, "sm_90a").id, dispatch(*SPLITK, "sm_90a").id

    def next_release(manifest):
        kept = [e for e in manifest.entries if e.key_id != dot_id]
        return dataclasses.replace(
            with_entries(manifest, [dataclasses.replace(e, sha256="a" * 64) for e in kept]),
            bundle_version="0.2.0",
        )

    new = rewrite(old, tmp_path / "new.cuteaot", next_release)
    result = run_json("diff", old, new)
    assert [row["key_id"] for row in result["removed"]] == [dot_id]
    assert result["added"] == [] and result["unchanged"] == 0
    [changed] = result["changed"]
    assert changed["key_id"] == split_id
    assert changed["changes"]["object sha256"][1] == "a" * 64
    assert result["bundle"] == {"bundle_version": [read_manifest(old).bundle_version, "0.2.0"]}
    assert [row["key_id"] for row in run_json("diff", new, old)["added"]] == [dot_id]
    run("diff", old, new, "--exit-code", code=1)
    run("diff", old, old, "--exit-code")


# -- misses --------------------------------------------------------------------------------------
def test_misses_aggregates_the_log_for_aot_build(bundles, tmp_path, settings_scope):
    folder, _ = bundles
    log = tmp_path / "misses.jsonl"
    settings_scope(CUTE_AOT_MISS_LOG=str(log))
    missed = [(3, 128, 2880, "sm_90a")] * 3 + [(2, 128, 2880, "sm_90a"), (3, 128, 2880, "sm_100a")]
    missed += [(*SPLITK, "sm_90a")]  # a key the bundles hold (an older release missed it)
    for m, n, k, arch in missed:
        forget_recorded()  # each record as another server process writes it (once per key)
        record_miss(dispatch(m, n, k, arch), arch, {"m": m, "k": k, "n": n})
        time.sleep(0.001)
    # The three misses of one key at times out of order in the file, the first line neither the
    # earliest nor the last the latest (a record's time has 1 s resolution, so a run this short
    # would give them one time and hide a swap, or a reader keeping the first and last read).
    top_id, times = dispatch(3, 128, 2880, "sm_90a").id, iter(["00:40", "00:05", "00:20"])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        if line["key_id"] == top_id and line["arch"] == "sm_90a":
            line["time"] = f"2026-01-01T00:{next(times)}Z"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with open(log, "a") as handle:
        handle.write('{"torn line\n')  # a crashed writer's partial line is skipped
    out = tmp_path / "to-build.jsonl"
    report = run_json("misses", "--bundle", folder, "--out", out)
    assert report["records"] == 6 and len(report["keys"]) == 4
    top = report["keys"][0]
    assert top["count"] == 3 and top["arch"] == "sm_90a"
    assert top["key_id"] == dispatch(3, 128, 2880, "sm_90a").id
    assert top["problems"] == [{"k": 2880, "m": 3, "n": 128}]
    assert (top["first_seen"], top["last_seen"]) == ("2026-01-01T00:00:05Z", "2026-01-01T00:00:40Z")
    held = {(row["arch"], row["key_id"]): row["in_bundles"] for row in report["keys"]}
    assert held[("sm_90a", dispatch(*SPLITK, "sm_90a").id)] is True
    assert held[("sm_100a", dispatch(3, 128, 2880, "sm_100a").id)] is False
    plan = plan_from_misses(out, (), ())  # what aot-build --from-misses would build
    assert {arch: {key.id for key in keys} for arch, keys in plan.items()} == {
        "sm_90a": {
            dispatch(m, n, k, "sm_90a").id for m, n, k in [(3, 128, 2880), (2, 128, 2880), SPLITK]
        },
        "sm_100a": {dispatch(3, 128, 2880, "sm_100a").id},
    }
    only_missing = run_json("misses", "--bundle", folder, "--not-in-bundles", "--arch", "sm90a")
    assert [row["count"] for row in only_missing["keys"]] == [3, 1]
    text = run("misses", "--bundle", folder).stdout
    assert "M=3 N=128 K=2880" in text and f"aot-build --from-misses {log}" in text


def test_misses_without_a_log(isolated):
    report = run_json("misses")
    assert report["keys"] == [] and report["log"] == str(isolated / "misses.jsonl")
    assert "No misses recorded" in run("misses").stdout


# -- gc ------------------------------------------------------------------------------------------
def _cache_file(path: Path, age_s: float, size: int = 1000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


@pytest.fixture
def overlay_files():
    root = overlay.overlay_root()
    current = overlay.fingerprint("router_gemm")
    day = 86400
    return {
        "old": _cache_file(root / current / "sm_90a" / "old.cuteaot", 10 * day),
        "week": _cache_file(root / current / "sm_90a" / "week.cuteaot", 6 * day),
        "fresh": _cache_file(root / current / "sm_90a" / "fresh.cuteaot", 1),
        "foreign": _cache_file(root / "0123456789abcdef01234567" / "sm_90a" / "x.cuteaot", 3600),
        "debris": _cache_file(root / current / "sm_90a" / ".k.cuteaot.abc123.tmp", 2 * 3600),
        "publishing": _cache_file(root / current / "sm_90a" / ".j.cuteaot.def456.tmp", 1),
    }


def _left(files: dict) -> set[str]:
    return {name for name, path in files.items() if path.exists()}


def test_gc_without_options_removes_only_debris(overlay_files):
    report = run_json("gc")
    assert [Path(r["path"]).name for r in report["removed"]] == [".k.cuteaot.abc123.tmp"]
    assert _left(overlay_files) == {"old", "week", "fresh", "foreign", "publishing"}


def test_gc_dry_run_removes_nothing(overlay_files):
    report = run_json("gc", "--older-than", "7d", "--stale", "--dry-run")
    assert report["dry_run"]
    assert {Path(r["path"]).name for r in report["removed"]} == {
        "old.cuteaot",
        "x.cuteaot",
        ".k.cuteaot.abc123.tmp",
    }
    assert _left(overlay_files) == set(overlay_files)


def test_gc_older_than_and_stale(overlay_files):
    run("gc", "--older-than", "7d")
    assert _left(overlay_files) == {"week", "fresh", "foreign", "publishing"}
    run("gc", "--stale")
    assert _left(overlay_files) == {"week", "fresh", "publishing"}
    run("gc", "--older-than", "0")  # everything is older than 0 s, but fresh files are kept
    assert _left(overlay_files) == {"fresh", "publishing"}


def test_gc_max_size_removes_oldest_first_but_never_fresh_files(overlay_files):
    report = run_json("gc", "--max-size", "1.5K")
    # 5 entries of 1000 B (debris goes anyway): the oldest go until at most 1536 B are left
    assert [Path(r["path"]).name for r in report["removed"]][-3:] == [
        "old.cuteaot",
        "week.cuteaot",
        "x.cuteaot",
    ]
    assert _left(overlay_files) == {"fresh", "publishing"}
    run("gc", "--max-size", "0")
    assert _left(overlay_files) == {"fresh", "publishing"}  # younger than the grace period
    run("gc", "--max-size", "0", "--grace", "0")
    assert _left(overlay_files) == {"publishing"}  # a temporary is its publisher's, not ours


def test_gc_is_safe_for_readers_and_racing_collectors(overlay_files):
    with open(overlay_files["old"], "rb") as reader:
        remove, _ = overlay_gc.plan(older_than=86400)
        assert overlay_gc.remove_files(remove)
        assert reader.read() == b"x" * 1000  # an open file stays readable after the unlink
    # a second collector with the same plan finds the files gone and counts nothing twice
    assert overlay_gc.remove_files(remove) == []


def test_gc_rejects_bad_sizes_and_ages():
    assert "500M or 2G" in run("gc", "--max-size", "lots", code=2).output
    assert "7d, 12h or 30m" in run("gc", "--older-than", "forever", code=2).output
    assert parse_size("2G") == 2 << 30 and parse_size("1.5KiB") == 1536 and parse_size("10") == 10
    assert parse_age("7d") == 7 * 86400 and parse_age("30m") == 1800 and parse_age("90") == 90


# -- env -----------------------------------------------------------------------------------------
def test_env_reports_versions_paths_and_mode(isolated, settings_scope, bundles):
    folder, _ = bundles
    settings_scope(CUTE_AOT_MODE="aot", CUTE_AOT_BUNDLES=str(folder))
    report = run_json("env")
    assert report["mode"] == "aot" and report["mode_source"] == "CUTE_AOT_MODE"
    assert report["paths"]["cache_dir"] == str(isolated)
    assert report["paths"]["bundles"] == [str(p) for p in sorted(folder.glob("*.cuteaot"))]
    assert report["env"]["CUTE_AOT_BUNDLES"] == str(folder)
    assert report["versions"]["nvidia-cutlass-dsl"] == "4.8.1"
    assert report["versions"]["apache-tvm-ffi"]
    assert report["gpu"] is None  # CPU machine
    if HAS_TOOLS:
        assert Path(report["tools"]["cuobjdump"]["path"]).is_file()
        assert report["tools"]["cuobjdump"]["version"].startswith("13.")
    text = run("env").stdout
    assert "serving mode" in text and "aot (CUTE_AOT_MODE)" in text


# -- sass ----------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_tools
def test_sass_prints_the_kernels_code(real_bundles):
    _, by_arch = real_bundles
    key = dispatch(*SPLITK, "sm_100a")
    text = run("sass", by_arch["sm_100a"], key.id).stdout
    assert text.startswith(f"// {by_arch['sm_100a']} · sm_100a · key {key.id}")
    assert ".target\tsm_100a" in text and "HMMA" in text and "LDSM" in text
    report = run_json("sass", by_arch["sm_100a"], key.symbol)
    assert report["key_id"] == key.id and "HMMA" in report["sass"]
    dot = run_json("sass", by_arch["sm_100a"], dispatch(*DOT, "sm_100a").id)
    assert "HMMA" not in dot["sass"] and "SHFL" in dot["sass"]
    assert "/* 0x" in run("sass", by_arch["sm_100a"], key.id, "--hex").stdout


@pytest.mark.slow
def test_sass_refuses_what_it_cannot_find(real_bundles, tmp_path):
    _, by_arch = real_bundles
    assert "no entry 'nope'" in run("sass", by_arch["sm_90a"], "nope", code=1).stderr
    bare = rewrite(
        by_arch["sm_90a"],
        tmp_path / "bare.cuteaot",
        lambda m: with_entries(m, [dataclasses.replace(e, gpu_binary=None) for e in m.entries]),
    )
    key = dispatch(*DOT, "sm_90a")
    refused = run("sass", bare, key.id, code=1)
    assert (
        f"sm_90a key {key.id}: no fatbin sha256 recorded and the library holds 2 fatbins"
        in refused.stderr
    )


# -- the GPU binary facts recorded at build time -------------------------------------------------
@pytest.mark.slow
def test_library_fatbins_are_exactly_the_entries_fatbins(real_bundles):
    _, by_arch = real_bundles
    manifest, library = read_bundle(by_arch["sm_90a"])
    found = [hashlib.sha256(f).hexdigest() for _, f in fatbin_format.iter_fatbins(library)]
    assert sorted(found) == sorted(e.gpu_binary["fatbin_sha256"] for e in manifest.entries)


@pytest.mark.slow
def test_inspecting_without_tools_records_only_the_hash(real_bundles, monkeypatch):
    _, by_arch = real_bundles
    _, library = read_bundle(by_arch["sm_100a"])
    [(_, fatbin), *_] = fatbin_format.iter_fatbins(library)
    monkeypatch.setattr(binary_info, "find_tool", lambda name: None)
    assert binary_info.inspect_fatbin(fatbin) == {
        "fatbin_sha256": hashlib.sha256(fatbin).hexdigest(),
        "fatbin_size": len(fatbin),
        "sm": [100],
    }
    with pytest.raises(ToolNotFoundError, match="pip install nvidia-cuda-cuobjdump"):
        binary_info.disassemble(fatbin)


def test_parsers_and_instruction_classes():
    usage = binary_info.parse_resource_usage(
        " Function kernel_a:\n  REG:154 STACK:16 SHARED:2048 LOCAL:0 CONSTANT[0]:900 TEXTURE:0\n"
    )
    assert usage == {
        "kernel_a": {"registers": 154, "stack": 16, "shared": 2048, "local": 0, "constant0": 900}
    }
    sass = (
        ".text.kernel_a:\n"
        "        /*0000*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;\n"
        "        /*0010*/              @!P0 UTMALDG.2D [UR8], [UR12] ;\n"
        "        /*0020*/              @UPT UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR8] ;\n"
        "        /*0030*/                   UTCBAR [UR4] ;\n"
        "        /*0040*/                   FFMA R1, R2, R3, R4 ;\n"
    )
    opcodes = binary_info.parse_sass_opcodes(sass)
    assert opcodes == {"kernel_a": {"HGMMA": 1, "UTMALDG": 1, "UTCHMMA": 1, "UTCBAR": 1, "FFMA": 1}}
    assert binary_info.classify_opcodes(opcodes["kernel_a"]) == {
        "UTC*MMA": 1,
        "UTC*": 1,
        "HGMMA": 1,
        "UTMA*": 1,
        "FFMA": 1,
        "total": 5,
    }
    assert fatbin_format.fatbin_length(b"\x50\xed\x55\xba" + b"\0" * 12) is None  # wrong version
    with pytest.raises(BinaryInspectionError, match="not an ELF file"):
        fatbin_format.object_fatbin(b"definitely not ELF", "x.o")


def _synthetic_fatbin(sm: int) -> bytes:
    """A fatbin container holding one (empty) cubin entry for SM `sm`."""
    entry = struct.pack("<HHIQ", 2, 1, 64, 32).ljust(28, b"\0") + struct.pack("<I", sm)
    body = entry.ljust(64, b"\0") + b"\xcc" * 32
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


@pytest.fixture(scope="module")
def kernel_object(tmp_path_factory) -> tuple[bytes, bytes]:
    """(object file, fatbin): a relocatable object holding a fatbin as a CuTe DSL export does,
    in a local symbol named kernels_binary, next to other data and code."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    fatbin = _synthetic_fatbin(90)
    folder = tmp_path_factory.mktemp("object")
    source = folder / "kernel.c"
    source.write_text(
        "static const unsigned char kernels_binary[] __attribute__((used, aligned(8))) = {"
        + ",".join(map(str, fatbin))
        + '};\nconst char other_data[] = "not the fatbin";\nint entry(void) { return 7; }\n'
    )
    subprocess.run([compiler, "-c", "-O1", "-o", str(folder / "kernel.o"), str(source)], check=True)
    return (folder / "kernel.o").read_bytes(), fatbin


def test_the_one_elf_reader_finds_an_objects_fatbin(kernel_object):
    data, fatbin = kernel_object
    assert fatbin_format.object_fatbin(data, "kernel.o") == fatbin
    assert fatbin_format.fatbin_sm_numbers(fatbin) == [90]
    elf = read_sections(data)
    names = {symbol.name for symbol in elf.symbols()}
    assert {"kernels_binary", "other_data", "entry"} <= names
    assert elf.section(".text") is not None and elf.section(".symtab") is not None
    with pytest.raises(ElfError, match="not a shared library"):
        read_dynamic(data)  # an object is not what the loader reads: same reader, other view
    no_fatbin = data.replace(b"kernels_binary", b"kernels_binarz")
    with pytest.raises(BinaryInspectionError, match="kernel.o: no fatbin symbol"):
        fatbin_format.object_fatbin(no_fatbin, "kernel.o")


def test_the_elf_and_fatbin_readers_refuse_damaged_objects_cleanly(kernel_object):
    """Random damage, most of it where the structure is (headers, section table, symbols): each
    read ends in a result or a typed error, never IndexError, struct.error or a hang."""
    data, fatbin = kernel_object
    header = read_sections(data)
    structure = [(0, 64)] + [
        (section.offset, section.size)
        for section in header.sections
        if section.name in (".symtab", ".strtab", ".shstrtab")
    ]
    shoff = struct.unpack_from("<Q", data, 40)[0]
    structure.append((shoff, len(data) - shoff))
    rng = random.Random(20260101)
    outcomes: Counter = Counter()
    for _ in range(3000):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            start, size = rng.choice(structure)
            position = start + rng.randrange(max(size, 1))
            if position < len(damaged):
                damaged[position] = rng.randrange(256)
        if rng.random() < 0.1:
            del damaged[rng.randrange(len(damaged)) :]
        try:
            found = fatbin_format.object_fatbin(bytes(damaged), "kernel.o")
        except BinaryInspectionError:
            outcomes["refused"] += 1
        else:
            outcomes["found"] += 1
            assert fatbin_format.fatbin_length(found) == len(found)
            fatbin_format.fatbin_sm_numbers(found)
    assert outcomes["refused"] > 100 and outcomes["found"] > 100, outcomes


def test_manifests_without_gpu_facts_stay_as_before(bundles):
    _, by_arch = bundles
    manifest = read_manifest(by_arch["sm_90a"])
    bare = with_entries(
        manifest, [dataclasses.replace(e, gpu_binary=None) for e in manifest.entries]
    )
    raw = json.loads(bare.to_json())
    assert all("gpu_binary" not in entry for entry in raw["entries"])
    assert parse_manifest(bare.to_json()) == bare
    if HAS_TOOLS:
        assert parse_manifest(manifest.to_json()) == manifest


# -- faults found by injection (issue: one place for each decision) -------------------------------
def test_ls_of_a_file_that_is_not_a_bundle_says_why_on_stderr_in_one_line(tmp_path):
    bad = tmp_path / "x.cuteaot"
    bad.write_text("not a bundle")
    result = CliRunner().invoke(main, ["ls", str(bad), "--no-overlay"])
    assert result.exit_code == 1
    assert result.stderr == f"aot-cache: {bad}: truncated: shorter than a bundle header\n"


def test_a_fifo_named_like_a_bundle_in_a_folder_is_skipped_with_a_warning(tmp_path):
    from cute_aot.artifacts.core import notices

    notices.forget()
    os.mkfifo(tmp_path / "pipe.cuteaot")
    with pytest.warns(RuntimeWarning, match=r"skipping .*pipe\.cuteaot: not a regular file"):
        result = CliRunner().invoke(main, ["ls", str(tmp_path), "--no-overlay"])
    assert "pipe.cuteaot" not in result.stdout  # never opened: its reader would block
