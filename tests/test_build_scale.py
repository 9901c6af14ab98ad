"""Builds at release scale: parallel with failure isolation, cached, sharded, reproducible,
model-driven.

Most tests use a stand-in compile worker that turns a key into a tiny C object exporting the
key's TVM-FFI symbol (gcc, milliseconds), so the real pool, cache, shard, merge, link and pack
code runs without cutlass. The `slow` test at the end does the same through `aot-build` with
real cross-compiled kernels.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from cute_aot.aot import build as build_module
from cute_aot.aot import compile_pool
from cute_aot.aot.build import keys_by_arch, merge, run_build
from cute_aot.aot.build_cache import BuildCache, default_cache_root
from cute_aot.aot.cli import main
from cute_aot.aot.models import PRESETS, family_shapes, model_from_config, shapes_for_models
from cute_aot.aot.report import report_path
from cute_aot.aot.reproducible import check_reproducible
from cute_aot.aot.shard import Shard
from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.core.errors import (
    BuildError,
    ModelConfigError,
    NotReproducibleError,
    ShardError,
)
from cute_aot.kernels import family
from cute_aot.kernels.router_gemm import RouterGemmKey, dispatch

FAIL_M, CRASH_M = 13, 14  # stand-in keys with these token counts raise / kill their worker
# The stand-in worker's own variable, no setting: spawned workers read it from the environment.
COMPILE_LOG_ENV = "CUTE_AOT_TEST_COMPILE_LOG"


def fake_compile(family_name: str, key_fields: dict, arch: str, out_dir: str) -> dict:
    """Stand-in for compile_to_object (same arguments, same row): a real, linkable object."""
    key = RouterGemmKey.from_fields(key_fields)
    if os.environ.get(COMPILE_LOG_ENV):
        with open(os.environ[COMPILE_LOG_ENV], "a") as log:
            log.write(f"{arch} {key.symbol}\n")
    row = {"family": family_name, "key_id": key.id, "symbol": key.symbol, "arch": arch}
    if key.m == CRASH_M:
        os._exit(3)  # like a compiler segfault or the OOM killer
    if key.m == FAIL_M:
        return {**row, "status": "failed", "error": "ValueError: no tactic fits", "seconds": 0.0}
    value = int(hashlib.sha256(f"{arch}{key.id}".encode()).hexdigest()[:6], 16)
    source = Path(out_dir) / f"{key.symbol}.c"
    source.write_text(
        f"int __tvm_ffi_{key.symbol}(void *s, const void *a, int n, void *r) {{ return {value}; }}"
    )
    subprocess.run(
        ["gcc", "-c", "-O2", "-fPIC", source.name, "-o", f"{key.symbol}.o"],
        cwd=out_dir,
        check=True,
    )
    source.unlink()
    data = (Path(out_dir) / f"{key.symbol}.o").read_bytes()
    return {
        **row,
        "status": "ok",
        "object": str(Path(out_dir) / f"{key.symbol}.o"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "seconds": 0.01,
    }


def dot_key(m: int, k: int) -> RouterGemmKey:
    return RouterGemmKey("dot", m, k, 128, 0, 0, True)


PLAN = {
    "sm_90a": [dot_key(m, k) for m in (1, 2) for k in (64, 128, 256)],
    "sm_100a": [dot_key(m, 64) for m in (1, 2, 3, 4)],
}


@pytest.fixture
def compile_log(tmp_path, monkeypatch):
    """Lines `arch symbol` for every stand-in compile, in this process and in spawned workers."""
    path = tmp_path / "compiles.log"
    path.touch()
    monkeypatch.setenv(COMPILE_LOG_ENV, str(path))
    return lambda: path.read_text().splitlines()


def fake_build(out, **options):
    options.setdefault("show_progress", False)
    options.setdefault("jobs", 1)
    return run_build(PLAN, out, name="scale", worker=fake_compile, **options)


def bundle_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.cuteaot"))}


# -- sharding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 7, 20])
def test_shards_partition_the_plan_evenly_and_deterministically(count):
    items = list(range(17))
    slices = [Shard(i, count).select(items) for i in range(count)]
    assert sorted(x for s in slices for x in s) == items  # every item exactly once
    assert max(map(len, slices)) - min(map(len, slices)) <= 1
    assert slices == [Shard(i, count).select(list(items)) for i in range(count)]


def test_plan_order_is_canonical_whatever_order_the_job_gives():
    # Shard jobs must agree on the plan even if one says --arch sm100a,sm_90a and repeats keys.
    forward = keys_by_arch({"sm_90a": PLAN["sm_90a"], "sm_100a": PLAN["sm_100a"]})
    backward = keys_by_arch(
        {"SM100A": PLAN["sm_100a"][::-1], "sm90a": PLAN["sm_90a"][::-1] + PLAN["sm_90a"][:2]}
    )
    assert forward == backward
    assert list(forward) == ["sm_90a", "sm_100a"]
    assert [k.symbol for k in forward["sm_90a"]] == sorted(k.symbol for k in PLAN["sm_90a"])


@pytest.mark.parametrize("text", ["2/2", "-1/2", "0/0", "1", "a/b", "1/2/3"])
def test_bad_shard_specs_are_refused(text):
    with pytest.raises(ValueError):
        Shard.parse(text)
    result = CliRunner().invoke(main, ["--shard", text, "--quiet", "--no-cache"])
    assert result.exit_code == 2


def test_shard_spec_accepts_ci_spellings():
    assert Shard.parse(" 3 / 8 ") == Shard(3, 8)
    assert str(Shard.parse("0/1")) == "0/1"


# -- worker count --------------------------------------------------------------------------------


def test_default_jobs_is_cores_bounded_by_memory():
    assert compile_pool.jobs_for(8, None) == 8
    assert compile_pool.jobs_for(8, 1000 << 20) == 3  # 1000 MB / ~300 MB per worker
    assert compile_pool.jobs_for(8, 10 << 20) == 1
    assert compile_pool.jobs_for(2, 1000 << 30) == 2
    # this machine's: at most its cores (its available memory moves between two reads)
    assert 1 <= compile_pool.default_jobs() <= compile_pool.usable_cores()


def test_available_memory_reads_this_machine():
    """Linux has /proc/meminfo: None here would mean the parsing broke."""
    memory = compile_pool.available_memory()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert isinstance(memory, int) and 0 < memory <= physical


# -- parallel compile, failures ------------------------------------------------------------------


def test_failing_and_crashing_keys_are_reported_and_the_rest_builds(tmp_path, compile_log):
    plan = {
        "sm_90a": [dot_key(m, 64) for m in (1, 2, 3, FAIL_M, CRASH_M)],
        "sm_100a": [dot_key(m, 64) for m in (1, 2)],
    }
    out = tmp_path / "out"
    outcome = run_build(plan, out, name="f", jobs=2, show_progress=False, worker=fake_compile)
    status = {(r["arch"], r["key_id"]): (r["status"], r.get("error", "")) for r in outcome.rows}
    assert len(status) == 7
    assert status[("sm_90a", dot_key(FAIL_M, 64).id)] == ("failed", "ValueError: no tactic fits")
    crashed = status[("sm_90a", dot_key(CRASH_M, 64).id)]
    assert crashed == ("failed", compile_pool.WORKER_DIED)
    assert sum(s == "ok" for s, _ in status.values()) == 5
    # The failed architecture gets no bundle, the other one does; nothing half-written.
    assert outcome.incomplete == {"sm_90a": 2}
    assert sorted(p.name for p in out.iterdir()) == ["f-sm_100a.cuteaot"]

    # Allowed failures (in this process: no crashing key here): the bundle holds the rest.
    plan = {"sm_90a": [dot_key(m, 64) for m in (1, 2, FAIL_M)]}
    allowed = run_build(
        plan,
        tmp_path / "allowed",
        name="f",
        jobs=1,
        show_progress=False,
        worker=fake_compile,
        allow_failures=True,
    )
    (manifest,) = [read_bundle(p)[0] for p in allowed.bundles]
    assert {e.key_id for e in manifest.entries} == {dot_key(m, 64).id for m in (1, 2)}
    assert allowed.incomplete == {"sm_90a": 1}


def test_build_raises_build_error_naming_key_and_arch(tmp_path):
    with pytest.raises(BuildError, match=f"router_gemm key {dot_key(FAIL_M, 64).id} on sm_90a"):
        build_module.build(
            {"sm_90a": [dot_key(FAIL_M, 64)]},
            tmp_path,
            jobs=1,
            show_progress=False,
            worker=fake_compile,
        )


def test_unexpected_worker_exception_becomes_a_failed_row(tmp_path):
    def broken_worker(*args):
        raise RuntimeError("worker bug")

    outcome = run_build(
        {"sm_90a": [dot_key(1, 64)]}, tmp_path, jobs=1, show_progress=False, worker=broken_worker
    )
    (row,) = outcome.rows
    assert row["status"] == "failed" and "RuntimeError: worker bug" in row["error"]
    assert row["key_id"] == dot_key(1, 64).id and row["arch"] == "sm_90a"


# -- cache, shards, merge, reproducibility -------------------------------------------------------


def test_cached_rebuild_shards_and_clean_builds_are_byte_identical(
    tmp_path, compile_log, monkeypatch
):
    cache = BuildCache(tmp_path / "cache")
    plain = fake_build(tmp_path / "plain", cache=cache, jobs=2)
    total = sum(map(len, PLAN.values()))
    assert len(compile_log()) == total and cache.misses == total
    expected = bundle_bytes(tmp_path / "plain")
    assert sorted(expected) == ["scale-sm_100a.cuteaot", "scale-sm_90a.cuteaot"]
    mtimes = {p: p.stat().st_mtime_ns for p in plain.bundles}

    # A rebuild that changes nothing compiles nothing, links nothing, rewrites nothing.
    monkeypatch.setattr(build_module, "pack_bundle", _must_not_link)
    again = fake_build(tmp_path / "plain", cache=BuildCache(tmp_path / "cache"))
    assert len(compile_log()) == total
    assert all(row.get("cached") for row in again.rows)
    assert {p: p.stat().st_mtime_ns for p in again.bundles} == mtimes
    monkeypatch.undo()
    monkeypatch.setenv(COMPILE_LOG_ENV, str(tmp_path / "compiles.log"))

    # Three shards (no cache, separate folders), merged: the same bytes.
    for index in range(3):
        shard = fake_build(tmp_path / f"ci-job-{index}", shard=Shard(index, 3))
        assert shard.bundles == [] and (shard.shard_folder / "shard.json").exists()
    assert len(compile_log()) == 2 * total
    merged = merge([tmp_path / f"ci-job-{i}" for i in range(3)], tmp_path / "merged")
    assert not merged.failed
    assert bundle_bytes(tmp_path / "merged") == expected

    # A clean build elsewhere (no cache) is byte-identical, and check_reproducible agrees.
    fake_build(tmp_path / "clean")
    assert bundle_bytes(tmp_path / "clean") == expected
    check_reproducible(plain.bundles, lambda folder: fake_build(folder))
    for data in expected.values():
        assert str(tmp_path).encode() not in data  # no absolute paths in a bundle


def test_a_shard_built_again_replaces_its_folder_whole_and_leaves_nothing_aside(
    tmp_path, compile_log
):
    """The previous shard folder is renamed aside until the new one is in place, then removed:
    the job folder holds the one shard folder, rebuilt."""
    first = fake_build(tmp_path / "job", shard=Shard(0, 2))
    written = (first.shard_folder / "shard.json").read_bytes()
    (first.shard_folder / "stale-extra").write_text("from the first build")
    again = fake_build(tmp_path / "job", shard=Shard(0, 2))
    assert again.shard_folder == first.shard_folder
    assert (again.shard_folder / "shard.json").read_bytes() == written
    assert not (again.shard_folder / "stale-extra").exists()  # replaced whole, not merged into
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == [again.shard_folder.name]


def _must_not_link(*args, **kwargs):
    raise AssertionError("a no-change rebuild must not link")


def test_check_reproducible_names_the_kernels_that_differ(tmp_path):
    plan = {"sm_90a": [dot_key(1, 64), dot_key(2, 64)]}
    outcome = run_build(plan, tmp_path / "a", jobs=1, show_progress=False, worker=fake_compile)
    other = dot_key(2, 64)

    def drifting_compile(family_name, key_fields, arch, out_dir):
        row = fake_compile(family_name, key_fields, arch, out_dir)
        if key_fields == other.fields():  # this key's object comes out different
            with open(row["object"], "ab") as handle:
                handle.write(b"\0" * 8)
            data = Path(row["object"]).read_bytes()
            row.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        return row

    def rebuild(folder):
        run_build(plan, folder, jobs=1, show_progress=False, worker=drifting_compile)

    with pytest.raises(NotReproducibleError, match=f"1 kernel objects .* {other.symbol}"):
        check_reproducible(outcome.bundles, rebuild)


def test_corrupt_cache_entry_is_a_miss_and_is_healed(tmp_path, compile_log):
    plan = {"sm_90a": [dot_key(1, 64)]}
    cache = BuildCache(tmp_path / "cache")
    run_build(plan, tmp_path / "a", cache=cache, jobs=1, show_progress=False, worker=fake_compile)
    (obj,) = (tmp_path / "cache" / "objects").rglob("*.o")
    obj.chmod(0o644)
    obj.write_bytes(b"garbage")
    cache = BuildCache(tmp_path / "cache")
    outcome = run_build(
        plan, tmp_path / "b", cache=cache, jobs=1, show_progress=False, worker=fake_compile
    )
    assert cache.misses == 1 and len(compile_log()) == 2
    assert bundle_bytes(tmp_path / "a") == bundle_bytes(tmp_path / "b")
    assert not outcome.rows[0].get("cached")
    third = BuildCache(tmp_path / "cache")
    run_build(plan, tmp_path / "c", cache=third, jobs=1, show_progress=False, worker=fake_compile)
    assert third.hits == 1 and len(compile_log()) == 2


def test_a_record_never_describes_other_data_under_two_writers(tmp_path, monkeypatch):
    """Writer A publishes its data; before A's record, writer B (other bytes, same digest) runs
    whole. Whoever's record lands, it must describe the data that is there."""
    from cute_aot.aot import build_cache as module

    cache = BuildCache(tmp_path)
    digest = "ab" * 32
    real_publish = module.publish_once
    interleaved = []

    def publish_then_let_b_run(path, data, *args):
        won = real_publish(path, data, *args)
        if path.suffix == ".o" and not interleaved:  # A's data is in place: B runs now
            interleaved.append(True)
            cache._put("objects", digest, b"writer B's bytes", {"writer": "B"})
        return won

    monkeypatch.setattr(module, "publish_once", publish_then_let_b_run)
    cache._put("objects", digest, b"writer A's bytes", {"writer": "A"})
    data, record = cache._get("objects", digest)
    assert interleaved == [True]
    assert data == b"writer A's bytes" and record["writer"] == "A"
    assert record["sha256"] == hashlib.sha256(data).hexdigest()


def test_unwritable_cache_never_fails_the_build(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    cache = BuildCache(blocker / "cache")
    outcome = fake_build(tmp_path / "out", cache=cache)
    assert not outcome.failed and len(outcome.bundles) == 2
    assert cache.write_error and "not-a-folder" in cache.write_error


def test_cache_digest_changes_with_what_changes_the_object(tmp_path):
    cache = BuildCache(tmp_path)
    key = dot_key(1, 64)
    base = cache.object_digest(key, "sm_90a")
    assert base == BuildCache(tmp_path / "other").object_digest(key, "sm_90a")
    assert base != cache.object_digest(key, "sm_100a")
    assert base != cache.object_digest(dot_key(1, 72), "sm_90a")
    cache.toolchain = {**cache.toolchain, "cutlass_dsl": {"nvidia-cutlass-dsl": "9.9.9"}}
    assert base != cache.object_digest(key, "sm_90a")

    row = {
        "family": "router_gemm",
        "key_id": key.id,
        "symbol": key.symbol,
        "arch": "sm_90a",
        "sha256": "0" * 64,
        "size": 10,
        "seconds": 1.0,
        "object": "/tmp/x.o",
    }
    bundle = cache.bundle_digest("n", "sm_90a", "1.0", [row], {})
    assert bundle == cache.bundle_digest("n", "sm_90a", "1.0", [{**row, "seconds": 9.0}], {})
    assert bundle != cache.bundle_digest("n", "sm_90a", "1.0", [{**row, "sha256": "1" * 64}], {})
    assert bundle != cache.bundle_digest("n", "sm_90a", "1.1", [row], {})
    assert bundle != cache.bundle_digest("m", "sm_90a", "1.0", [row], {})
    # The manifest records the dispatch tables: another table is another bundle.
    assert bundle != cache.bundle_digest("n", "sm_90a", "1.0", [row], {"f": {"digest": "1"}})


def test_default_cache_root_follows_the_runtime_cache_dir(monkeypatch, settings_scope, tmp_path):
    from cute_aot.artifacts.core.settings import cache_dir

    settings_scope(CUTE_AOT_CACHE_DIR=None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # another program's variable
    assert default_cache_root() == cache_dir() / "build"
    settings_scope(CUTE_AOT_CACHE_DIR=str(tmp_path / "mine"))
    assert default_cache_root() == cache_dir() / "build" == tmp_path / "mine" / "build"


def test_merge_refuses_incomplete_or_tampered_shards(tmp_path):
    for index in range(2):
        fake_build(tmp_path / "shards", shard=Shard(index, 2))
    shard_dirs = sorted((tmp_path / "shards").glob("*.shard-*-of-2"))
    with pytest.raises(ShardError, match=r"missing shard outputs: 1/2"):
        merge([shard_dirs[0]], tmp_path / "out")
    with pytest.raises(ShardError, match="given twice"):
        copy = tmp_path / "copy"
        subprocess.run(["cp", "-r", str(shard_dirs[0]), str(copy)], check=True)
        merge([tmp_path / "shards", copy], tmp_path / "out")
    obj = next((shard_dirs[1] / "objects").rglob("*.o"))
    obj.write_bytes(obj.read_bytes() + b"\0")
    with pytest.raises(ShardError, match="does not match its recorded sha256"):
        merge([tmp_path / "shards"], tmp_path / "out")
    other = run_build(
        {"sm_90a": [dot_key(1, 64)]},
        tmp_path / "other",
        name="scale",
        shard=Shard(1, 2),
        jobs=1,
        show_progress=False,
        worker=fake_compile,
    )
    with pytest.raises(ShardError, match="differ in plan_sha256"):
        merge([shard_dirs[0], other.shard_folder], tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- models --------------------------------------------------------------------------------------


def test_presets_cover_the_reference_models_and_the_default_shapes():
    router = family("router_gemm")
    shapes = {name: family_shapes(model, router) for name, model in PRESETS.items()}
    assert shapes == {
        "deepseek-v3": [(256, 7168)],
        "deepseek-v3.2": [(256, 7168)],
        "deepseek-v4-pro": [(384, 7168)],
        "deepseek-v4-flash": [(256, 4096)],
        "glm-5.2": [(256, 6144)],
        "inkling": [(264, 6144)],
        "gpt-oss-120b": [(128, 2880)],
        "gpt-oss-20b": [(32, 2880)],
        "kimi-k2": [(384, 7168)],
        "qwen3-235b-a22b": [(128, 4096)],
        "qwen3-30b-a3b": [(128, 2048)],
        "llama-3-8b": [],  # dense models: no router
        "llama-3-70b": [],
        "qwen3-32b": [],
        "qwen3-next-80b-a3b": [],  # its linear-attention layers: flashinfer_gdn_decode's
    }
    # The default shapes are the shapes of the models the default bundles serve.
    assert set(router.default_shapes) < {shape for found in shapes.values() for shape in found}
    assert all(model.source == "preset" for model in PRESETS.values())
    gemm = family("gemm_sm90")
    dense = {
        shape
        for name in ("llama-3-8b", "llama-3-70b", "qwen3-32b", "deepseek-v3")
        for shape in family_shapes(PRESETS[name], gemm)
    }
    assert dense == set(gemm.default_shapes)
    assert family_shapes(PRESETS["deepseek-v3"], gemm) == [
        (1536, 7168),
        (24576, 1536),
        (576, 7168),
        (32768, 512),
        (7168, 16384),  # MLA
        (36864, 7168),
        (7168, 18432),  # dense MLP (layers 0-2)
        (4096, 7168),
        (7168, 2048),  # shared expert
    ]


@pytest.mark.parametrize(
    "config, shape",
    [
        ({"hidden_size": 7168, "n_routed_experts": 256, "num_experts_per_tok": 8}, (256, 7168)),
        ({"hidden_size": 4096, "num_local_experts": 8}, (8, 4096)),
        ({"hidden_size": 2048, "num_experts": 128, "n_routed_experts": None}, (128, 2048)),
        ({"text_config": {"hidden_size": 5120, "num_local_experts": 16}}, (16, 5120)),
        (
            {"hidden_size": 1, "llm_config": {"hidden_size": 3072, "moe_num_experts": 64}},
            (64, 3072),
        ),
        ({"num_experts": 32, "language_config": {"hidden_size": 1536}}, (32, 1536)),
    ],
)
def test_hf_config_gives_the_router_shape(tmp_path, config, shape):
    folder = tmp_path / "Some-MoE"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    model = model_from_config(folder)  # a folder or the file itself
    assert model.name == "Some-MoE"
    assert model.source == str(folder / "config.json")
    router = family("router_gemm")
    assert shapes_for_models([model], [router]) == {"router_gemm": [shape]}


def test_dense_config_gives_no_router_shape(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "num_experts": 0, "model_type": "llama"}))
    model = model_from_config(config)
    assert family_shapes(model, family("router_gemm")) == []
    with pytest.raises(ModelConfigError, match="gives no shapes to the families asked"):
        shapes_for_models([model], [family("router_gemm")])
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["--model-config", str(config), "--families", "router_gemm", "--out", str(out)]
    )
    assert result.exit_code == 1
    assert f"{config}: model " in result.output
    assert "gives no shapes to the families asked (router_gemm)" in result.output
    assert not out.exists()


def test_config_with_a_shape_no_kernel_serves_is_refused_by_name(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"_name_or_path": "odd/model", "hidden_size": 2883, "num_experts": 8})
    )
    with pytest.raises(ModelConfigError, match=f"{config}: model odd/model: .*K % 8"):
        shapes_for_models([model_from_config(config)], [family("router_gemm")])


def test_model_plan_replaces_the_default_shapes(tmp_path):
    args = ["--model", "gpt-oss-120b,deepseek-v4-flash", "--arch", "sm_90a,sm_103a", "--no-cache"]
    result = CliRunner().invoke(main, [*args, "--dry-run", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    seen = json.loads(result.stdout)["plan"]
    assert list(seen) == ["sm_90a", "sm_103a"]
    for arch, keys in seen.items():
        want = {
            dispatch(m, n, k, arch) for n, k in [(128, 2880), (256, 4096)] for m in range(1, 17)
        }
        assert {RouterGemmKey.from_fields(key["key"]) for key in keys} == want
    assert list(tmp_path.iterdir()) == []  # a dry run builds nothing


# -- CLI -----------------------------------------------------------------------------------------


def test_build_options_do_not_go_with_a_subcommand(tmp_path):
    result = CliRunner().invoke(main, ["--arch", "sm_90a", "merge", str(tmp_path)])
    assert result.exit_code == 2 and "--arch" in result.output


def test_merge_without_shards_fails_cleanly(tmp_path):
    result = CliRunner().invoke(main, ["merge", str(tmp_path), "--out", str(tmp_path / "b")])
    assert result.exit_code == 1 and "no shard outputs" in result.output


def test_cli_reports_a_failed_key_and_exits_non_zero_unless_allowed(tmp_path):
    bogus = RouterGemmKey("bogus", 1, 64, 128, 0, 0, True)  # fails before importing cutlass
    log = tmp_path / "misses.jsonl"
    log.write_text(json.dumps({"family": "router_gemm", "key": bogus.fields(), "arch": "sm_90a"}))
    out = tmp_path / "out"
    args = ["--from-misses", str(log), "--out", str(out), "-j", "1", "--no-cache", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert bogus.id in result.output and "sm_90a" in result.output
    assert "unknown backend 'bogus'" in result.output
    (row,) = json.loads(report_path(out, "default").read_text())["keys"]
    assert row["status"] == "failed" and row["key_id"] == bogus.id
    assert "unknown backend" in row["error"] and "Traceback" in row["traceback"]
    assert not list(out.glob("*.cuteaot"))
    allowed = CliRunner().invoke(main, [*args, "--allow-failures"])
    assert allowed.exit_code == 0, allowed.output


# -- real kernels --------------------------------------------------------------------------------


@pytest.mark.slow
def test_aot_build_shards_merge_cache_and_reproducibility_with_real_kernels(
    tmp_path, settings_scope
):
    """The issue's acceptance checks in miniature: 3 small real keys on two architectures."""
    settings_scope(CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"))  # the build cache: aot-build's own
    keys = [
        ("sm_90a", dispatch(1, 8, 256, "sm_90a")),
        ("sm_90a", dispatch(2, 8, 512, "sm_90a")),
        ("sm_100a", dispatch(1, 8, 256, "sm_100a")),
    ]
    log = tmp_path / "misses.jsonl"
    log.write_text(
        "\n".join(json.dumps({"family": k.FAMILY, "key": k.fields(), "arch": a}) for a, k in keys)
    )

    def aot_build(*args):
        result = CliRunner().invoke(main, ["--from-misses", str(log), "--quiet", *args])
        assert result.exit_code == 0, result.output
        return result.output

    # Plain build (fills the cache), proven reproducible by a clean second build. In this
    # process (-j 1): workers would import cutlass again (the e2e fixture covers the pool).
    output = aot_build("--out", str(tmp_path / "plain"), "-j", "1", "--check-reproducible")
    assert "2 byte-identical bundles" in output
    expected = bundle_bytes(tmp_path / "plain")
    report = json.loads(report_path(tmp_path / "plain", "default").read_text())
    assert report["summary"] == {"keys": 3, "compiled": 3, "cached": 0, "failed": 0}
    assert all(row["size"] > 0 and row["seconds"] > 0 for row in report["keys"])

    # Shards in separate CI jobs, merged: the same bytes.
    for index in range(2):
        aot_build("--shard", f"{index}/2", "--out", str(tmp_path / f"job{index}"), "-j", "1")
    result = CliRunner().invoke(
        main,
        [
            "merge",
            str(tmp_path / "job0"),
            str(tmp_path / "job1"),
            "--out",
            str(tmp_path / "merged"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert bundle_bytes(tmp_path / "merged") == expected

    # A rebuild that changes nothing: everything from the cache, same bytes.
    aot_build("--out", str(tmp_path / "plain"))
    report = json.loads(report_path(tmp_path / "plain", "default").read_text())
    assert report["summary"]["cached"] == 3 and report["summary"]["compiled"] == 0
    assert bundle_bytes(tmp_path / "plain") == expected
