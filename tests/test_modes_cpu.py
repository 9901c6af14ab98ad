"""Modes, JIT fallback, the overlay cache, the miss log and staleness, on the CPU.

JIT here is a real cross-compile for sm_90a (no GPU needed to compile or to load; kernels are
not launched).
"""

import dataclasses
import json
import subprocess
import sys
import textwrap
import warnings

import pytest

from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.bundle_writer import write_bundle
from cute_aot.artifacts.core.errors import CuteAotError, KernelNotFoundError
from cute_aot.kernels.router_gemm import dispatch
from cute_aot.runtime import REGISTRY, Mode, StaleBundleError, current_mode, jit, set_mode
from cute_aot.runtime.misses import miss_log_path, read_misses, record_miss
from cute_aot.runtime.overlay import overlay_path
from cute_aot.runtime.resolution import key_function

ARCH = "sm_90a"
# Not in the small bundles: a dot key with K = 2880 (gpt-oss), cheap to compile.
MISS_KEY = dispatch(1, 128, 2880, ARCH)


def test_mode_from_env_and_api(settings_scope, fresh_runtime):
    assert current_mode() is Mode.AUTO
    settings_scope(CUTE_AOT_MODE="AOT")
    assert current_mode() is Mode.AOT
    set_mode("jit")
    assert current_mode() is Mode.JIT
    set_mode(None)
    settings_scope(CUTE_AOT_MODE="sometimes")
    with pytest.raises(
        CuteAotError, match="CUTE_AOT_MODE='sometimes': choose one of auto, aot, jit"
    ):
        current_mode()
    # the API takes the same words by the same grammar, and its error names the API's argument
    with pytest.raises(CuteAotError, match="mode='often': choose one of auto, aot, jit"):
        set_mode("often")
    set_mode(" AOT ")
    assert current_mode() is Mode.AOT


def test_the_mode_is_held_once_by_the_settings(settings_scope, fresh_runtime):
    """set_mode sets CUTE_AOT_MODE for the process: every reader of the setting agrees."""
    from cute_aot.artifacts.core import settings

    settings_scope(CUTE_AOT_MODE="aot")
    set_mode("jit")
    assert settings.mode_name() == "jit" and current_mode() is Mode.JIT
    with settings.scope(CUTE_AOT_MODE="auto"):  # a scope still wins while it lasts
        assert current_mode() is Mode.AUTO
    assert settings.mode_name() == "jit"
    set_mode(None)  # back to the environment
    assert settings.MODE.raw() is None and current_mode() is Mode.AUTO


def test_aot_mode_miss_names_family_key_arch_and_bundles(fresh_runtime, stub_bundles):
    out, paths, _ = stub_bundles
    REGISTRY.load(out, gpu_arch=ARCH)
    set_mode("aot")
    before = jit.compile_count
    with pytest.raises(KernelNotFoundError) as info:
        key_function(MISS_KEY, ARCH)
    message = str(info.value)
    for part in ("router_gemm", MISS_KEY.id, ARCH, "e2e-sm_90a.cuteaot", "mode aot"):
        assert part in message
    assert jit.compile_count == before  # aot never compiles
    assert not miss_log_path().exists()


def test_bundle_hit_needs_no_compile(fresh_runtime, stub_bundles):
    out, _, plan = stub_bundles
    (bundle,) = REGISTRY.load(out, gpu_arch=ARCH)
    before = jit.compile_count
    for key in plan[ARCH]:
        assert key_function(key, ARCH) is bundle.function(key.id)  # the bundle's own
    assert jit.compile_count == before
    assert not miss_log_path().exists()


@pytest.mark.slow
def test_auto_miss_compiles_publishes_records_and_warns_once(fresh_runtime):
    before = jit.compile_count
    with pytest.warns(RuntimeWarning, match="compiling it now"):
        function = key_function(MISS_KEY, ARCH, {"m": 1, "k": 2880, "n": 128})
    # what the compile made for this key, and the only thing it made
    assert jit.compiled_function(MISS_KEY, ARCH, publish=False) is function
    assert jit.compile_count == before + 1
    # published as a verified one-kernel bundle in the overlay
    manifest, _ = read_bundle(overlay_path(MISS_KEY, ARCH))
    assert [e.key_id for e in manifest.entries] == [MISS_KEY.id]
    # recorded in the miss log
    (record,) = read_misses(miss_log_path())
    assert record["key_id"] == MISS_KEY.id and record["arch"] == ARCH
    assert record["problem"] == {"m": 1, "k": 2880, "n": 128}
    # the same process does not compile or warn again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = key_function(MISS_KEY, ARCH)
    # now served by the published overlay entry, loaded once: no second compile
    assert again is REGISTRY.overlay_function(MISS_KEY, ARCH)
    assert type(again).__name__ == "Function"
    assert jit.compile_count == before + 1

    # a later process finds the overlay entry: no compile, no cutlass
    script = textwrap.dedent(
        f"""
        import json, sys
        from cute_aot.kernels.router_gemm import dispatch
        from cute_aot.runtime import REGISTRY, jit
        from cute_aot.runtime.resolution import key_function
        key = dispatch(1, 128, 2880, "{ARCH}")
        function = key_function(key, "{ARCH}")
        print(json.dumps({{"compiles": jit.compile_count,
                           "cutlass": any(m.split(".")[0] == "cutlass" for m in sys.modules),
                           "type": type(function).__name__}}))
        """
    )
    env = {"CUTE_AOT_CACHE_DIR": str(fresh_runtime), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"compiles": 0, "cutlass": False, "type": "Function"}


@pytest.mark.slow
def test_jit_mode_always_compiles_and_never_publishes(fresh_runtime, small_bundles):
    out, _, plan = small_bundles
    REGISTRY.load(out, gpu_arch=ARCH)
    set_mode("jit")
    key = plan[ARCH][0]  # in the bundle, but jit mode ignores bundles
    served = key_function(key, ARCH)
    # the in-process JIT result (compiled once per process), never the bundle's function
    assert served is jit._results[(ARCH, key.id)].result()
    assert served is not REGISTRY._index[(ARCH, key.FAMILY, key.id)].function(key.id)
    assert not overlay_path(key, ARCH).exists()
    assert not miss_log_path().exists()


def _restamp(path, tmp_path, **family_changes):
    manifest, library = read_bundle(path)
    families = {name: {**facts, **family_changes} for name, facts in manifest.families.items()}
    stale = tmp_path / path.name
    write_bundle(stale, dataclasses.replace(manifest, families=families), library)
    return stale


def test_stale_bundle_auto_falls_back_with_one_warning(fresh_runtime, stub_bundles, tmp_path):
    _, paths, plan = stub_bundles
    sm90 = next(p for p in paths if "sm_90a" in p.name)
    stale = _restamp(sm90, tmp_path, source_hash="0" * 64)
    with pytest.warns(RuntimeWarning, match="not used for router_gemm.*source hash"):
        REGISTRY.load(stale, gpu_arch=ARCH)
    assert REGISTRY.bundle_function("router_gemm", plan[ARCH][0].id, ARCH) is None


def test_stale_bundle_aot_mode_is_an_error(fresh_runtime, stub_bundles, tmp_path):
    _, paths, _ = stub_bundles
    sm90 = next(p for p in paths if "sm_90a" in p.name)
    stale = _restamp(sm90, tmp_path, version=99)
    set_mode("aot")
    with pytest.raises(StaleBundleError, match="family version 99"):
        REGISTRY.load(stale, gpu_arch=ARCH)


def test_unwritable_cache_dir_still_loads_from_memory(stub_bundles, settings_scope, tmp_path):
    from cute_aot.artifacts.core.notices import forget
    from cute_aot.runtime.loader import open_bundle

    forget()
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    settings_scope(CUTE_AOT_CACHE_DIR=str(blocker / "cache"))
    _, paths, plan = stub_bundles
    sm90 = next(p for p in paths if "sm_90a" in p.name)
    with pytest.warns(RuntimeWarning, match="cannot hold verified libraries.*temporary files"):
        bundle = open_bundle(sm90, ARCH)
    # loaded from an anonymous in-memory file: nothing written anywhere
    assert bundle.library_path == f"memfd:cute-aot-{bundle.manifest.library['sha256'][:16]}.so"
    assert [path.name for path in tmp_path.iterdir()] == ["file"]
    assert type(bundle.function(plan[ARCH][0].id)).__name__ == "Function"  # a TVM-FFI function


def test_unwritable_miss_log_warns_once(settings_scope, tmp_path):
    from cute_aot.artifacts.core.notices import forget

    forget()
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings_scope(CUTE_AOT_MISS_LOG=str(blocker / "misses.jsonl"))
    with pytest.warns(RuntimeWarning, match="cannot write the miss log"):
        record_miss(MISS_KEY, ARCH, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record_miss(MISS_KEY, ARCH, {})


def test_importing_writes_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(home / ".cache")}
    script = "import cute_aot.runtime, cute_aot.aot.cli, cute_aot.artifacts.bundle"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not list(home.rglob("*cute-aot*")) and not (home / ".cache" / "cute-aot").exists()


def test_miss_log_lines_are_whole_and_readable(fresh_runtime):
    for m in range(3):  # one record per key and process, whatever the shapes that asked
        record_miss(MISS_KEY, ARCH, {"m": m})
    path = miss_log_path()
    with open(path, "a") as handle:
        handle.write('{"torn": ')  # a foreign or torn line is skipped, not fatal
    records = read_misses(path)
    assert len(records) == 1
    assert records[0]["key"] == MISS_KEY.fields() and records[0]["problem"] == {"m": 0}


@pytest.mark.slow
def test_aot_build_from_misses_builds_exactly_those_keys(fresh_runtime, tmp_path):
    from click.testing import CliRunner

    from cute_aot.aot.cli import main

    record_miss(MISS_KEY, ARCH, {"m": 1, "k": 2880, "n": 128})
    record_miss(MISS_KEY, ARCH, {"m": 1, "k": 2880, "n": 128})
    out = tmp_path / "from-misses"
    result = CliRunner().invoke(
        main, ["--from-misses", str(miss_log_path()), "--out", str(out), "--quiet", "-j", "1"]
    )
    assert result.exit_code == 0, result.output
    (bundle,) = out.glob("*.cuteaot")  # next to it: the build report
    manifest, _ = read_bundle(bundle)
    assert manifest.arch == ARCH
    assert [e.key_id for e in manifest.entries] == [MISS_KEY.id]


def test_from_misses_with_nothing_to_build_fails(tmp_path):
    from click.testing import CliRunner

    from cute_aot.aot.cli import main

    empty = tmp_path / "misses.jsonl"
    empty.write_text("")
    result = CliRunner().invoke(main, ["--from-misses", str(empty), "--quiet"])
    assert result.exit_code == 1
    assert "no misses to build" in result.output


def test_the_modes_are_the_words_of_cute_aot_mode_s_one_grammar():
    from cute_aot.artifacts.core import settings

    assert settings.MODE.kind == "choice:" + ",".join(mode.value for mode in Mode)
