"""A GPU for CPU tests of the ops: torch answers as a virtual device profile's GPU, and the
tensors a test puts on it (`on_gpu`) are CPU tensors that say they lie on cuda:0.

The op's own validation and resolution (runtime/ops.py: `_check_placement`, `device_arch`, the
fallback policy) run unmodified against it, so a test never patches them out:
- `device_arch(0)` asks torch.cuda.get_device_capability, which answers from the profile
  (kernels/gpu_profiles.json, the virtual device's profiles), so the architecture is the
  profile's, found the way a server finds it;
- an `OnGpu` tensor reports `is_cuda`, `device` cuda:0 and `get_device()` 0 to Python, while its
  storage, strides, dtype and address are the real CPU tensor's: `_check_placement` checks them
  for real, and a plain CPU tensor is still refused as one;
- `torch.*(..., device="cuda")` (the op's output when no `out=` is given) makes an `OnGpu`
  tensor; ops on `OnGpu` tensors give `OnGpu` results; kernels and the torch reference compute
  real values, and TVM-FFI sees the CPU tensor underneath.

Unlike the virtual device (runtime/capture/virtual/, CUTE_AOT_VIRTUAL), which fakes CUDA for a whole
process for good and holds no values, this is undone when the test ends and keeps values, so
tests can assert on what a kernel or the reference computed.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

from cute_aot.kernels import gpu_profiles
from cute_aot.runtime import device
from cute_aot.runtime.capture.virtual.torch_device import DeviceProperties

GPU = 0  # the fake GPU's device index, as OnGpu.get_device() reports it
_CUDA = torch.device("cuda", GPU)


class OnGpu(torch.Tensor):
    """A CPU tensor that says to Python that it lies on cuda:0 (see the module's docstring)."""

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return _CUDA

    def get_device(self) -> int:
        return GPU

    def cpu(self, *args, **kwargs) -> torch.Tensor:  # back to the host: a plain tensor again
        return self.as_subclass(torch.Tensor).clone()


def on_gpu(tensor: torch.Tensor) -> OnGpu:
    """`tensor` (same storage, strides, address) as a tensor of the fake GPU."""
    return tensor.as_subclass(OnGpu)


def _is_cuda(value) -> bool:
    return value is not None and torch.device(value).type == "cuda"


class _MadeOnGpu(TorchFunctionMode):
    """Factories asked for `device="cuda"` make the tensor on the CPU and return it as OnGpu
    (a CPU build of torch has no CUDA allocator to ask). A mode holds for the thread that
    entered it: a test calling an op from other threads passes `out=`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_cuda(kwargs.get("device")):
            return on_gpu(func(*args, **{**kwargs, "device": "cpu"}))
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_gpu_of(profile: str = "h200"):
    """Within: one GPU of `profile` (a name or an architecture of kernels/gpu_profiles.json)."""
    gpu = gpu_profiles.profile(profile)
    properties = DeviceProperties(gpu)
    answers = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: GPU,
        "get_device_capability": lambda index=None: gpu.capability,
        "get_device_name": lambda index=None: gpu.device_name,
        "get_device_properties": lambda index=None: properties,
    }
    with pytest.MonkeyPatch.context() as patched:
        for name, answer in answers.items():
            patched.setattr(torch.cuda, name, answer)
        device.device_arch.cache_clear()  # answers of the real (or another fake) GPU go
        try:
            with _MadeOnGpu():
                yield gpu
        finally:
            device.device_arch.cache_clear()
