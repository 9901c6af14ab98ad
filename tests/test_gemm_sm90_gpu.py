"""The Hopper GEMM families on an H200, served from bundles built on a CPU machine.

Run on the device with CUTE_AOT_BUNDLES pointing at bundles that hold the gemm families, built
with `aot-build --arch sm90a --all-tactics` (default: ./bundles). Every tactic found there is
checked, not only the ones the dispatch table picks.

Error bound. bf16 x bf16 and e4m3 x e4m3 products are exact in fp32, so the accumulator's error
is the summation's: |acc - exact| <= gamma_K * sum_k |x_k w_k| with gamma_K = K u / (1 - K u)
(Higham, Accuracy and Stability, 3.1), for any order. u = 2^-24 for bf16 wgmma (fp32
accumulators). Hopper's fp8 wgmma keeps fewer accumulator bits (about 14, DeepSeek-V3 report
3.3.2), so fp8 uses u = 2^-13. A promoted fp8 kernel (kernel.py) sums each 128-long K chunk in
the tensor cores and the chunks in fp32: gamma_128(2^-13) * S + gamma_(K/128)(2^-24) * S. The
epilogue adds bias in fp32 and rounds once to bf16 (u = 2^-8):
|out - exact| <= E + 2^-8 * (|exact| + E), scaled by the per-tensor scales.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from cute_aot.kernels.gemm_sm90 import (  # noqa: E402
    BF16_DTYPE,
    FP8_DTYPE,
    TILE_K,
    GemmProblem,
    family,
    fp8_family,
)
from cute_aot.runtime.resolution import key_function  # noqa: E402

# Read at import, before the fresh_runtime fixture isolates the environment.
BUNDLES = os.environ.get("CUTE_AOT_BUNDLES", "bundles")

pytestmark = pytest.mark.gpu

ARCH = "sm_90a"
ACC_UNIT = {BF16_DTYPE: 2.0**-24, FP8_DTYPE: 2.0**-13}
BF16_UNIT = 2.0**-8
FAMILIES = {BF16_DTYPE: family, FP8_DTYPE: fp8_family}

# Shapes off every tile: M not a multiple of 64 or 128, N not of 64/128/256 (N = 1001: not of 8,
# the any-N epilogue), K not of 64/128. Bundles for these tests hold the keys of N = 1001.
SWEEP_M = (1, 7, 64, 65, 100, 127, 129, 300, 511, 1000, 2049, 4097, 8192)
SWEEP_NK = (
    (4096, 4096),
    (1000, 4096),
    (1001, 4096),
    (6144, 4112),
    (3000, 1008),
    (136, 80),
    (24, 16),
)


def _registry():
    from cute_aot.runtime import REGISTRY, load_bundles

    if not REGISTRY.bundles:
        load_bundles(BUNDLES)
    return REGISTRY


def _inputs(dtype: str, m: int, n: int, k: int, bias: bool, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed + 7919 * m + 31 * n + k)
    x = torch.randn(m, k, device="cuda", generator=gen)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
    b = (torch.randn(n, device="cuda", generator=gen) * 0.5).bfloat16() if bias else None
    if dtype == BF16_DTYPE:
        return (x.bfloat16(), w.bfloat16(), b)
    x8, w8 = (x * 8).to(torch.float8_e4m3fn), (w * 64).to(torch.float8_e4m3fn)
    scales = torch.tensor([0.125], device="cuda"), torch.tensor([1 / 64], device="cuda")
    return (x8, w8, *scales, b)


def _gamma(n: int, unit: float) -> float:
    return n * unit / (1 - n * unit)


def _check(dtype: str, out, inputs, promoted: bool = False):
    x, w, *rest = inputs
    bias = rest[-1]
    scale = rest[0].double() * rest[1].double() if dtype == FP8_DTYPE else 1.0
    k = x.shape[1]
    exact = (x.double() @ w.double().T) * scale
    magnitude = (x.double().abs() @ w.double().abs().T) * abs(scale)
    if bias is not None:
        exact = exact + bias.double()
    if promoted:  # promoted once per k-tile
        chunk = TILE_K[FP8_DTYPE]
        gamma = _gamma(chunk, ACC_UNIT[FP8_DTYPE]) + _gamma(-(-k // chunk), ACC_UNIT[BF16_DTYPE])
    else:
        gamma = _gamma(k, ACC_UNIT[dtype])
    bound = gamma * magnitude + BF16_UNIT * (exact.abs() + gamma * magnitude) + 1e-30
    assert out.dtype == torch.bfloat16 and out.shape == exact.shape
    assert torch.isfinite(out).all(), "non-finite output"
    err = (out.double() - exact).abs()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, (
        f"{bad.shape[0]} of {err.numel()} outside the bound, first at {bad[:4].tolist()}: "
        f"max err {err.max().item():.3g}"
    )
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), exact.flatten(), dim=0)
    assert cos.item() > 0.9999, f"cosine similarity {cos.item()}"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", [BF16_DTYPE, FP8_DTYPE])
@pytest.mark.parametrize("n, k", SWEEP_NK)
def test_sweep_through_the_op_matches_the_exact_product(dtype, n, k, bias):
    from cute_aot.runtime import op
    from cute_aot.runtime.policy import counters

    _registry()
    name = FAMILIES[dtype].name
    gemm = op(name)
    before = dict(counters().get(name, {}))
    for m in SWEEP_M:
        inputs = _inputs(dtype, m, n, k, bias)
        out = gemm(*inputs)
        torch.cuda.synchronize()
        _check(dtype, out, inputs)
    after = counters().get(name, {})
    # Every call ran a kernel of the bundles: none fell back to the torch reference (which
    # would pass the check without testing a kernel) or was compiled on the spot.
    for counted in ("misses", "degradations"):
        assert after.get(counted, 0) == before.get(counted, 0), (counted, before, after)


def _bundle_keys(family_name: str):
    key_class = FAMILIES[BF16_DTYPE if family_name == family.name else FP8_DTYPE].Key
    keys = {
        key_class.from_fields(entry.key)
        for bundle in _registry().bundles
        for entry in bundle.manifest.entries
        if entry.family == family_name
    }
    return sorted(keys, key=lambda key: key.canonical_json())


@pytest.mark.parametrize("dtype", [BF16_DTYPE, FP8_DTYPE])
def test_every_tactic_in_the_bundle_is_right_off_its_tiles(dtype):
    """Tuning picks among every built tactic, so each must be right, not only the table's."""
    _registry()
    keys = _bundle_keys(FAMILIES[dtype].name)
    assert keys, "no gemm keys in the bundles"
    for key in keys:
        function = key_function(key, ARCH, {})
        problems = [(1, 24, 16), (129, 1000, 1008), (300, 6144, 4112)]
        if key.persistent:  # several tiles per CTA (ping-pong: per warpgroup), edges off-tile
            problems.append((2049, 4104, 1008))
        for m, n, k in problems:
            inputs = _inputs(dtype, m, n, k, key.has_bias)
            problem = GemmProblem(m, n, k, dtype, key.has_bias)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            FAMILIES[dtype].bind(function, problem)(*inputs, out)
            torch.cuda.synchronize()
            try:
                _check(dtype, out, inputs, promoted=key.promote)
            except AssertionError as exc:
                raise AssertionError(f"{key.describe()} at M={m} N={n} K={k}: {exc}") from None
            if key.split_k > 1:  # the partials are summed in rank order: no run-to-run change
                again = torch.full_like(out, float("nan"))
                FAMILIES[dtype].bind(function, problem)(*inputs, again)
                torch.cuda.synchronize()
                assert torch.equal(again, out), f"{key.describe()}: split-K is not deterministic"


def test_fp8_promotion_keeps_long_k_within_the_fp32_chunk_bound():
    """K = 28672 (Llama-3-70B's down projection): every promoted fp8 tactic in the bundles stays
    within the chunked bound (the fast-accumulation bound is vacuous here: K * 2^-13 > 1)."""
    _registry()
    promoted = [key for key in _bundle_keys(fp8_family.name) if key.promote and key.has_bias]
    if not promoted:
        pytest.skip("no promoted fp8 keys in the bundles (build them from this checkout)")
    m, n, k = 256, 1024, 28672
    inputs = _inputs(FP8_DTYPE, m, n, k, True)
    problem = GemmProblem(m, n, k, FP8_DTYPE, True)
    for key in promoted:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        fp8_family.bind(key_function(key, ARCH, {}), problem)(*inputs, out)
        torch.cuda.synchronize()
        try:
            _check(FP8_DTYPE, out, inputs, promoted=True)
        except AssertionError as exc:
            raise AssertionError(f"{key.describe()} at K={k}: {exc}") from None


@pytest.mark.parametrize("dtype", [BF16_DTYPE, FP8_DTYPE])
def test_a_kernel_without_bias_never_reads_it(dtype):
    _registry()
    m, n, k = 129, 1000, 1008
    problem = GemmProblem(m, n, k, dtype, False)
    function = key_function(FAMILIES[dtype].dispatch(problem, ARCH).key, ARCH, {})
    *inputs, _ = _inputs(dtype, m, n, k, False)
    nan_bias = torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    function(*inputs, nan_bias, out)
    torch.cuda.synchronize()
    _check(dtype, out, (*inputs, None))


def test_fp8_scales_are_read_on_the_device_so_graph_replays_take_new_ones():
    from cute_aot.runtime import op

    _registry()
    gemm = op(fp8_family.name)
    x, w, x_scale, w_scale, bias = _inputs(FP8_DTYPE, 64, 4096, 4096, True)
    out = torch.empty(64, 4096, device="cuda", dtype=torch.bfloat16)
    gemm(x, w, x_scale, w_scale, bias, out=out)  # resolve before capturing
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        gemm(x, w, x_scale, w_scale, bias, out=out)
    for new_scale in (0.125, 0.5, 3.0):
        x_scale.fill_(new_scale)
        graph.replay()
        torch.cuda.synchronize()
        _check(FP8_DTYPE, out, (x, w, x_scale, w_scale, bias))


@pytest.mark.parametrize("dtype", [BF16_DTYPE, FP8_DTYPE])
def test_graph_replay_is_bitwise_equal_to_eager(dtype):
    from cute_aot.runtime import op

    _registry()
    gemm = op(FAMILIES[dtype].name)
    inputs = _inputs(dtype, 100, 6144, 4112, True)
    eager = gemm(*inputs)
    out = torch.empty_like(eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        gemm(*inputs, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_dependent_launches_back_to_back_wait_for_their_producer():
    """PDL: each kernel may start before the previous one ends, so it must wait for it before
    reading x or writing out. A ping-pong chain in one graph (each call reads what the last
    wrote and overwrites what the one before read) equals the same chain with a sync per call."""
    from cute_aot.runtime import op

    _registry()
    gemm = op(family.name)
    n = 2048
    gen = torch.Generator(device="cuda").manual_seed(5)
    w = (torch.randn(n, n, device="cuda", generator=gen) / n**0.5).bfloat16()
    start = torch.randn(256, n, device="cuda", generator=gen).bfloat16()

    def chain(a, b, sync):
        for _ in range(8):
            gemm(a, w, None, out=b)
            if sync:
                torch.cuda.synchronize()
            gemm(b, w, None, out=a)
            if sync:
                torch.cuda.synchronize()
        return a

    expected = chain(start.clone(), torch.empty_like(start), sync=True).clone()
    a, b = start.clone(), torch.empty_like(start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        chain(a, b, sync=False)
    for _ in range(3):
        a.copy_(start)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a, expected)
