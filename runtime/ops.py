"""Ops on torch tensors. The hit path: checks, one dict lookup, one TVM-FFI call."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cute_aot.artifacts.errors import InputError
from cute_aot.kernels import router_gemm as router_family
from cute_aot.kernels.router_gemm import ALIGN_BYTES, K_DIVISOR
from cute_aot.runtime.device import device_arch
from cute_aot.runtime.jit import JitUnavailableError
from cute_aot.runtime.mode import Mode, current_mode
from cute_aot.runtime.notices import warn_once
from cute_aot.runtime.registry import REGISTRY

# (m, k, n, x's device, w's device) -> TVM-FFI function; filled on the first call of a shape.
_router_functions: dict[tuple[int, int, int, int, int], Callable] = {}


def _check_router_inputs(x: torch.Tensor, w: torch.Tensor) -> None:
    pair = (("x", x), ("w", w))
    for name, tensor in pair:
        if not isinstance(tensor, torch.Tensor):
            raise InputError(
                f"router_gemm: {name} must be a torch.Tensor, not {type(tensor).__name__}"
            )
    for name, tensor in pair:
        if tensor.dtype != torch.bfloat16:
            raise InputError(f"router_gemm: {name} must be bfloat16, got {tensor.dtype}")
    for name, tensor in pair:
        if tensor.dim() != 2:
            raise InputError(f"router_gemm: {name} must be 2-D, got shape {tuple(tensor.shape)}")
    if x.shape[1] != w.shape[1]:
        raise InputError(f"router_gemm: x is [M, K={x.shape[1]}] but w is [N, K={w.shape[1]}]")
    if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(f"router_gemm: empty problem x {tuple(x.shape)}, w {tuple(w.shape)}")
    if x.shape[1] % K_DIVISOR:
        raise InputError(f"router_gemm: K={x.shape[1]} must be a multiple of {K_DIVISOR}")
    for name, tensor in pair:
        if not tensor.is_cuda:
            raise InputError(f"router_gemm: {name} must be on a CUDA device, got {tensor.device}")
        if not tensor.is_contiguous():
            raise InputError(f"router_gemm: {name} must be contiguous (row-major)")
        if tensor.data_ptr() % ALIGN_BYTES:
            raise InputError(
                f"router_gemm: {name} must be {ALIGN_BYTES}-byte aligned "
                f"(its address is {tensor.data_ptr() % ALIGN_BYTES} bytes past a boundary)"
            )
    if x.device != w.device:
        raise InputError(f"router_gemm: x is on {x.device} but w is on {w.device}")


def _check_out(out: torch.Tensor, m: int, n: int, device: torch.device) -> None:
    if out.dtype != torch.float32 or tuple(out.shape) != (m, n) or out.device != device:
        raise InputError(
            f"router_gemm: out must be float32 [{m}, {n}] on {device}, got {out.dtype} "
            f"{tuple(out.shape)} on {out.device}"
        )
    if not out.is_contiguous() or out.data_ptr() % ALIGN_BYTES:
        raise InputError("router_gemm: out must be contiguous and 16-byte aligned")


def _torch_router_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
    """Last resort of mode auto when no kernel can be had: same math, cuBLAS speed."""
    torch.mm(x.float(), w.float().t(), out=out)


def resolve_router_gemm(m: int, k: int, n: int, device_index: int) -> Callable:
    """Dispatch a problem to its kernel's function (the slow path, once per shape and device)."""
    arch = device_arch(device_index)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(device_index)
        raise InputError(
            f"router_gemm: no kernels are built for compute capability {major}.{minor}"
        )
    key = router_family.dispatch(m, k, n, arch)
    try:
        function = REGISTRY.resolve(key, arch, {"m": m, "k": k, "n": n})
    except JitUnavailableError as exc:
        if current_mode() is not Mode.AUTO:
            raise
        warn_once(("torch-fallback", key.id, arch), f"{exc}; using torch.mm instead")
        function = _torch_router_gemm
    _router_functions[(m, k, n, device_index, device_index)] = function
    return function


def router_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out[M, N] (fp32) = x[M, K] (bf16) @ w[N, K]^T (bf16), on the current torch stream.

    The hit path is one dict lookup and one TVM-FFI call: the exported function itself checks
    dtypes, shapes, strides, alignment and devices in C against what the kernel was built for.
    Anything unusual (first call of a shape, a refused argument) takes the checked path below,
    which names the problem precisely.
    """
    if torch.compiler.is_compiling():
        # torch.compile sees the custom op (with its fake implementation), not this Python.
        result = torch.ops.cute_aot.router_gemm(x, w)
        return result if out is None else out.copy_(result)
    try:
        m, k = x.shape
        n = w.shape[0]
        function = _router_functions[(m, k, n, x.get_device(), w.get_device())]
        if out is None:
            out = torch.empty((m, n), dtype=torch.float32, device=x.device)
        function(x, w, out)
        return out
    except Exception as exc:  # noqa: BLE001  (re-raised below unless the checked path explains it)
        return _router_gemm_checked(x, w, out, exc)


def _router_gemm_checked(x, w, out, failure: Exception) -> torch.Tensor:
    _check_router_inputs(x, w)
    m, k = x.shape
    n = w.shape[0]
    if out is not None:
        _check_out(out, m, n, x.device)
    if not isinstance(failure, KeyError):
        raise failure  # inputs are fine: a real failure of the kernel call
    function = resolve_router_gemm(m, k, n, x.get_device())
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    function(x, w, out)
    return out


# router_gemm as a torch op, so torch.compile does not trace into the Python above and CUDA graphs
# capture it. Defined with an explicit schema and a Meta kernel (which fake tensors use): unlike
# torch.library.custom_op this costs ~0.2 ms at import instead of pulling in torchgen (~50 ms).
_library = torch.library.Library("cute_aot", "DEF")
_library.define("router_gemm(Tensor x, Tensor w) -> Tensor")
_library.impl("router_gemm", lambda x, w: router_gemm(x, w), "CUDA")
_library.impl(
    "router_gemm",
    lambda x, w: x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32),
    "Meta",
)


def forget_resolutions() -> None:
    """Tests and mode changes: resolve every shape again on its next call."""
    _router_functions.clear()
