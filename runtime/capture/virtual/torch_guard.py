"""c10's view of the virtual GPU: a CUDA device guard and an accelerator that says "CUDA".

torch's C++ side asks for CUDA in two places a Python dispatch mode never sees:
- the device guard registry (`c10::impl::device_guard_impl_registry`, one implementation per
  device type): the Python bindings of Tensor methods (`.contiguous()`, indexing, `copy_`) and
  the autograd engine (gradient edges, input buffers, one worker thread per device) take a guard
  of the tensor's device before anything dispatches. A CPU build has none for CUDA ("not linked
  with support for cuda devices"); a CUDA build's asks the driver (cudaErrorInsufficientDriver).
- `at::accelerator::getAccelerator`, which turns an integer device (`device=0`, `.to(0)`,
  `torch.device(0)`) into a device type and gives autograd the current stream: on a CPU build it
  finds none ("Cannot access accelerator device when none is available").

Here the CUDA slot of the registry gets torch's own device guard for Python backends
(`torch._C._acc.DeviceGuard`: device 0, default streams, events of nothing), and the CUDA hooks
object says CUDA is built, available and has a context. Both are reached through symbols torch
exports (`c10::impl::device_guard_impl_registry` in libc10, `at::detail::getCUDAHooks` in
libtorch_cpu) with ctypes. The answers that must say "CUDA" or "yes" (the guard's `type()`, the
hooks' `isBuilt`, `isAvailable`, `hasPrimaryContext`) are one native function of two
instructions that returns 1 (c10::DeviceType::CUDA is 1, and so is true), and the guard's
`getStreamNativeHandle` (TVM-FFI's DLPack exchange asks it) one that returns 0, the default
stream; each is put in the object's copy of its vtable. Nothing calls back into Python, so the
answers hold on every thread and after the interpreter has finalized (C++ destructors ask too).
Nothing happens in a process that is not a virtual GPU: this module is imported only by
`torch_device.start`.

Why not the alternatives: torch's FakeTensorMode and meta tensors stop at dispatch, after these
guards were taken; a PrivateUse1 backend is another device type (records would say so, and
integer devices would map to it); a C++ extension needs a compiler and torch's headers on the
release machine and one build per torch version.
"""

from __future__ import annotations

import ctypes
import mmap
import os

# c10::DeviceType values (c10/core/DeviceType.h; stable since they are serialized)
_CUDA, _PRIVATE_USE_1 = 1, 20
# Virtual functions by their index in a vtable's function entries: DeviceGuardImplInterface
# declares type() first; AcceleratorHooksInterface its destructor (two entries), then isBuilt,
# isAvailable, hasPrimaryContext (c10/core/impl/DeviceGuardImplInterface.h,
# ATen/detail/AcceleratorHooksInterface.h, the same in torch 2.9-2.14).
_GUARD_TYPE = 0
_GUARD_STREAM_HANDLE = 10  # getStreamNativeHandle: what TVM-FFI asks to launch on the stream
_HOOKS_YES = (2, 3, 4)
_VTABLE_WORDS = 256  # generous: every vtable concerned is shorter
_WORD = ctypes.sizeof(ctypes.c_void_p)
# `return 1` and `return 0`, by machine: mov eax, 1; ret | xor eax, eax; ret on x86_64,
# mov w0, #1; ret | mov x0, #0; ret on aarch64
_CODE = {
    "x86_64": (bytes.fromhex("b801000000c3"), bytes.fromhex("31c0c3")),
    "aarch64": (bytes.fromhex("20008052c0035fd6"), bytes.fromhex("000080d2c0035fd6")),
}
_kept: list = []  # the guard's Python object lives as long as the process


class GuardUnavailable(RuntimeError):
    """This torch or machine does not offer what the guard is installed through."""


def install() -> None:
    """Make CUDA a device c10 can guard and an accelerator torch finds, in this process."""
    import torch

    libs = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        c10 = ctypes.CDLL(os.path.join(libs, "libc10.so"))
        aten = ctypes.CDLL(os.path.join(libs, "libtorch_cpu.so"))
        registry = (ctypes.c_void_p * 32).in_dll(c10, "_ZN3c104impl26device_guard_impl_registryE")
        cuda_hooks = aten._ZN2at6detail12getCUDAHooksEv
        guard_class = torch._C._acc.DeviceGuard
    except (OSError, ValueError, AttributeError) as exc:
        raise GuardUnavailable(f"torch {torch.__version__}: {exc}") from exc
    one, zero = _native_answers()
    cuda_hooks.restype = ctypes.c_void_p
    _answer(cuda_hooks(), {index: one for index in _HOOKS_YES})
    guard = _register_guard(torch, guard_class, registry)
    _answer(guard, {_GUARD_TYPE: one, _GUARD_STREAM_HANDLE: zero})  # the default stream: 0
    if torch.device(0).type != "cuda":
        raise GuardUnavailable(f"torch {torch.__version__}: device 0 is {torch.device(0)}")


def _register_guard(torch, guard_class, registry) -> int:
    """torch's Python-backend guard, moved from the PrivateUse1 slot (the only one torch
    registers it for) to CUDA's; returns the C++ object's address."""

    class VirtualCudaGuard(guard_class):
        def type_(self):
            return torch._C._autograd.DeviceType.CUDA

    guard = VirtualCudaGuard()
    before = registry[_PRIVATE_USE_1]
    torch._C._acc.register_python_privateuseone_device_guard(guard)
    address = registry[_PRIVATE_USE_1]
    registry[_CUDA], registry[_PRIVATE_USE_1] = address, before
    _kept.append(guard)
    return address


def _native_answers() -> tuple[int, int]:
    """The addresses of native functions that return 1 and 0, in a page of their own."""
    import platform

    codes = _CODE.get(platform.machine().lower().replace("arm64", "aarch64"))
    if codes is None:
        raise GuardUnavailable(f"no native answer written for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    read, write, execute, private, anonymous = 1, 2, 4, 0x02, 0x20
    page = libc.mmap(None, mmap.PAGESIZE, read | write, private | anonymous, -1, 0)
    if page in (None, ctypes.c_void_p(-1).value):
        raise GuardUnavailable(f"mmap: {os.strerror(ctypes.get_errno())}")
    one, zero = codes
    ctypes.memmove(page, one, len(one))
    ctypes.memmove(page + 16, zero, len(zero))
    if libc.mprotect(page, mmap.PAGESIZE, read | execute) != 0:
        raise GuardUnavailable(f"mprotect: {os.strerror(ctypes.get_errno())}")
    return page, page + 16


def _answer(instance: int, entries: dict[int, int]) -> None:
    """Point `instance` at a copy of its vtable whose function entries `entries` replace."""
    vtable_pointer = ctypes.c_void_p.from_address(instance)
    start = vtable_pointer.value - 2 * _WORD  # offset-to-top and RTTI precede the functions
    # Memory Python never frees: C++ destructors read the vtable after the interpreter is gone.
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    copy = libc.malloc(_VTABLE_WORDS * _WORD)
    if not copy:
        raise GuardUnavailable("malloc: out of memory")
    ctypes.memmove(copy, start, _VTABLE_WORDS * _WORD)
    table = (ctypes.c_void_p * _VTABLE_WORDS).from_address(copy)
    for index, function in entries.items():
        table[2 + index] = function
    vtable_pointer.value = copy + 2 * _WORD
