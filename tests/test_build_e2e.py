"""A real, small bundle cross-compiled for sm_90a and sm_100a on this CPU, then loaded in a fresh
process that must never import cutlass."""

import json
import subprocess
import sys
import textwrap

import pytest

from cute_aot.artifacts.bundle import read_bundle
from cute_aot.kernels import source_hash
from cute_aot.runtime.loader import SHAPE_DISPATCH_FUNCTION
from tests.conftest import ARCHS, PROBLEMS

pytestmark = pytest.mark.slow


@pytest.fixture
def bundles(small_bundles):
    return small_bundles


def test_one_bundle_per_arch_with_every_key(bundles):
    out, paths, plan = bundles
    assert sorted(p.name for p in paths) == ["e2e-sm_100a.cuteaot", "e2e-sm_90a.cuteaot"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # no leftovers
    for path in paths:
        manifest, library = read_bundle(path)
        assert manifest.arch in ARCHS
        assert {e.key_id for e in manifest.entries} == {k.id for k in plan[manifest.arch]}
        assert {e.symbol for e in manifest.entries} == {k.symbol for k in plan[manifest.arch]}
        assert manifest.families["router_gemm"]["source_hash"] == source_hash("router_gemm")
        assert manifest.toolchain["cutlass_dsl"]["nvidia-cutlass-dsl"]
        assert manifest.toolchain["cuda_runtime_major"] == 13
        assert library.startswith(b"\x7fELF")
        for entry in manifest.entries:
            assert len(entry.sha256) == 64 and entry.size > 0


def test_library_exports_only_the_kernel_entry_points(bundles, tmp_path):
    _, paths, plan = bundles
    manifest, library = read_bundle(paths[0])
    so = tmp_path / "lib.so"
    so.write_bytes(library)
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout.split()
    exported = sorted(s for s in symbols if s.startswith("__tvm_ffi_"))
    kernels = [f"__tvm_ffi_{e.symbol}" for e in manifest.entries]
    assert exported == sorted([*kernels, f"__tvm_ffi_{SHAPE_DISPATCH_FUNCTION}"])
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    assert "libtvm_ffi.so" in needed
    assert "libcute_dsl_runtime" not in needed and "libcudart" not in needed


def test_fresh_process_loads_and_dispatches_without_cutlass(bundles, tmp_path):
    out, _, _ = bundles
    script = textwrap.dedent(
        f"""
        import json, sys, time
        start = time.perf_counter()
        from cute_aot.runtime import REGISTRY, load_bundles
        from cute_aot.runtime.resolution import key_function
        from cute_aot.kernels.router_gemm import dispatch
        loaded = load_bundles({str(out)!r}, gpu_arch="sm_90a")
        functions = {{}}
        for m, n, k in {PROBLEMS!r}:
            key = dispatch(m, n, k, "sm_90a")
            functions[key.id] = type(key_function(key, "sm_90a")).__name__
        print(json.dumps({{
            "archs": [b.arch for b in loaded],
            "functions": functions,
            "cutlass_imported": any(m.split(".")[0] == "cutlass" for m in sys.modules),
            "seconds": time.perf_counter() - start,
        }}))
        """
    )
    env = {"CUTE_AOT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["archs"] == ["sm_90a"]  # the folder's sm_100a bundle is skipped
    assert len(report["functions"]) == 2
    assert set(report["functions"].values()) == {"Function"}
    assert report["cutlass_imported"] is False
    assert list((tmp_path / "cache" / "libs").iterdir())  # library published in the cache
