"""Hostile inputs to router_gemm on a real GPU: every bad call is refused with an InputError that
names the problem, nothing is launched on memory the kernel was not built for, and a valid call
right after still gives the right answer (no sticky CUDA error).

Each case runs twice: cold (the shape was never called: the checked path refuses it) and warm
(the shape was just called with good tensors, so the call takes the hot path, which relies on the
compiled function's own checks and then re-checks in Python to name the problem).

Run on the device with CUTE_AOT_BUNDLES pointing at bundles built with the default shapes.
"""

import os

import pytest

torch = pytest.importorskip("torch")

from cute_aot.artifacts.core.errors import InputError  # noqa: E402

# Read at import, before the fresh_runtime fixture isolates the environment.
BUNDLES = os.environ.get("CUTE_AOT_BUNDLES", "bundles")

pytestmark = pytest.mark.gpu

# One dot-product key (M, K compiled in) and one split-K key (all sizes symbolic), both in the
# default bundles.
SHAPES = {"dot": (2, 4096, 256), "splitk": (12, 7168, 256)}


def _registry():
    from cute_aot.runtime import REGISTRY, load_bundles

    if not REGISTRY.bundles:
        load_bundles(BUNDLES)
    return REGISTRY


def _good(m, k, n, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed + m + k + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    return x, w


def _misaligned(rows, cols, dtype, offset_elements=1):
    """A contiguous [rows, cols] view starting `offset_elements` past a 16-byte boundary."""
    buffer = torch.randn(rows * cols + offset_elements, device="cuda").to(dtype)
    view = buffer[offset_elements:].view(rows, cols)
    assert view.data_ptr() % 16 and view.is_contiguous()
    return view


def _cases(m, k, n):
    """name -> (make() -> (x, w, out | None), expected error type, message regex)."""
    cuda = "cuda"

    def good():
        return _good(m, k, n)

    def with_x(make_x):
        return lambda: (make_x(), good()[1], None)

    def with_w(make_w):
        return lambda: (good()[0], make_w(), None)

    def with_out(make_out):
        return lambda: (*good(), make_out())

    bf16, fp32 = torch.bfloat16, torch.float32
    return {
        # alignment: 2 bytes past a boundary
        "x misaligned": (
            with_x(lambda: _misaligned(m, k, bf16)),
            InputError,
            "x must be 16-byte aligned.*2 bytes",
        ),
        "w misaligned": (
            with_w(lambda: _misaligned(n, k, bf16)),
            InputError,
            "w must be 16-byte aligned",
        ),
        "out misaligned": (
            with_out(lambda: _misaligned(m, n, fp32)),
            InputError,
            "out must be 16-byte aligned",
        ),
        # layout
        "x transposed": (
            with_x(lambda: torch.randn(k, m, device=cuda).to(bf16).t()),
            InputError,
            "x must be contiguous",
        ),
        "x every other column": (
            with_x(lambda: torch.randn(m, 2 * k, device=cuda).to(bf16)[:, ::2]),
            InputError,
            "x must be contiguous",
        ),
        "x padded rows": (
            with_x(lambda: torch.randn(m, k + 8, device=cuda).to(bf16)[:, :k]),
            InputError,
            "x must be contiguous",
        ),
        "w transposed": (
            with_w(lambda: torch.randn(k, n, device=cuda).to(bf16).t()),
            InputError,
            "w must be contiguous",
        ),
        "out transposed": (
            with_out(lambda: torch.empty(n, m, device=cuda).t()),
            InputError,
            "out must be contiguous",
        ),
        # dtype
        "x float16": (
            with_x(lambda: good()[0].half()),
            InputError,
            "x must be bfloat16, got float16",
        ),
        "x float32": (
            with_x(lambda: good()[0].float()),
            InputError,
            "x must be bfloat16, got float32",
        ),
        "w float16": (
            with_w(lambda: good()[1].half()),
            InputError,
            "w must be bfloat16, got float16",
        ),
        "w float32": (
            with_w(lambda: good()[1].float()),
            InputError,
            "w must be bfloat16, got float32",
        ),
        "out float16": (
            with_out(lambda: torch.empty(m, n, device=cuda, dtype=torch.float16)),
            InputError,
            "out must be float32",
        ),
        "out bfloat16": (
            with_out(lambda: torch.empty(m, n, device=cuda, dtype=bf16)),
            InputError,
            "out must be float32",
        ),
        # shape
        "M = 0": (lambda: (*_good(0, k, n), None), InputError, "empty problem"),
        "N = 0": (
            lambda: (_good(m, k, n)[0], torch.empty(0, k, device=cuda, dtype=bf16), None),
            InputError,
            "empty problem",
        ),
        "K = 0": (
            lambda: (
                torch.empty(m, 0, device=cuda, dtype=bf16),
                torch.empty(n, 0, device=cuda, dtype=bf16),
                None,
            ),
            InputError,
            "empty problem",
        ),
        "K mismatch": (
            with_w(lambda: _good(m, k + 8, n)[1]),
            InputError,
            rf"x is \[M, K={k}\] but w is \[N, K={k + 8}\]",
        ),
        "K not a multiple of 8": (lambda: (*_good(m, k + 4, n), None), InputError, "multiple of 8"),
        "x 3-D": (with_x(lambda: good()[0].unsqueeze(0)), InputError, "x must be 2-D"),
        "w 1-D": (with_w(lambda: good()[1].flatten()), InputError, "w must be 2-D"),
        "out wrong shape": (
            with_out(lambda: torch.empty(m, n + 1, device=cuda)),
            InputError,
            rf"out must be float32 \[{m}, {n}\]",
        ),
        "out transposed shape": (
            with_out(lambda: torch.empty(n, m, device=cuda)),
            InputError,
            rf"out must be float32 \[{m}, {n}\]",
        ),
        # device
        "x on the CPU": (
            with_x(lambda: good()[0].cpu()),
            InputError,
            "x must be on a CUDA device, got cpu",
        ),
        "w on the CPU": (
            with_w(lambda: good()[1].cpu()),
            InputError,
            "w must be on a CUDA device, got cpu",
        ),
        "out on the CPU": (
            with_out(lambda: torch.empty(m, n)),
            InputError,
            "out must be float32 .* on cuda:0, got .* on cpu",
        ),
        "not a tensor": (
            lambda: (good()[0].tolist(), good()[1], None),
            InputError,
            "x must be a torch.Tensor",
        ),
    }


CASE_NAMES = list(_cases(*SHAPES["dot"]))


def _reference_check(out, x, w):
    ref = x.double() @ w.double().T
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert torch.isfinite(out).all()
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0)
    assert cos.item() >= 0.9999


def _valid_call_still_works(m, k, n):
    from cute_aot.runtime import router_gemm

    x, w = _good(m, k, n, seed=7)
    out = router_gemm(x, w)
    torch.cuda.synchronize()  # raises if an earlier call left a sticky error
    _reference_check(out, x, w)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("backend", list(SHAPES))
@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_is_refused_and_the_gpu_stays_usable(case, backend, warm):
    from cute_aot.runtime import forget_resolutions, router_gemm

    _registry()
    m, k, n = SHAPES[backend]
    make, error, message = _cases(m, k, n)[case]
    forget_resolutions()
    if warm:
        _valid_call_still_works(m, k, n)  # this shape now takes the hot path
    x, w, out = make()
    torch.cuda.synchronize()
    with pytest.raises(error, match=message) as info:
        router_gemm(x, w, out=out)
    assert isinstance(info.value, ValueError)
    torch.cuda.synchronize()
    _valid_call_still_works(m, k, n)


def test_bad_out_is_not_written():
    """A refused call leaves a caller's buffer as it was."""
    from cute_aot.runtime import router_gemm

    _registry()
    m, k, n = SHAPES["splitk"]
    x, w = _good(m, k, n)
    out = torch.full((m, n + 1), 7.0, device="cuda")
    with pytest.raises(InputError):
        router_gemm(x, w, out=out)
    torch.cuda.synchronize()
    assert (out == 7.0).all()


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_tensors_on_two_gpus_are_refused():
    from cute_aot.runtime import router_gemm

    _registry()
    m, k, n = SHAPES["dot"]
    x, w = _good(m, k, n)
    with pytest.raises(InputError, match=r"different devices \(x is on cuda:0, w is on cuda:1\)"):
        router_gemm(x, w.to("cuda:1"))
    _valid_call_still_works(m, k, n)


def test_more_tokens_than_any_kernel_serves(fresh_runtime):
    """M = 17: mode aot refuses it by name (an UnsupportedProblemError, also a ValueError); mode
    auto serves the torch reference, saying so once."""
    import warnings

    from cute_aot.artifacts.core.errors import UnsupportedProblemError
    from cute_aot.runtime import router_gemm, set_mode

    _registry()
    x, w = _good(17, 7168, 256)
    set_mode("aot")
    with pytest.raises(UnsupportedProblemError, match="1..16 tokens, got M=17"):
        router_gemm(x, w)
    set_mode("auto")
    with pytest.warns(RuntimeWarning, match="runs its torch reference"):
        out = router_gemm(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = router_gemm(x, w)
    torch.cuda.synchronize()
    _reference_check(out, x, w)
    assert torch.equal(out, again)
