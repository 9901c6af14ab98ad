"""Nothing persisted changes: what commit 9d40a62 wrote loads, and is trusted, with this code.

The artifacts in tests/data/previous_commit/ were made by 9d40a62's own code (README.txt there
says how): a signed router_gemm bundle for sm_90a with its build report, the build cache that
build filled, an overlay entry published as that commit's JIT publishes one, a miss log, a
record of a user kernel's `cute.compile` call and the signed bundle built from that record.
Every id they are checked against is pinned here as that commit wrote it, never derived again by
the code under test alone.

Their digests also cover this machine's toolchain, C compiler and CUDA tools
(environment.json); where those differ, the artifacts cannot be current and the tests say so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.miss_log import read_misses
from cute_aot.kernels import family, source_hash
from cute_aot.kernels.recorded import RecordedCallKey, read_records
from cute_aot.kernels.router_gemm import dispatch, enumerate_keys
from cute_aot.runtime import REGISTRY, overlay, set_mode
from cute_aot.runtime.registry import Registry, stale_reasons
from tests.cli_process import aot_build

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "previous_commit"
ARCH = "sm_90a"
BUNDLE = DATA / "bundles" / "previous-sm_90a.cuteaot"
REPORT = DATA / "bundles" / "previous.build-report.json"
MISS_LOG = DATA / "misses" / "misses.jsonl"
RECORD = DATA / "record" / "scale.record.jsonl"
RECORDED_BUNDLE = DATA / "bundles" / "recorded-sm_90a.cuteaot"  # built from RECORD
RELEASE_PUBLIC_KEY = DATA / "release.pub.pem"
ENVIRONMENT = json.loads((DATA / "environment.json").read_text())

# As 9d40a62 wrote them.
SHAPE = (256, 7168)  # router_gemm (N, K) the bundle was built for: M = 1..16
BUNDLE_KEY_IDS = [
    "4c26d8c57e6ffc6f118f",
    "52196d503cd6c843426c",
    "5ff242f3c44aa045d2fe",
    "634df28b70b706c8dbc2",
    "83140ee06683c50a5cf8",
    "987fe8239cfe3da93728",
    "d6227fe0c80c32d70675",
    "efe814ee677700167713",
]
ROUTER_SOURCE_HASH = "2459c7f79f0c7814d77735cace321ebd00d2302ddc7df1999fb40f67508d0dd5"
RELEASE_SIGNER = "17e036989eea40948f77de48f33f8e13"
OVERLAY_SIGNER = "cd0569230962c6ae93cda989b9f7eea5"
OVERLAY_FINGERPRINT = "39f946d6ccb4801e08c2c190"
OVERLAY_KEY_ID = "b72532c161218bd5afe0"  # problem M=1, N=256, K=4096
OVERLAY_ENTRY = f"overlay/{OVERLAY_FINGERPRINT}/{ARCH}/{OVERLAY_KEY_ID}.cuteaot"
MISSED = [  # (key id, problem (M, N, K)), in log order
    (OVERLAY_KEY_ID, (1, 256, 4096)),
    ("52196d503cd6c843426c", (12, 256, 7168)),
]
RECORD_KEY_ID = "f302bcaef1c3afa7b175"  # tests.user_kernels.scale:scale, n=1000, block=128
RECORDED_SOURCE_HASH = "9c2b6e1210a70c8db211561e74eeb8f6dc0e67801f374480d2aa8d9bd4d5b53f"
# A family's source hash covers its builder's modules and what they import from the package
# (kernels.binary_modules); cute_compile's is its explicit builder_version instead, and the
# import-walk hash that commit recorded is among its earlier_source_hashes.
_MOVED = (
    "{family}'s source hash moved: every {family} bundle users built is stale now. If that is "
    "on purpose, re-baseline tests/data/previous_commit (README.txt there says how and why)"
)
BUILD_CACHE_FILES = 2 * len(BUNDLE_KEY_IDS) + 2  # an object and its record per key; the bundle


def _differences(facts: dict) -> list[str]:
    return [name for name, value in facts.items() if ENVIRONMENT[name] != value]


def _require_toolchain() -> None:
    """The artifacts were made with this toolchain: elsewhere they are stale by design."""
    if _differences({"toolchain": toolchain.fingerprint()}):
        pytest.skip(
            f"artifacts made with toolchain {ENVIRONMENT['toolchain']}, this machine has "
            f"{toolchain.fingerprint()}: they cannot be current here"
        )


def _require_build_machine() -> None:
    """The build cache's digests also cover the C compiler, the linked-in libraries and the
    CUDA tools that shape a report row."""
    from cute_aot.aot import build_cache

    _require_toolchain()
    packer = build_cache.packer_fingerprint()
    here = {
        "inspection_tools": build_cache.worker_fingerprint()["tools"],
        "link_inputs": packer["link_inputs"],
        "compiler": packer["compiler"],
        "zstd": list(packer["zstd"]),
    }
    if _differences(here):
        pytest.skip(f"build machine differs from the one that made the cache: {_differences(here)}")


@pytest.fixture
def old_cache(fresh_runtime):
    """The cache folder 9d40a62 filled, as this test's CUTE_AOT_CACHE_DIR (a copy: opening and
    building write into it). A checkout gives the overlay key the mode its writer gave it."""
    shutil.copytree(DATA / "cache", fresh_runtime)
    (fresh_runtime / "keys" / "overlay.pem").chmod(0o600)
    return fresh_runtime


@pytest.fixture
def signatures_required(settings_scope):
    """Only signed artifacts load: trust comes from a signature, never from a folder's owner."""
    settings_scope(CUTE_AOT_REQUIRE_SIGNATURE="1", CUTE_AOT_TRUSTED_KEYS=str(RELEASE_PUBLIC_KEY))


def _cli(tmp_path, *args) -> subprocess.CompletedProcess:
    return aot_build(tmp_path, *args, cache_dir=tmp_path / "cli-cache", timeout=600)


def _files(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


# -- the bundle ------------------------------------------------------------------------------------
def test_the_bundle_is_current_and_trusted_and_holds_the_keys_this_code_asks_for(
    old_cache, signatures_required
):
    _require_toolchain()
    manifest = read_manifest(BUNDLE)
    assert manifest.families["router_gemm"]["source_hash"] == ROUTER_SOURCE_HASH
    assert source_hash("router_gemm") == ROUTER_SOURCE_HASH, _MOVED.format(family="router_gemm")
    assert stale_reasons(manifest) == {}

    set_mode("aot")  # a stale bundle raises here instead of loading for no family
    registry = Registry()
    [loaded] = registry.load(BUNDLE, gpu_arch=ARCH)
    assert registry.stale == {}
    assert loaded.signer is not None
    assert loaded.signer.key_id == RELEASE_SIGNER
    assert sorted(loaded.entries) == BUNDLE_KEY_IDS

    # Each entry's key, derived from its fields by this code, has the id that commit gave it...
    router = family("router_gemm")
    for key_id, entry in loaded.entries.items():
        assert router.Key.from_fields(entry.key).id == key_id
        assert entry.symbol == f"router_gemm_{key_id}"
    # ...and they are exactly the keys this code enumerates, and dispatches to with the table
    # the bundle carries, for the shape the bundle was built for.
    assert sorted(key.id for key in enumerate_keys(ARCH, [SHAPE])) == BUNDLE_KEY_IDS
    table = registry.table("router_gemm", ARCH)
    assert table == router.default_table(ARCH)
    n, k = SHAPE
    served = {dispatch(m, n, k, ARCH, table=table).id for m in range(1, 17)}
    assert sorted(served) == BUNDLE_KEY_IDS
    for key_id in BUNDLE_KEY_IDS:
        assert registry.bundle_function("router_gemm", key_id, ARCH) is not None


def test_the_build_report_describes_the_bundle():
    report = json.loads(REPORT.read_text())
    manifest = read_manifest(BUNDLE)
    assert sorted(row["key_id"] for row in report["keys"]) == BUNDLE_KEY_IDS
    assert [row["status"] for row in report["keys"]] == ["compiled"] * len(BUNDLE_KEY_IDS)
    assert [bundle["file"] for bundle in report["bundles"]] == [BUNDLE.name]
    assert report["bundles"][0]["kernels"] == len(manifest.entries)


# -- the overlay -----------------------------------------------------------------------------------
def test_the_overlay_entry_is_found_where_it_was_published_and_trusted(
    old_cache, signatures_required
):
    _require_toolchain()
    set_mode("auto")
    key = dispatch(1, 256, 4096, ARCH)
    assert key.id == OVERLAY_KEY_ID
    assert overlay.signer_key_id() == OVERLAY_SIGNER
    assert overlay.fingerprint("router_gemm") == OVERLAY_FINGERPRINT
    assert overlay.overlay_path(key, ARCH) == old_cache / OVERLAY_ENTRY

    function = REGISTRY.overlay_function(key, ARCH)
    assert function is not None
    entry = REGISTRY.overlay_bundles[(ARCH, OVERLAY_KEY_ID)]
    assert entry.path == old_cache / OVERLAY_ENTRY
    assert entry.signer is not None
    assert entry.signer.key_id == OVERLAY_SIGNER
    assert sorted(entry.entries) == [OVERLAY_KEY_ID]
    # Nothing was set aside as refused, nothing published beside it.
    assert _files(old_cache / "overlay") == [OVERLAY_ENTRY.removeprefix("overlay/")]


# -- the miss log and the record -------------------------------------------------------------------
def test_the_miss_log_reads_back_as_the_same_keys():
    records = read_misses(MISS_LOG)
    assert [record["key_id"] for record in records] == [key_id for key_id, _ in MISSED]
    router = family("router_gemm")
    for record, (key_id, (m, n, k)) in zip(records, MISSED, strict=True):
        assert (record["family"], record["arch"]) == ("router_gemm", ARCH)
        assert router.Key.from_fields(record["key"]).id == key_id
        problem = record["problem"]
        assert (problem["m"], problem["n"], problem["k"]) == (m, n, k)
        assert dispatch(m, n, k, ARCH).id == key_id


def test_the_record_reads_back_as_the_same_key():
    records = read_records(RECORD)
    assert [where for where, _ in records] == [str(RECORD)]
    [(_, record)] = records
    assert record["key_id"] == RECORD_KEY_ID
    assert record["target"] == "tests.user_kernels.scale:scale"
    assert RecordedCallKey.from_fields(record["key"]).id == RECORD_KEY_ID


def test_this_code_describes_the_recorded_call_with_the_same_key_id():
    """The same call made now (tests/user_kernels/compile_calls.py's, traced by nothing) has
    the key id the record holds."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import describe_call
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.scale import scale

    options = cute.compile[cute.GPUArch(ARCH), cute.EnableTVMFFI(True)]
    call = describe_call(options, scale, arguments(1000), {"block": 128})
    assert call.key().id == RECORD_KEY_ID


def test_the_bundle_built_from_the_record_is_current_and_trusted(old_cache, signatures_required):
    """A recorded-call bundle that commit built is served by this code: the source hash it
    recorded is one the recorded family's builder version declares equal to its own, so users'
    shipped recorded bundles stay current."""
    _require_toolchain()
    manifest = read_manifest(RECORDED_BUNDLE)
    assert manifest.families["cute_compile"]["source_hash"] == RECORDED_SOURCE_HASH
    recorded = family("cute_compile")
    assert RECORDED_SOURCE_HASH in recorded.earlier_source_hashes, _MOVED.format(
        family="cute_compile"
    )
    assert recorded.builder_version == "description format 1", _MOVED.format(family="cute_compile")
    assert stale_reasons(manifest) == {}
    set_mode("aot")
    registry = Registry()
    [loaded] = registry.load(RECORDED_BUNDLE, gpu_arch=ARCH)
    assert registry.stale == {}
    assert loaded.signer is not None
    assert loaded.signer.key_id == RELEASE_SIGNER
    assert sorted(loaded.entries) == [RECORD_KEY_ID]
    [(_, record)] = read_records(RECORD)
    assert loaded.entries[RECORD_KEY_ID].key == record["key"]


# -- builds from them ------------------------------------------------------------------------------
def test_a_rebuild_of_the_same_keys_reuses_the_old_build_cache(tmp_path):
    """Every object, and the linked bundle, comes from the old cache: nothing compiles, nothing
    is added to the cache, and the bundle written is the one that commit linked."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    _require_build_machine()
    cache = tmp_path / "build-cache"
    shutil.copytree(DATA / "cache" / "build", cache)
    assert len(_files(cache)) == BUILD_CACHE_FILES
    before = {name: (cache / name).read_bytes() for name in _files(cache)}
    # The objects' digests first (an object a digest does not name would be compiled again).
    from cute_aot.aot.build_cache import BuildCache

    digests = {BuildCache(cache).object_digest(key, ARCH) for key in enumerate_keys(ARCH, [SHAPE])}
    stored = {Path(name).stem for name in before if name.startswith("objects/")}
    assert digests == stored
    out = tmp_path / "out"
    done = _cli(
        tmp_path,
        *("--family", "router_gemm", "--arch", "sm90a", "--no-default-shapes"),
        *("--shape", f"router_gemm:{SHAPE[0]},{SHAPE[1]}", "-j", "1"),
        *("--name", "previous", "--bundle-version", "9d40a62"),
        *("--cache-dir", cache, "--out", out),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    expected = f"build cache: {len(BUNDLE_KEY_IDS)} objects reused, 0 not found"
    assert [line for line in lines if line.startswith("build cache:")] == [expected]
    report = json.loads((out / REPORT.name).read_text())
    assert report["cache"]["hits"] == len(BUNDLE_KEY_IDS)
    assert report["cache"]["misses"] == 0
    assert sorted(row["key_id"] for row in report["keys"]) == BUNDLE_KEY_IDS
    assert {name: (cache / name).read_bytes() for name in _files(cache)} == before
    [bundle_entry] = [name for name in before if name.endswith(".cuteaot")]
    assert (out / BUNDLE.name).read_bytes() == before[bundle_entry]


def test_this_packer_links_the_old_objects_into_the_old_bytes(tmp_path):
    """The packer is identified by its version (artifacts/fingerprints.py PACKER_VERSION), not by
    its files: while the version stands, the same objects must give the same bundle bytes. With
    the old cache's linked bundle removed, the build links the old objects again."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    _require_build_machine()
    cache = tmp_path / "build-cache"
    shutil.copytree(DATA / "cache" / "build", cache)
    [old_bundle] = [name for name in _files(cache) if name.endswith(".cuteaot")]
    linked_before = (cache / old_bundle).read_bytes()
    shutil.rmtree(cache / "bundles")
    out = tmp_path / "out"
    done = _cli(
        tmp_path,
        *("--family", "router_gemm", "--arch", "sm90a", "--no-default-shapes"),
        *("--shape", f"router_gemm:{SHAPE[0]},{SHAPE[1]}", "-j", "1"),
        *("--name", "previous", "--bundle-version", "9d40a62"),
        *("--cache-dir", cache, "--out", out),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / REPORT.name).read_text())
    assert (report["cache"]["hits"], report["cache"]["misses"]) == (len(BUNDLE_KEY_IDS), 0)
    assert (cache / old_bundle).is_file()  # linked again, under the same digest
    assert (out / BUNDLE.name).read_bytes() == linked_before, (
        "the packer writes other bytes for the same objects: bump PACKER_VERSION"
    )


@pytest.mark.slow
def test_a_build_from_the_old_record_plans_the_recorded_key(tmp_path):
    """A record is data: whatever the recorded family's source hash does later (a describer
    change makes recorded-call bundles stale), an old record still builds, as the same key."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    record = tmp_path / RECORD.name
    shutil.copyfile(RECORD, record)
    out = tmp_path / "out"
    done = _cli(
        tmp_path,
        *("--from-record", record, "--arch", "sm90a", "--name", "recorded"),
        *("-j", "1", "--no-cache", "--out", out, "--quiet"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    assert [line for line in lines if line.startswith("plan:")] == [
        "plan: 1 keys (sm_90a 1); build cache off"
    ]
    report = json.loads((out / "recorded.build-report.json").read_text())
    assert [(row["family"], row["key_id"]) for row in report["keys"]] == [
        ("cute_compile", RECORD_KEY_ID)
    ]
    manifest = read_manifest(out / "recorded-sm_90a.cuteaot")
    assert [entry.key_id for entry in manifest.entries] == [RECORD_KEY_ID]
