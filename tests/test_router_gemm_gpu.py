"""Router GEMM on a real GPU, served from bundles built on a CPU machine.

Run on the device with CUTE_AOT_BUNDLES pointing at the carried bundles (default: ./bundles).
"""

import os

import pytest

torch = pytest.importorskip("torch")

from cute_aot.kernels.router_gemm import DEFAULT_SHAPES, dispatch  # noqa: E402

# Read at import, before the fresh_runtime fixture isolates the environment.
BUNDLES = os.environ.get("CUTE_AOT_BUNDLES", "bundles")

pytestmark = pytest.mark.gpu

# u: unit roundoff of fp32. bf16 x bf16 products are exact in fp32, so the only error is the fp32
# summation of K products, in whatever order a kernel uses: |err| <= gamma_K * sum_k |x_k w_k| with
# gamma_K = K u / (1 - K u) (Higham, Accuracy and Stability, 3.1). A rigorous bound for any order.
U32 = 2.0**-24


def _bundles_loaded():
    from cute_aot.runtime import REGISTRY, load_bundles

    if not REGISTRY.bundles:
        load_bundles(BUNDLES)
    return REGISTRY


def _inputs(m, n, k, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed + m * 7919 + k + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    return x, w


def _check(out, x, w):
    k = x.shape[1]
    ref = x.double() @ w.double().T
    bound = (k * U32 / (1 - k * U32)) * (x.double().abs() @ w.double().abs().T)
    err = (out.double() - ref).abs()
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert torch.isfinite(out).all()
    assert cos.item() >= 0.9999, f"cosine similarity {cos.item()}"
    assert (err <= bound).all(), (
        f"max error {err.max().item()} > bound at {(err > bound).nonzero()[:4]}"
    )
    return err.max().item(), cos.item()


@pytest.mark.parametrize("n, k", DEFAULT_SHAPES)
def test_every_default_key_matches_fp32_reference(n, k):
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    for m in range(1, 17):
        x, w = _inputs(m, n, k)
        out = router_gemm(x, w)
        torch.cuda.synchronize()
        _check(out, x, w)


@pytest.mark.parametrize("m", [1, 4, 5, 16])
def test_other_shapes_in_the_bundle_keys(m):
    """Split-K keys are symbolic in M, K and N: they must be right off the default shapes too."""
    from cute_aot.runtime import router_gemm

    registry = _bundles_loaded()
    arch = registry.bundles[0].arch
    for n, k in [(128, 2880), (264, 7168), (200, 2048)]:
        key = dispatch(m, n, k, arch)
        if key.backend == "dot":
            continue  # dot keys compile K and M in: the default set has none for these K
        x, w = _inputs(m, n, k)
        _check(router_gemm(x, w), x, w)


def test_runs_on_the_current_stream_and_out_argument():
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    x, w = _inputs(8, 256, 7168)
    side = torch.cuda.Stream()
    out = torch.empty(8, 256, device="cuda", dtype=torch.float32)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = router_gemm(x, w, out=out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert result is out
    _check(out, x, w)


@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_cuda_graph_replays_bitwise_identically(m):
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    x, w = _inputs(m, 256, 7168)
    eager = router_gemm(x, w)
    out = torch.empty_like(eager)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        router_gemm(x, w, out=out)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        router_gemm(x, w, out=out)
    replays = []
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        replays.append(out.clone())
    for replay in replays:
        assert torch.equal(replay, eager)
    # the graph reads x at replay time: new inputs, new answer
    x.copy_(_inputs(m, 256, 7168, seed=1)[0])
    graph.replay()
    torch.cuda.synchronize()
    _check(out, x, w)
