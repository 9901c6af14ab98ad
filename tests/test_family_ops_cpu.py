"""The generic family op on the CPU: regression tests for the runtime bugs found around it.

No GPU: the op runs on a fake H200 (tests/fake_gpu.py: torch answers from the virtual device's
profile, and the inputs are CPU tensors that say they lie on cuda:0), so its own validation and
resolution run unmodified; nvidia-cutlass-dsl is hidden, or found where a test's compile is a
stand-in (tests/stubs.py), and bundles are LoadedBundle values whose "library" is a dict of
Python functions, so nothing is compiled or dlopened.
"""

import threading
import time

import pytest
import torch

from cute_aot.artifacts.core.errors import InputError, JitUnavailableError
from cute_aot.kernels import family
from cute_aot.runtime import REGISTRY, ops, set_mode
from cute_aot.runtime.loader import LoadedBundle
from cute_aot.runtime.misses import miss_log_path, read_misses
from tests.fake_gpu import GPU, on_gpu
from tests.stubs import loaded_bundle, with_cutlass_found, without_cutlass

ARCH = "sm_90a"  # the fake GPU's (an H200)
ROUTER = family("router_gemm")
PROBLEM = ROUTER.parse_problem("2,8,64")


def _fake_bundle(key, function) -> LoadedBundle:
    return loaded_bundle(key, function, ARCH)


@pytest.fixture
def router_op(fresh_runtime, fake_gpu):
    """The router op on a fake sm_90a GPU."""
    op = ops.family_op("router_gemm")
    op.table.clear()
    yield op
    op.table.clear()


def _inputs(dtype=torch.bfloat16):
    m, n, k = PROBLEM[:3]
    return on_gpu(torch.ones(m, k, dtype=dtype)), on_gpu(torch.ones(n, k, dtype=torch.bfloat16))


def _no_jit(monkeypatch):
    without_cutlass(monkeypatch)


def test_a_torch_fallback_is_replaced_once_a_bundle_brings_the_kernel(router_op, monkeypatch):
    """Bug 1: resolutions are forgotten when bundles are loaded (and when they are cleared)."""
    _no_jit(monkeypatch)
    with pytest.warns(RuntimeWarning, match="torch reference"):
        fallback, _ = router_op.resolve(PROBLEM, GPU)
    router_op.preload(PROBLEM, GPU)
    assert len(router_op.table) == 1
    assert router_op.table[next(iter(router_op.table))][0].__name__ == "reference"

    calls = []
    key = ROUTER.dispatch(PROBLEM, ARCH).key
    REGISTRY.add(_fake_bundle(key, lambda x, w, out: calls.append((x.shape, w.shape))))
    assert router_op.table == {}  # forgotten: the next call resolves again
    x, w = _inputs()
    out = torch.empty(2, 8, device="cuda")
    assert ops.op("router_gemm")(x, w, out=out) is out
    assert calls == [(x.shape, w.shape)]  # served by the bundle, not by torch

    REGISTRY.clear()
    assert router_op.table == {}


def test_the_cached_torch_fallback_checks_its_inputs(router_op, monkeypatch):
    """Bug 2: an fp16 or strided x reaching the cached fallback is refused, not computed."""
    _no_jit(monkeypatch)
    router_gemm = ops.op("router_gemm")
    x, w = _inputs()
    with pytest.warns(RuntimeWarning, match="torch reference"):
        expected = router_gemm(x, w)  # resolves to the fallback and caches it
    assert torch.equal(expected, torch.full((2, 8), 64.0))
    x16, _ = _inputs(torch.float16)
    with pytest.raises(InputError, match="x must be bfloat16, got float16"):
        router_gemm(x16, w)  # same shapes and device: the cached fallback is what runs
    ((function, _),) = router_op.table.values()
    out = torch.empty(2, 8, device="cuda")
    strided = on_gpu(torch.ones(64, 2, dtype=torch.bfloat16)).t()
    with pytest.raises(InputError, match="router_gemm: x must be contiguous"):
        function(strided, w, out)
    with pytest.raises(InputError, match="x must be on a CUDA device, got cpu"):
        function(x.cpu(), w, out)
    with pytest.raises(InputError, match="must be 16-byte aligned"):
        function(on_gpu(torch.ones(2 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 64)), w, out)
    function(x, w, out)  # the same function takes a well-placed x
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "failure",
    [
        ImportError("libcute_dsl.so: cannot open shared object file"),
        RuntimeError("MLIR pass failed"),
        OSError("export_to_c: No space left on device"),
    ],
    ids=["cutlass-import", "compile", "export"],
)
def test_auto_falls_back_to_torch_when_jit_fails_in_any_way(router_op, monkeypatch, failure):
    """Bug 3: a broken cutlass-dsl, a compile error or an export error falls back in auto
    (one warning, one miss record), and raises in jit mode."""
    with_cutlass_found(monkeypatch)

    def broken(self, key, arch):
        raise failure

    monkeypatch.setattr(type(ROUTER), "compile", broken)
    with pytest.warns(RuntimeWarning) as caught:
        function, _ = router_op.resolve(PROBLEM, GPU)
    assert function.__name__ == "reference"
    messages = [str(w.message) for w in caught]
    assert any("runs its torch reference" in m and type(failure).__name__ in m for m in messages)
    (record,) = read_misses(miss_log_path())
    assert record["family"] == "router_gemm" and record["arch"] == ARCH

    set_mode("jit")
    with pytest.raises(type(failure)):
        router_op.resolve(PROBLEM, GPU)


def test_jit_mode_without_cutlass_raises_a_typed_error(router_op, monkeypatch):
    _no_jit(monkeypatch)
    set_mode("jit")
    with pytest.raises(JitUnavailableError, match="nvidia-cutlass-dsl is not installed"):
        router_op.resolve(PROBLEM, GPU)


def test_a_second_thread_waits_for_the_bundles_of_the_environment(
    fresh_runtime, monkeypatch, settings_scope
):
    """Bug 4: while one thread loads CUTE_AOT_BUNDLES, another must not find an empty registry."""
    key = ROUTER.dispatch(PROBLEM, ARCH).key
    kernel = object()
    started = threading.Event()

    def slow_load(sources, gpu_arch, skip_bad_files):
        started.set()
        time.sleep(0.3)
        REGISTRY.add(_fake_bundle(key, kernel))
        return []

    monkeypatch.setattr(REGISTRY, "_load", slow_load)
    settings_scope(CUTE_AOT_BUNDLES=str(fresh_runtime.parent))  # the other thread reads it too
    loader = threading.Thread(target=REGISTRY.load_from_env)
    loader.start()
    assert started.wait(5)
    found = REGISTRY.bundle_function(key.FAMILY, key.id, ARCH)  # meanwhile, from this thread
    loader.join()
    assert found is kernel


@pytest.mark.parametrize("several_archs", [False, True], ids=["one arch", "several archs"])
def test_resolutions_are_kept_per_device_only_with_several_architectures(
    router_op, monkeypatch, several_archs
):
    monkeypatch.setattr(
        ops, "_visible_archs", lambda: {ARCH, "sm_100a"} if several_archs else {ARCH}
    )
    router_op._per_device = None
    _no_jit(monkeypatch)
    x, w = _inputs()
    with pytest.warns(RuntimeWarning, match="torch reference"):
        ops.op("router_gemm")(x, w)
    shapes = (x.shape, w.shape)
    if several_archs:  # every call takes the checked path, which finds it per device
        assert router_op.table == {} and list(router_op.device_table) == [(*shapes, GPU)]
    else:  # the hit path's table, by shapes alone
        assert list(router_op.table) == [shapes] and router_op.device_table == {}
    router_op._per_device = None


def test_making_an_op_asks_nothing_of_cuda(monkeypatch):
    """Asking GPUs for their architecture at import would initialize CUDA before a server forks
    its workers; an op asks at its first call instead."""
    from cute_aot.kernels import KernelFamily, TensorArg

    class Scale(KernelFamily):
        name = "scale_for_a_test"
        version = 1
        Key = ROUTER.Key
        archs = (ARCH,)
        abi = (TensorArg("x", "float32", 1), TensorArg("out", "float32", 1, output=True))
        builder = "nowhere"

    def no_cuda():
        raise AssertionError("asked CUDA at construction")

    monkeypatch.setattr(ops, "_visible_archs", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", no_cuda)
    op = ops.FamilyOp(Scale())
    with pytest.raises(AssertionError, match="asked CUDA"):
        op.per_device  # noqa: B018  (the first call asks, and only then)
