"""The GPU facts the runtime needs, asked once per device."""

from __future__ import annotations

import ctypes
import functools

from cute_aot.kernels.arch import arch_for_capability


@functools.cache
def device_arch(index: int) -> str | None:
    """The bundle architecture that runs on CUDA device `index` (None: none we build)."""
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return arch_for_capability(major, minor)


def current_gpu_arch() -> str | None:
    """Architecture of the current CUDA device, or None when there is no GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return device_arch(torch.cuda.current_device())


@functools.cache
def driver_cuda_version() -> tuple[int, int] | None:
    """The CUDA version the installed driver supports, or None without a driver."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return version.value // 1000, (version.value % 1000) // 10
