"""Ops on torch tensors, one per installed kernel family, made from its contract.

    from cute_aot.runtime import op
    gemm = op(FAMILY)                  # or `from cute_aot.runtime import <family name>`
    out = gemm(x, w)                   # arguments in the family's ABI order; or out=out

The hit path of a call with `out=` is one TVM-FFI call into the C table of the bundle library
(artifacts/shape_dispatch.c), which finds the kernel of the input shapes and calls it; otherwise one
dict lookup on the input shapes, then the kernel. The exported kernel checks dtypes, shapes,
strides, alignment in C against what it was built for. Anything unusual (the
first call of a shape, a refused argument, a kernel failure) takes the checked path, which
validates the call against the family's ABI and names the problem precisely, then resolves:
bundle -> overlay -> JIT -> torch reference (mode auto; the one policy is runtime/policy.py).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cute_aot.artifacts.core.errors import InputError, UnsupportedProblemError
from cute_aot.kernels import Adapter, KernelFamily, TorchReference, capability, family, registered
from cute_aot.kernels.contract import TensorArg, dispatch_with
from cute_aot.runtime import epoch, resolution
from cute_aot.runtime.device import device_arch
from cute_aot.runtime.registry import REGISTRY


class FamilyOp:
    """A family's op: `op(*inputs, out=None)`, in the order and names of the family's ABI."""

    def __init__(self, kernel_family: KernelFamily):
        self.family = kernel_family
        self.inputs: tuple[TensorArg, ...] = kernel_family.inputs
        self.output: TensorArg = kernel_family.output
        self.out_dtype = getattr(torch, self.output.dtype)
        # mode auto's last step; without one, a miss that cannot be compiled raises
        self.torch_reference = capability(kernel_family, TorchReference)
        # What the hit path reads, as one snapshot swapped whole (never two reads that could
        # disagree): (input shapes -> (function, output shape), the C table or None, the epoch
        # they were filled in). A snapshot of an older epoch is ignored, so every load, clear
        # and mode change re-resolves without anyone telling the op (runtime/epoch.py).
        # Kernels are resolved per architecture, and where every GPU has one architecture a
        # function serves every device (the exported function refuses tensors on another device
        # than the first's, or on the CPU, and the checked path then says why). A process with
        # GPUs of several architectures keeps its resolutions per device instead (the `device`
        # tables), so each call there takes the checked path.
        self.state: list[tuple[dict, Callable | None, int]] = [({}, None, -1)]
        self._device_state: tuple[dict, int] = ({}, -1)
        self._per_device: bool | None = None  # decided at the first call: CUDA is in use then
        self._lock = threading.Lock()
        # The C hit path (artifacts/shape_dispatch.c, in bundle libraries): a call with `out=` whose
        # input shapes it holds is one TVM-FFI call, no Python shape reads. Only for families
        # whose kernels take the op's arguments as they are (no `bind` wrapper) and whose
        # shapes fit its keys.
        self.c_dispatch = type(kernel_family).bind is KernelFamily.bind
        self.call = _hit_path(self)
        _define_torch_op(self)

    @property
    def table(self) -> dict:
        """The hit path's shape table of the current epoch."""
        table, _, seen = self.state[0]
        return table if seen == epoch.current() else {}

    @property
    def dispatcher(self) -> Callable | None:
        """The C table of the current epoch, if any."""
        _, dispatcher, seen = self.state[0]
        return dispatcher if seen == epoch.current() else None

    @property
    def device_table(self) -> dict:
        """The per-device resolutions of the current epoch (GPUs of several architectures)."""
        table, seen = self._device_state
        return table if seen == epoch.current() else {}

    # -- checked path ----------------------------------------------------------------------------
    def failed(self, inputs: tuple, out, failure: Exception):
        """A call of a remembered kernel raised: name the caller's mistake if there is one, else
        raise the kernel's own failure. The kernel is never called a second time (it may have
        updated state in place)."""
        self.check(inputs, out)
        raise failure

    def checked(self, inputs: tuple, out):
        """The first call of these shapes in this epoch: validate, resolve, remember, call."""
        problem = self.check(inputs, out)
        device = inputs[0].get_device()
        shapes = [None if t is None else t.shape for t in inputs]
        entry = None
        if self.per_device:
            entry = self.device_table.get((*shapes, device))
        if entry is None:
            entry = self.resolve_and_remember(problem, shapes, device)
        function, out_shape = entry
        if out is None:
            out = torch.empty(out_shape, dtype=self.out_dtype, device=inputs[0].device)
        function(*inputs, out)
        return out

    def resolve_and_remember(self, problem, shapes, device: int):
        """Resolve in one epoch: if a load, clear or mode change happened meanwhile, resolve
        again under it (once; a second move serves this call and remembers nothing)."""
        for _ in range(2):
            started = epoch.current()
            entry, source = self.resolution(problem, device)
            if source != "bundle" and REGISTRY.env_pending():
                break  # a bundle source is unreadable for now: ask again at the next call
            if self.remember(shapes, device, entry, started):
                break
        return entry

    def check(self, inputs: Sequence, out=None):
        """The call against the ABI; returns the family's problem. InputError says what is wrong.

        Order: what each tensor is (type, dtype, rank), then the family's own reading of the
        problem (shapes that must agree), then where and how the data lies (device, layout,
        alignment), so the first message names the most basic mistake.
        """
        name = self.family.name
        if len(inputs) != len(self.inputs):
            expected = ", ".join(arg.name for arg in self.inputs)
            raise InputError(f"{name} takes ({expected}), got {len(inputs)} tensors")
        pairs = [
            (arg, tensor)
            for arg, tensor in zip(self.inputs, inputs, strict=True)
            if tensor is not None or not arg.optional
        ]
        for arg, tensor in pairs:
            _check_kind(name, arg, tensor)
        problem = self.family.problem(*inputs)
        for arg, tensor in pairs:
            _check_placement(name, arg, tensor)
        if len({tensor.device for _, tensor in pairs}) > 1:
            where = ", ".join(f"{arg.name} is on {tensor.device}" for arg, tensor in pairs)
            raise InputError(f"{name}: tensors on different devices ({where})")
        if out is not None:
            _check_kind(name, self.output, out)
            shape = tuple(self.family.output_shape(problem))
            if tuple(out.shape) != shape or out.device != inputs[0].device:
                raise InputError(
                    f"{name}: out must be {self.output.dtype} {list(shape)} on "
                    f"{inputs[0].device}, got {out.dtype} {list(out.shape)} on {out.device}"
                )
            _check_placement(name, self.output, out)
        return problem

    def resolve(self, problem, device: int) -> tuple[Callable, tuple[int, ...]]:
        """The function serving `problem` on CUDA device `device`, and its output shape."""
        return self.resolution(problem, device)[0]

    def resolution(self, problem, device: int) -> tuple[tuple[Callable, tuple[int, ...]], str]:
        """((function, output shape), its source) for `problem` on CUDA device `device`, by
        the fallback policy (runtime/policy.py)."""
        family_name = self.family.name
        arch = device_arch(device)
        if arch is None:
            major, minor = torch.cuda.get_device_capability(device)
            raise InputError(
                f"{family_name}: no kernels are built for compute capability {major}.{minor}"
            )
        self.family.check_arch(arch)

        def find_key():
            table = REGISTRY.table(family_name, arch)  # the serving bundle's, or the package's
            return dispatch_with(self.family, problem, arch, table).key

        resolved = resolution.resolve(
            family_name,
            arch,
            find_key,
            lambda: self.family.describe_problem(problem),
            self.reference_function if self.torch_reference is not None else None,
        )
        function = resolved.function
        if resolved.source != "reference":
            function = self.family.bind(function, problem)
        return (function, tuple(self.family.output_shape(problem))), resolved.source

    def preload(self, problem, device: int) -> None:
        """Resolve `problem` on `device` now and remember it for the hit path (warm-up)."""
        shapes = [
            None if shape is None else torch.Size(shape)
            for shape in self.family.input_shapes(problem)
        ]
        self.resolve_and_remember(problem, shapes, device)

    @property
    def per_device(self) -> bool:
        """Whether this process sees GPUs of several architectures (asked once CUDA is in use:
        asking at import would initialize CUDA before a server forks its workers)."""
        if self._per_device is None:
            self._per_device = len(_visible_archs()) > 1
        return self._per_device

    def remember(self, shapes, device: int, entry, computed_in: int) -> bool:
        """Keep `entry` for the hit path if the epoch it was computed in is still the current
        one (False: it moved, nothing is kept)."""
        with self._lock:
            if computed_in != epoch.current():
                return False
            if self.per_device:
                table, seen = self._device_state
                if seen != computed_in:
                    table = {}
                    self._device_state = (table, computed_in)
                table[(*shapes, device)] = entry
                return True
            table, dispatcher, seen = self.state[0]
            if seen != computed_in:
                table, dispatcher = {}, self._new_dispatcher(device)
            table = {**table, tuple(shapes): entry}  # a new dict: readers never see one change
            dims = [
                d for shape in shapes for d in ((-1,) if shape is None else (len(shape), *shape))
            ]
            if dispatcher is not None and len(dims) <= C_TABLE_MAX_DIMS:
                if _is_tvm_ffi_function(entry[0]):
                    dispatcher(_PUT, entry[0], *dims)
            self.state[0] = (table, dispatcher, computed_in)
            return True

    def _new_dispatcher(self, device: int) -> Callable | None:
        """A C table from the first loaded bundle of this GPU's architecture that links one."""
        if not self.c_dispatch:
            return None
        arch = device_arch(device)
        for bundle in REGISTRY.bundles:
            if bundle.arch == arch and (dispatcher := bundle.shape_dispatcher(len(self.inputs))):
                return dispatcher
        return None

    def reference_function(self) -> Callable:
        """The torch fallback, which checks its inputs on every call (no C checks guard it)."""

        def reference(*inputs_and_out):
            *inputs, out = inputs_and_out
            self.check(inputs, out)
            out.copy_(self.torch_reference.reference(*inputs))

        return reference


def _is_tvm_ffi_function(function) -> bool:
    """A kernel the C table can call (not the torch fallback, nor a JIT-compiled object)."""
    return type(function).__module__.startswith("tvm_ffi") and type(function).__name__ == "Function"


def _visible_archs() -> set[str | None]:
    return {device_arch(index) for index in range(torch.cuda.device_count())}


def _check_kind(name: str, arg: TensorArg, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{name}: {arg.name} must be a torch.Tensor, not {type(tensor).__name__}")
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype != arg.dtype:
        raise InputError(f"{name}: {arg.name} must be {arg.dtype}, got {dtype}")
    if tensor.dim() != arg.rank:
        raise InputError(f"{name}: {arg.name} must be {arg.rank}-D, got shape {list(tensor.shape)}")


def _check_placement(name: str, arg: TensorArg, tensor: torch.Tensor) -> None:
    if tensor.numel() == 0:
        raise InputError(f"{name}: {arg.name} is empty (shape {list(tensor.shape)})")
    if not tensor.is_cuda:
        raise InputError(f"{name}: {arg.name} must be on a CUDA device, got {tensor.device}")
    if not tensor.is_contiguous():
        raise InputError(f"{name}: {arg.name} must be contiguous ({arg.layout})")
    if tensor.data_ptr() % arg.align_bytes:
        raise InputError(
            f"{name}: {arg.name} must be {arg.align_bytes}-byte aligned (its address is "
            f"{tensor.data_ptr() % arg.align_bytes} bytes past a boundary)"
        )


_HIT_PATH = """
def make(state, generation):
  def {name}({args}, out=None):
    if is_dynamo_compiling():
        # torch.compile sees the torch op (with its Meta kernel), not this Python. (A constant
        # False in eager; substituting the function for dynamo instead would import
        # torch._dynamo, seconds, into every server.)
        result = torch_op({args})
        return result if out is None else out.copy_(result)
    table, dispatch, seen = state[0]  # one snapshot (runtime/epoch.py)
    if seen == generation[0]:
        try:
            # The C table: the kernel of these input shapes, called; 1 when it holds none.
            if out is not None and dispatch is not None and dispatch({args}, out) is None:
                return out
            entry = table.get(({key}))
            if entry is not None:
                function, out_shape = entry
                if out is None:
                    out = empty(out_shape, dtype=out_dtype, device={first}.device)
                function({args}, out)
                return out
        except Exception as exc:  # a remembered kernel failed: explained, never called again
            return failed(({args},), out, exc)
    return checked(({args},), out)  # a new shape, or a new epoch

  return {name}
"""


_PUT = 1  # shape_dispatch.c's control code
C_TABLE_MAX_DIMS = 24  # shape_dispatch.c's MAX_KEY: longer keys stay in the Python table


def _hit_path(op: FamilyOp) -> Callable:
    """The op's hit path, generated for the family's argument names (as dataclasses does): named
    parameters and a literal lookup key cost less than *args and a loop, and the hit path is
    what a server pays on every call."""
    names = [arg.name for arg in op.inputs]
    key = [
        f"(None if {arg.name} is None else {arg.name}.shape)"
        if arg.optional
        else f"{arg.name}.shape"
        for arg in op.inputs
    ]
    source = _HIT_PATH.format(
        name=op.family.name, args=", ".join(names), key=", ".join(key) + ",", first=names[0]
    )
    scope = {
        "is_dynamo_compiling": torch.compiler.is_dynamo_compiling,
        "torch_op": lambda *inputs: getattr(torch.ops.cute_aot, op.family.name)(*inputs),
        "empty": torch.empty,
        "out_dtype": op.out_dtype,
        "checked": op.checked,
        "failed": op.failed,
    }
    exec(compile(source, f"<cute_aot op {op.family.name}>", "exec"), scope)
    function = scope["make"](op.state, epoch.GENERATION)
    function.__doc__ = (
        f"{op.family.name}({', '.join(names)}, out=None) on the current torch stream of the "
        f"inputs' device.\n\n" + "\n".join(arg.describe() for arg in op.family.abi)
    )
    return function


# Each op is also a torch op, cute_aot::<family>, so torch.compile does not trace into the Python
# above and CUDA graphs capture it. Defined with an explicit schema and a Meta kernel (which fake
# tensors use): unlike torch.library.custom_op this costs ~0.2 ms, not torchgen's ~50 ms.
_library = torch.library.Library("cute_aot", "DEF")


def _define_torch_op(op: FamilyOp) -> None:
    name = op.family.name
    arguments = ", ".join(f"Tensor{'?' if a.optional else ''} {a.name}" for a in op.inputs)
    _library.define(f"{name}({arguments}) -> Tensor")
    _library.impl(name, lambda *inputs: op.call(*inputs), "CUDA")

    def meta(*inputs):
        shape = op.family.output_shape(op.family.problem(*inputs))
        return inputs[0].new_empty(shape, dtype=op.out_dtype)

    _library.impl(name, meta, "Meta")


_ops_lock = threading.Lock()


@functools.cache
def _op(name: str) -> FamilyOp:
    found = family(name)
    if (adapter := capability(found, Adapter)) is not None:
        raise UnsupportedProblemError(
            f"{name} has no cute-aot op: its kernels serve {adapter.serves} (see "
            "cute_aot.runtime.serving.install, or cute_aot.runtime.flashinfer.install)"
        )
    return FamilyOp(found)


def op(name: str) -> Callable:
    """The op of the installed family `name` (made once per process)."""
    with _ops_lock:
        return _op(name).call


def family_op(name: str) -> FamilyOp:
    with _ops_lock:
        return _op(name)


def forget_resolutions() -> None:
    """Resolve every shape again on its next call (tests, benchmarks)."""
    epoch.advance()


def __getattr__(name: str):
    if not name.startswith("_") and registered(name):
        return op(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
