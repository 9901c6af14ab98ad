"""A kernel family from another package: tests/external_family (RMSNorm in CuTe DSL), pip-installed
into a folder of its own and served by the generic build, loader, ops and `aot-cache`, exactly as
another project's family would be. docs/bring-your-own-kernel.md walks through the same steps.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from cute_aot.artifacts.core.errors import InputError, UnsupportedProblemError
from cute_aot.kernels import (
    ENTRY_POINT_GROUP,
    KernelFamily,
    families,
    family,
    forget_families,
    source_hash,
)

# Read at import, before the fresh_runtime fixture isolates the environment.
BUNDLES = os.environ.get("CUTE_AOT_BUNDLES", "bundles")

PACKAGE_SOURCE = Path(__file__).parent / "external_family"
DISTRIBUTION = "cute-aot-example-rmsnorm"
# What a model's RMSNorm layers need, and what the family builds by default.
DEFAULT_N = (4096, 7168)
ARCHS = ("sm_90a", "sm_100a", "sm_103a")  # plain SIMT: every architecture cute-aot builds
# A key's id is its identity in every bundle ever shipped: it must not move between releases.
PINNED_IDS = {4096: "c0dbef71b2bf02355724", 7168: "5215f670ecd44a9fb0be"}


# -- installing the package --------------------------------------------------------------------
def _pip_install(source: Path, target: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
    if importlib.util.find_spec("setuptools") is not None:
        # The build backend is here: no network, no isolated build environment.
        args += ["--no-build-isolation", "--no-index"]
    return subprocess.run([*args, str(source)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def family_site(tmp_path_factory) -> Path | str:
    """The folder the package is installed into, or why it could not be installed.

    pip builds in the source tree (build/, *.egg-info), so it builds a copy.
    """
    work = tmp_path_factory.mktemp("rmsnorm-package")
    source = work / "source"
    shutil.copytree(
        PACKAGE_SOURCE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    )
    result = _pip_install(source, work / "site")
    if result.returncode != 0:
        return f"pip install {PACKAGE_SOURCE} failed: {result.stderr.strip()[-2000:]}"
    return work / "site"


def _activate(site: Path) -> None:
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    forget_families()


def _deactivate(site: Path) -> None:
    sys.path.remove(str(site))
    for name in [name for name in sys.modules if name.split(".")[0] == "cute_aot_rmsnorm"]:
        del sys.modules[name]
    importlib.invalidate_caches()
    forget_families()


@pytest.fixture(scope="module")
def site(family_site) -> Iterator[Path]:
    """The package installed and visible to this process; gone again after this module, so
    that other tests keep seeing only the families of cute-aot itself."""
    if isinstance(family_site, str):
        pytest.fail(family_site)
    _activate(family_site)
    yield family_site
    _deactivate(family_site)


@pytest.fixture
def rmsnorm(site) -> KernelFamily:
    return family("rmsnorm")


def _env(site: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A subprocess environment that sees the installed package (PYTHONPATH reaches the build's
    worker processes too) and keeps its caches in tmp_path."""
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(paths),
        "CUTE_AOT_CACHE_DIR": str(tmp_path / "cache"),
        **extra,
    }


# Console scripts run as installed (`aot-build`, `aot-cache`), whatever module they live in.
_CONSOLE_SCRIPT = (
    "import sys\n"
    "from importlib.metadata import entry_points\n"
    "(point,) = entry_points(group='console_scripts', name=sys.argv[1])\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.exit(point.load()())\n"
)


def _command(name: str, *args: str, env: dict, cwd: Path, timeout: int = 900):
    return subprocess.run(
        [sys.executable, "-c", _CONSOLE_SCRIPT, name, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def _python(script: str, env: dict, cwd: Path):
    """Run `script` in a fresh interpreter; returns the JSON value it prints last."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- (a) the contract, on CPU ------------------------------------------------------------------
def test_discovered_through_its_entry_point(site):
    from importlib import metadata

    forget_families()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a family left out warns: here nothing may be left out
        found = families()
    assert {"rmsnorm", "router_gemm"} <= set(found)
    (point,) = [p for p in metadata.entry_points(group=ENTRY_POINT_GROUP) if p.name == "rmsnorm"]
    assert point.value == "cute_aot_rmsnorm:family"
    assert point.dist.name == DISTRIBUTION
    assert isinstance(found["rmsnorm"], KernelFamily)
    assert Path(sys.modules["cute_aot_rmsnorm"].__file__).is_relative_to(site)


def test_declares_the_contract(rmsnorm):
    assert rmsnorm.name == "rmsnorm" and rmsnorm.version == 1
    assert rmsnorm.archs == ARCHS
    assert rmsnorm.builder == "cute_aot_rmsnorm.build"
    assert [(a.name, a.dtype, a.rank, a.output) for a in rmsnorm.abi] == [
        ("x", "bfloat16", 2, False),
        ("weight", "bfloat16", 1, False),
        ("out", "bfloat16", 2, True),
    ]
    assert all(a.align_bytes == 16 and a.layout == "row-major" for a in rmsnorm.abi)
    assert rmsnorm.default_shapes == tuple((n,) for n in DEFAULT_N)
    assert rmsnorm.shape_syntax == "N" and not rmsnorm.unprefixed_shapes


def test_server_side_imports_neither_cutlass_nor_torch(site, tmp_path):
    """The family is imported on a server's call path: its pure part must stay pure."""
    facts = _python(
        """
        import json, sys
        from cute_aot.kernels import family
        rmsnorm = family("rmsnorm")
        rmsnorm.enumerate_keys("sm_90a")
        rmsnorm.dispatch(rmsnorm.parse_problem("8,4096"), "sm_90a")
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"cutlass", "torch"})))
        """,
        _env(site, tmp_path),
        tmp_path,
    )
    assert facts == []


@pytest.mark.parametrize(
    "n, block_size",
    [(8, 32), (512, 32), (2048, 64), (2880, 96), (4096, 128), (7168, 224), (32768, 1024)],
)
def test_dispatch_block_size_rule(rmsnorm, n, block_size):
    decision = rmsnorm.dispatch((5, n), "sm_90a")
    key = decision.key
    assert (key.n, key.block_size, key.eps, key.dtype) == (n, block_size, 1e-6, "bfloat16")
    assert (key.align_bytes, key.version) == (16, 1)
    chunks = n // 8
    # Never more than 4 chunks per thread, and never a warp more than that needs.
    assert -(-chunks // block_size) <= 4
    assert block_size == 32 or -(-chunks // (block_size - 32)) > 4
    assert f"N={n}" in decision.reason and f"{block_size} threads" in decision.reason


def test_one_key_serves_every_token_count(rmsnorm):
    keys = {
        rmsnorm.dispatch((m, 4096), arch).key
        for m in (1, 7, 128, 1000, 1 << 20)
        for arch in ("sm_90a", "sm100a")
    }
    assert len(keys) == 1
    assert rmsnorm.dispatch((1, 4096), "sm_90a").key != rmsnorm.dispatch((1, 7168), "sm_90a").key


@pytest.mark.parametrize(
    "problem, arch, words",
    [
        ((4, 4100), "sm_90a", "N % 8"),
        ((4, 65536), "sm_90a", "N <= 32768"),
        ((0, 4096), "sm_90a", "M >= 1"),
        ((4, 4096, "float16"), "sm_90a", "bfloat16"),
        ((4, 4096), "sm_80", "unsupported architecture"),
    ],
)
def test_dispatch_refuses_with_a_reason(rmsnorm, problem, arch, words):
    with pytest.raises(UnsupportedProblemError, match=words):
        rmsnorm.dispatch(problem, arch)


def test_key_ids_are_stable(rmsnorm, site, tmp_path):
    keys = rmsnorm.enumerate_keys("sm_90a")
    assert {key.n: key.id for key in keys} == PINNED_IDS
    for key in keys:
        assert key.id == hashlib.sha256(key.canonical_json().encode()).hexdigest()[:20]
        assert key.symbol == f"rmsnorm_{key.id}"
        assert rmsnorm.Key.from_fields(json.loads(key.canonical_json())) == key
    # The same ids in a fresh process (no hash seeds, no object identity in them).
    fresh = _python(
        """
        import json
        from cute_aot.kernels import family
        print(json.dumps({k.n: k.id for k in family("rmsnorm").enumerate_keys("sm_100a")}))
        """,
        _env(site, tmp_path),
        tmp_path,
    )
    assert {int(n): key_id for n, key_id in fresh.items()} == PINNED_IDS


def test_enumerate_keys_one_per_hidden_size(rmsnorm):
    assert [key.n for key in rmsnorm.enumerate_keys("sm_90a")] == sorted(DEFAULT_N)
    assert len(rmsnorm.enumerate_keys("sm_90a", [(4096,), (4096,), (7168,), (2048,)])) == 3
    assert list(rmsnorm.problems((5120,))) == [(1, 5120, "bfloat16")]


def test_parse_shape_and_problem(rmsnorm):
    assert rmsnorm.parse_shape("4096") == (4096,)
    assert rmsnorm.parse_problem("8,4096") == (8, 4096, "bfloat16")
    assert rmsnorm.parse_problem("8,4096", "bfloat16") == (8, 4096, "bfloat16")
    assert rmsnorm.describe_problem((8, 4096, "bfloat16")) == {
        "m": 8,
        "n": 4096,
        "dtype": "bfloat16",
    }
    for text in ("4096,8", "x", "", "-8", "4100"):
        with pytest.raises(UnsupportedProblemError):
            rmsnorm.parse_shape(text)
    with pytest.raises(UnsupportedProblemError):
        rmsnorm.parse_problem("4096")


def test_shapes_from_model(rmsnorm):
    assert rmsnorm.shapes_from_model({"hidden_size": 7168, "n_routed_experts": 256}) == [(7168,)]
    assert rmsnorm.shapes_from_model({"hidden_size": 4096}) == [(4096,)]
    assert rmsnorm.shapes_from_model({"vocab_size": 32000}) == []
    assert rmsnorm.shapes_from_model({"hidden_size": "4096"}) == []
    with pytest.raises(UnsupportedProblemError, match="N % 8"):
        rmsnorm.shapes_from_model({"hidden_size": 4100})


def test_shapes_from_a_torch_model(rmsnorm):
    torch = pytest.importorskip("torch")

    class LlamaRMSNorm(torch.nn.Module):  # Hugging Face's layers are found by class name
        def __init__(self, n: int):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(n))

    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8),
        torch.nn.RMSNorm(7168),
        LlamaRMSNorm(4096),
        LlamaRMSNorm(4096),
        LlamaRMSNorm(100),  # not a multiple of 8: nothing to warm up
        torch.nn.LayerNorm(2048),
    )
    assert rmsnorm.shapes_from_torch_model(model) == [(4096,), (7168,)]


def test_tensor_shapes_of_a_problem(rmsnorm):
    assert rmsnorm.input_shapes((8, 4096, "bfloat16")) == ((8, 4096), (4096,))
    assert rmsnorm.output_shape((8, 4096, "bfloat16")) == (8, 4096)


def test_problem_reads_tensors_and_refuses_mismatched_n(rmsnorm):
    torch = pytest.importorskip("torch")
    x = torch.zeros(5, 4096, dtype=torch.bfloat16)
    assert rmsnorm.problem(x, torch.zeros(4096, dtype=torch.bfloat16)) == (5, 4096, "bfloat16")
    with pytest.raises(InputError, match="N=4096.*N=7168"):
        rmsnorm.problem(x, torch.zeros(7168, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="multiple of 8"):
        rmsnorm.problem(x[:, :4092], torch.zeros(4092, dtype=torch.bfloat16))


def test_reference_is_fp32_math_rounded_once(rmsnorm):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    weight = torch.randn(512, generator=gen).to(torch.bfloat16)
    out = rmsnorm.reference(x, weight)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    exact = _exact(x, weight)
    assert ((out.double() - exact).abs() <= _bound(512) * exact.abs()).all()


def test_source_hash_follows_the_installed_kernel_code(rmsnorm, site):
    """Bundles record the hash; a server whose package has other kernel code must see stale."""
    kernel = site / "cute_aot_rmsnorm" / "kernel.py"
    text = kernel.read_text()
    before = source_hash("rmsnorm")
    try:
        kernel.write_text(text + "# a change of the kernel's code\n")
        forget_families()
        changed = source_hash("rmsnorm")
    finally:
        kernel.write_text(text)
        forget_families()
    assert changed != before
    assert source_hash("rmsnorm") == before


# -- (b) built on CPU next to router_gemm, loaded without cutlass, explained -------------------
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_compile_exports_a_tvm_ffi_function(rmsnorm, arch, tmp_path):
    key = rmsnorm.dispatch((1, 4096), arch).key
    compiled = rmsnorm.compile(key, arch)
    obj = tmp_path / f"{key.symbol}.o"
    compiled.export_to_c(str(obj), function_name=key.symbol, export_only_tvm_ffi_symbols=True)
    symbols = subprocess.run(
        ["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True
    ).stdout
    assert f" T __tvm_ffi_{key.symbol}\n" in symbols


@pytest.mark.slow
def test_kernel_uses_128_bit_accesses_and_one_barrier(site, tmp_path):
    """The design note's claims, read from the PTX of N=4096 (128 threads, 4 full rounds)."""
    script = """
        import json
        from cute_aot.kernels import family
        rmsnorm = family("rmsnorm")
        rmsnorm.compile(rmsnorm.dispatch((1, 4096), "sm_90a").key, "sm_90a")
        print("null")
        """
    dump = tmp_path / "dump"
    dump.mkdir()
    _python(
        script, _env(site, tmp_path, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump)), tmp_path
    )
    (ptx_file,) = dump.glob("*.ptx")
    ptx = ptx_file.read_text()
    assert ptx.count("ld.global.v4.b32") == 8  # 4 chunks of x + 4 of weight per thread
    assert ptx.count("st.global.v4.b32") == 4
    assert "ld.global.b16" not in ptx and "ld.global.u16" not in ptx
    assert ptx.count("shfl.sync.bfly") == 5 and ptx.count("bar.sync") == 1


@pytest.fixture(scope="module")
def mixed_bundle(site, tmp_path_factory) -> Path:
    """`aot-build` with both families into one folder (the intended generic command line)."""
    work = tmp_path_factory.mktemp("mixed")
    out = work / "bundles"
    result = _command(
        "aot-build",
        "--families",
        "router_gemm,rmsnorm",
        "--shape",
        "rmsnorm:4096",
        "--arch",
        "sm90a",
        "--out",
        str(out),
        env=_env(site, work),
        cwd=work,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.mark.slow
def test_one_bundle_holds_both_families(mixed_bundle, rmsnorm):
    from cute_aot.artifacts.bundle import read_manifest

    (path,) = mixed_bundle.glob("*.cuteaot")
    manifest = read_manifest(path)
    assert manifest.arch == "sm_90a"
    by_family: dict[str, set[str]] = {}
    for entry in manifest.entries:
        by_family.setdefault(entry.family, set()).add(entry.symbol)
    expected = {key.symbol for key in rmsnorm.enumerate_keys("sm_90a")}
    router = family("router_gemm").enumerate_keys("sm_90a")
    assert by_family == {"rmsnorm": expected, "router_gemm": {key.symbol for key in router}}
    # Recorded so that a server with another version of the package refuses these kernels.
    assert manifest.families["rmsnorm"]["source_hash"] == source_hash("rmsnorm")
    assert manifest.families["rmsnorm"]["version"] == rmsnorm.version


@pytest.mark.slow
def test_fresh_process_loads_it_without_cutlass(mixed_bundle, site, tmp_path):
    loaded = _python(
        f"""
        import json, sys
        from cute_aot.runtime import load_bundles
        from cute_aot.kernels import family
        (bundle,) = load_bundles({str(mixed_bundle)!r}, gpu_arch="sm_90a")
        rmsnorm = family("rmsnorm")
        keys = rmsnorm.enumerate_keys("sm_90a", rmsnorm.default_shapes)
        print(json.dumps({{
            "arch": bundle.arch,
            "entries": sorted(e.symbol for e in bundle.manifest.entries if e.family == "rmsnorm"),
            "functions": [type(bundle.function(key.id)).__name__ for key in keys],
            "symbols": sorted(key.symbol for key in keys),
            "cutlass": "cutlass" in sys.modules,
        }}))
        """,
        _env(site, tmp_path),
        tmp_path,
    )
    assert loaded["arch"] == "sm_90a"
    assert loaded["cutlass"] is False
    assert loaded["entries"] == loaded["symbols"] and len(loaded["entries"]) == 2
    assert loaded["functions"] == ["Function", "Function"]  # TVM-FFI functions, looked up


@pytest.mark.slow
def test_explain_names_the_bundle_and_the_reason(mixed_bundle, rmsnorm, site, tmp_path):
    result = _command(
        "aot-cache",
        "explain",
        "rmsnorm",
        "--shape",
        "8,4096",
        "--arch",
        "sm_90a",
        "--json",
        env=_env(site, tmp_path, CUTE_AOT_BUNDLES=str(mixed_bundle)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["family"] == "rmsnorm"
    (decision,) = report["decisions"]
    dispatch = rmsnorm.dispatch((8, 4096), "sm_90a")
    (bundle,) = mixed_bundle.glob("*.cuteaot")
    assert decision["key_id"] == dispatch.key.id
    assert decision["source"] == "bundle", decision["why"]
    assert Path(decision["path"]) == bundle
    assert decision["dispatch"] == dispatch.reason


# -- (c) on a GPU, from bundles built on CPU ---------------------------------------------------
def _bundles_with_rmsnorm(arch: str) -> list[Path]:
    from cute_aot.artifacts.bundle import read_manifest

    found = []
    for source in map(Path, BUNDLES.split(os.pathsep)):
        for path in sorted(source.glob("*.cuteaot")) if source.is_dir() else [source]:
            if not path.is_file():
                continue
            manifest = read_manifest(path)
            if manifest.arch == arch and any(e.family == "rmsnorm" for e in manifest.entries):
                found.append(path)
    return found


@pytest.fixture(scope="module")
def served(family_site) -> Iterator[KernelFamily]:
    """rmsnorm served from CPU-built bundles in mode aot (a miss raises: no JIT, no torch)."""
    import torch

    from cute_aot.kernels.arch import arch_for_capability
    from cute_aot.runtime import load_bundles, set_mode

    arch = arch_for_capability(*torch.cuda.get_device_capability())
    if arch is None:
        pytest.skip(f"no kernels are built for {torch.cuda.get_device_name()}")
    installed = importlib.util.find_spec("cute_aot_rmsnorm") is not None
    if not installed and isinstance(family_site, str):
        pytest.skip(f"the family package is not installed and cannot be: {family_site}")
    paths = _bundles_with_rmsnorm(arch)
    if not paths:
        pytest.skip(
            f"no {arch} bundle with rmsnorm kernels in CUTE_AOT_BUNDLES "
            f"({os.environ.get('CUTE_AOT_BUNDLES', 'bundles')}); build one on CPU: aot-build "
            f"--families rmsnorm --shape rmsnorm:4096 --shape rmsnorm:7168 --arch {arch}"
        )
    if not installed:
        _activate(family_site)
    set_mode("aot")
    try:
        load_bundles(*paths)
        yield family("rmsnorm")
    finally:
        set_mode(None)
        if not installed:
            _deactivate(family_site)


def _inputs(m: int, n: int, seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed + 7919 * m + n)
    x = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
    weight = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    return x, weight


def _exact(x, weight):
    """RMSNorm of the bf16 inputs in float64: exact for these purposes."""
    xd = x.double()
    return xd * (xd.square().mean(-1, keepdim=True) + 1e-6).rsqrt() * weight.double()


def _bound(n: int) -> float:
    """Relative error allowed against y = `_exact` for fp32 math rounded once to bf16.

    In fp32 the kernel's sum of N exact squares (bf16 * bf16 is exact in fp32) of one sign is
    within gamma_N ~ N u of exact (u = 2^-24, Higham 3.1); the mean, + eps, rsqrt.approx
    (< 2^-22 = 4u relative) and the two products add a few u more, and the square root halves
    the sum's share: the fp32 result is within delta = (N/2 + 8) u of y, relatively. Rounding it
    to bf16 (unit roundoff 2^-8) gives |out - y| <= 2^-8 (1 + delta) |y| + delta |y|. Against
    the torch reference (also a rounding of an fp32 value within delta of y) that leaves at most
    one bf16 ulp, <= 2^-7 |ref|.
    """
    delta = (n / 2 + 8) * 2.0**-24
    return 2.0**-8 * (1 + delta) + delta


def _check(out, x, weight, rmsnorm) -> None:
    n = x.shape[1]
    exact = _exact(x, weight)
    bound = _bound(n) * exact.abs()
    assert out.dtype == x.dtype and out.shape == x.shape and out.device == x.device
    err = (out.double() - exact).abs()
    assert (err <= bound).all(), f"N={n}: {(err > bound).sum().item()} elements over the bound"
    ref = rmsnorm.reference(x, weight).double()
    assert ((out.double() - ref).abs() <= 2.0**-7 * ref.abs()).all()


@pytest.mark.gpu
def test_op_matches_the_reference(served):
    import torch

    from cute_aot import runtime

    for (n,) in served.default_shapes:
        for m in (1, 7, 128, 1000):
            x, weight = _inputs(m, n)
            out = runtime.rmsnorm(x, weight)
            torch.cuda.synchronize()
            _check(out, x, weight, served)


@pytest.mark.gpu
def test_op_runs_on_the_current_stream_and_in_cuda_graphs(served):
    import torch

    from cute_aot import runtime

    x, weight = _inputs(128, 4096, seed=1)
    expected = runtime.rmsnorm(x, weight)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = runtime.rmsnorm(x, weight)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            captured = runtime.rmsnorm(x, weight)
    side.synchronize()
    assert torch.equal(on_side, expected)
    x.copy_(_inputs(128, 4096, seed=2)[0])
    graph.replay()  # a kernel on the default stream would make the capture empty
    torch.cuda.synchronize()
    _check(captured, x, weight, served)
