"""The ops' C hit path (artifacts/shape_dispatch.c, linked into every bundle library): a table from
the input tensors' shapes to the kernel serving them, called in one TVM-FFI call. On the CPU, with a
real library linked from stub objects; the kernels put into it are recorders.
"""

from __future__ import annotations

import os

import pytest
import torch
import tvm_ffi

from cute_aot.kernels import family
from cute_aot.runtime import REGISTRY, ops, policy
from cute_aot.runtime.loader import open_bundle
from cute_aot.runtime.resolution import key_function
from tests.fake_gpu import on_gpu
from tests.stubs import stub_value

PUT, CLEAR, SIZE = 1, 2, 3
MISS = 1
ARCH = "sm_90a"  # the fake GPU's (an H200), and the stub bundle's
BUNDLES = os.environ.get("CUTE_AOT_BUNDLES")  # read before fixtures isolate the environment


@pytest.fixture
def table(stub_bundles):
    _, paths, _ = stub_bundles
    bundle = open_bundle(next(p for p in paths if ARCH in p.name), None)
    return bundle, bundle.shape_dispatcher(2)


def recorder(calls):
    return tvm_ffi.convert(
        lambda *args: calls.append([None if a is None else tuple(a.shape) for a in args])
    )


def test_the_table_calls_the_kernel_of_the_input_shapes_and_nothing_on_a_miss(table):
    _, dispatch = table
    x, w, out = torch.zeros(2, 64), torch.zeros(8, 64), torch.zeros(2, 8)
    assert dispatch(x, w, out) == MISS and dispatch(SIZE) == 0
    calls, others = [], []
    assert dispatch(PUT, recorder(calls), 2, 2, 64, 2, 8, 64) == 1
    assert dispatch(PUT, recorder(others), 2, 3, 64, 2, 8, 64) == 1
    assert dispatch(x, w, out) is None
    assert calls == [[(2, 64), (8, 64), (2, 8)]] and others == []  # every argument passed on
    assert dispatch(torch.zeros(3, 64), w, out) is None and len(others) == 1
    assert dispatch(torch.zeros(4, 64), w, out) == MISS  # M=4 was never put
    assert dispatch(x, torch.zeros(8, 72), out) == MISS  # nor K=72
    assert dispatch(x.view(1, 2, 64), w, out) == MISS  # rank is part of the key
    assert dispatch(None, w, out) == MISS and dispatch("x", w, out) == MISS
    assert dispatch(SIZE) == 2
    assert dispatch(CLEAR) == 0 and dispatch(SIZE) == 0 and dispatch(x, w, out) == MISS
    assert len(calls) == 1


def test_a_put_replaces_the_kernel_of_its_shapes_and_none_is_a_key_of_its_own(table):
    _, dispatch = table
    first, second, optional = [], [], []
    dispatch(PUT, recorder(first), 2, 2, 64, 2, 8, 64)
    dispatch(PUT, recorder(second), 2, 2, 64, 2, 8, 64)
    dispatch(PUT, recorder(optional), -1, 2, 8, 64)  # first input None
    x, w, out = torch.zeros(2, 64), torch.zeros(8, 64), torch.zeros(2, 8)
    assert dispatch(x, w, out) is None and (first, len(second)) == ([], 1)
    assert dispatch(None, w, out) is None and len(optional) == 1
    assert dispatch(SIZE) == 2


def test_the_table_refuses_bad_control_calls_and_passes_kernel_errors_on(table):
    _, dispatch = table
    with pytest.raises(TypeError, match="TVM-FFI function"):
        dispatch(PUT, 5, 2, 2, 64)
    with pytest.raises(ValueError, match="control code"):
        dispatch(9)

    def refuses(*args):
        raise ValueError("kernel refused")

    dispatch(PUT, tvm_ffi.convert(refuses), 1, 2, 1, 3)
    with pytest.raises(ValueError, match="kernel refused"):
        dispatch(torch.zeros(2), torch.zeros(3), torch.zeros(1))


def test_the_op_puts_its_resolutions_and_then_calls_through_the_table(
    table, fresh_runtime, fake_gpu
):
    """A call with out= that the table holds never reaches the Python shape lookup."""
    bundle, _ = table
    REGISTRY.add(bundle)
    op = ops.family_op("router_gemm")
    assert op.c_dispatch and op.dispatcher is None
    x = on_gpu(torch.zeros(2, 4096, dtype=torch.bfloat16))
    w = on_gpu(torch.zeros(256, 4096, dtype=torch.bfloat16))
    out = torch.empty(2, 256, device="cuda")
    assert op.call(x, w, out=out) is out  # resolved on the checked path (a stub kernel)
    assert policy.counters()["router_gemm"]["hits"] == 1  # from the bundle, by the policy
    assert op.dispatcher is not None and op.dispatcher(SIZE) == 1
    # What the op put for these shapes is the bundle's kernel (a stub answers its key's number).
    router = family("router_gemm")
    key = router.dispatch(router.parse_problem("2,256,4096"), ARCH).key
    assert op.dispatcher(x, w, out) == stub_value(key.id)
    # A stub answers a number where a real kernel answers None, and the hit path takes only None
    # as served: put a kernel that answers None, as a real one does, for the same shapes.
    calls = []
    op.dispatcher(PUT, recorder(calls), 2, 2, 4096, 2, 256, 4096)
    python_path = dict(op.table)
    op.table.clear()  # the Python hit path now has nothing: only the C table can serve
    assert op.call(x, w, out=out) is out
    assert calls == [[(2, 4096), (256, 4096), (2, 256)]]
    # The checked path would have resolved again (a second bundle hit) and remembered the
    # shapes in the Python table: neither happened.
    assert policy.counters()["router_gemm"]["hits"] == 1 and op.table == {}
    op.table.update(python_path)
    REGISTRY.clear()  # bundles changed: the table goes with every other resolution
    assert op.dispatcher is None and op.table == {}


def test_families_whose_kernels_need_a_bind_wrapper_keep_the_python_path():
    assert not ops.family_op("gemm_sm90").c_dispatch  # bias None becomes another tensor
    assert ops.family_op("router_gemm").c_dispatch


@pytest.mark.gpu
def test_on_the_gpu_the_c_table_serves_the_router_and_matches_the_bare_kernel(fresh_runtime):
    from cute_aot.kernels import family
    from cute_aot.runtime import load_bundles, op
    from cute_aot.runtime.device import current_gpu_arch

    if not BUNDLES:
        pytest.skip("needs CUTE_AOT_BUNDLES with the router's default keys")
    load_bundles(*BUNDLES.split(":"))
    router, arch = family("router_gemm"), current_gpu_arch()
    call, table = op("router_gemm"), ops.family_op("router_gemm")
    for m in (1, 5, 16):
        x = torch.randn(m, 7168, device="cuda").to(torch.bfloat16)
        w = torch.randn(256, 7168, device="cuda").to(torch.bfloat16)
        ours, bare = torch.empty(m, 256, device="cuda"), torch.empty(m, 256, device="cuda")
        call(x, w, out=ours)  # resolves, puts
        call(x, w, out=ours)  # through the C table
        key = router.dispatch(router.parse_problem(f"{m},256,7168"), arch).key
        key_function(key, arch)(x, w, bare)
        torch.cuda.synchronize()
        assert torch.equal(ours, bare)
    assert table.dispatcher is not None and table.dispatcher(SIZE) == 3
