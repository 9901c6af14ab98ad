"""Ops on torch tensors. The hit path: checks, one dict lookup, one TVM-FFI call."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cute_aot.artifacts.errors import InputError
from cute_aot.kernels import router_gemm as router_family
from cute_aot.kernels.router_gemm import ALIGN_BYTES, K_DIVISOR
from cute_aot.runtime.device import device_arch
from cute_aot.runtime.registry import REGISTRY

# (m, k, n, device index) -> TVM-FFI function; filled on the first call of each shape.
_router_functions: dict[tuple[int, int, int, int], Callable] = {}


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


def resolve_router_gemm(m: int, k: int, n: int, device_index: int) -> Callable:
    """Dispatch a problem to its kernel's function (the slow path, once per shape and device)."""
    arch = device_arch(device_index)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(device_index)
        raise InputError(
            f"router_gemm: no bundles are built for compute capability {major}.{minor}"
        )
    key = router_family.dispatch(m, k, n, arch)
    function = REGISTRY.function(router_family.FAMILY, key.id, arch)
    _router_functions[(m, k, n, device_index)] = function
    return function


def router_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out[M, N] (fp32) = x[M, K] (bf16) @ w[N, K]^T (bf16), on the current torch stream."""
    _check_router_inputs(x, w)
    m, k = x.shape
    n = w.shape[0]
    device_index = x.device.index
    function = _router_functions.get((m, k, n, device_index))
    if function is None:
        function = resolve_router_gemm(m, k, n, device_index)
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    else:
        _check_out(out, m, n, x.device)
    function(x, w, out)  # TVM-FFI takes the device from the tensors and the stream from torch
    return out
