"""Replay a recorded `cute.compile` call on a CPU-only machine (the recorded family's builder).

The call is re-created from its key: the target imported by name (a kernel object rebuilt from
its class and recorded `__dict__`), each tensor re-made with the recorded type — a `from_dlpack`
tensor from a DLPack capsule of the recorded shape and strides over no memory, with the recorded
`mark_*` calls applied again, so the compiled function has exactly the recorded signature — and
the hardware queries answered with the recorded values. It compiles for the bundle's
architecture with the recorded options, so with TVM-FFI exactly where the caller asked for it
(the build then exports the DSL's C ABI for the others: aot/compile_worker.py).
"""

from __future__ import annotations

import ctypes
import importlib
import inspect
import re

import cutlass
import cutlass.cute as cute
from cutlass.base_dsl import compiler
from cutlass.cute import runtime as cute_runtime

from cute_aot.kernels.recorded import RecordedCallKey
from cute_aot.kernels.recorded.calls import resolve_target
from cute_aot.kernels.recorded.hardware import pinned


def compile(key: RecordedCallKey, arch: str):
    call = key.call_data
    function, positional, keyword = recreate(key)
    options = [getattr(compiler, name)(value) for name, value in call["options"].items()]
    options += [compiler.GPUArch(arch), compiler.EnableTVMFFI(key.abi == "tvm_ffi")]
    with pinned(key.hardware):
        return cute.compile[tuple(options)](function, *positional, **keyword)


def recreate(key: RecordedCallKey) -> tuple[object, list, dict]:
    """(the recorded function, positional arguments, keyword arguments) of a recorded call,
    re-made from its description and example values."""
    call, examples = key.call_data, key.replay_data.get("examples") or []
    function = import_target(call["target"]["function"])
    symbols: dict[int, object] = {}
    positional, keyword = [], {}
    parameters = _parameters(function)
    for (name, described), example in zip(call["args"], examples, strict=True):
        value = rebuild(described, example, symbols)
        if parameters.get(name) == "keyword":
            keyword[name] = value
        else:
            positional.append(value)
    return function, positional, keyword


def import_target(name: str):
    """`module:qualname` -> the object (the decorated function, as callers pass it)."""
    module_name, _, qualname = name.partition(":")
    found = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _parameters(function) -> dict[str, str]:
    """name -> "keyword" (keyword-only) or "positional", of the function the DSL traces."""
    target, _ = resolve_target(function, ())
    return {
        name: "keyword" if parameter.kind is parameter.KEYWORD_ONLY else "positional"
        for name, parameter in inspect.signature(target).parameters.items()
    }


def rebuild(described: dict, example, symbols: dict):
    """One argument from its description (and example value, for the dynamic parts)."""
    if "dlpack" in described:
        return _dlpack_tensor(described["dlpack"], example)
    if "fake" in described:
        fake = described["fake"]
        return cute_runtime.make_fake_tensor(
            getattr(cutlass, fake["dtype"]),
            tuple(_dim(d, symbols) for d in fake["shape"]),
            tuple(_dim(d, symbols) for d in fake["stride"]),
            memspace=getattr(cutlass.AddressSpace, fake["memspace"]),
            assumed_align=fake["align"],
        )
    if "stream" in described:
        if described["stream"] == "cuda":
            from cuda.bindings import driver

            return driver.CUstream(int(example or 0))
        return cute_runtime.make_fake_stream(use_tvm_ffi_env_stream=described["stream"] == "env")
    if "sym" in described:
        return _symbol(described["sym"], symbols)
    if "dsl_type" in described:
        return getattr(cutlass, described["dsl_type"])
    if "numeric" in described:
        return getattr(cutlass, described["numeric"])(described.get("value", example))
    if "py" in described:
        return described["value"] if "value" in described else example
    for sequence in ("tuple", "list"):
        if sequence in described:
            items = _rebuilt_items(described[sequence], example, symbols)
            return tuple(items) if sequence == "tuple" else items
    if "namedtuple" in described:
        names = [name for name, _ in described["fields"]]
        items = _rebuilt_items([item for _, item in described["fields"]], example, symbols)
        return import_target(described["namedtuple"])(**dict(zip(names, items, strict=True)))
    if "dataclass" in described:  # its fields as they were, __init__ and __post_init__ unrun
        owner = import_target(described["dataclass"])
        rebuilt = owner.__new__(owner)
        items = _rebuilt_items([item for _, item in described["fields"]], example, symbols)
        for (name, _), item in zip(described["fields"], items, strict=True):
            object.__setattr__(rebuilt, name, item)
        return rebuilt
    if "dict" in described:
        values = _rebuilt_items([item for _, item in described["dict"]], example, symbols)
        keys = [rebuild(key, None, symbols) for key, _ in described["dict"]]
        return dict(zip(keys, values, strict=True))
    if "frozenset" in described:
        return frozenset(rebuild(item, None, symbols) for item in described["frozenset"])
    if "pointer" in described:
        pointer = described["pointer"]
        return cute_runtime.make_ptr(
            getattr(cutlass, pointer["dtype"]),
            example,
            getattr(cute.AddressSpace, pointer["memspace"]),
            pointer["align"],
        )
    if "enum" in described:
        return getattr(import_target(described["enum"]), described["name"])
    if "class" in described:
        return import_target(described["class"])
    if "object" in described:
        owner = import_target(described["object"])
        rebuilt = owner.__new__(owner)
        for attr, item in described["state"].items():
            object.__setattr__(rebuilt, attr, rebuild(item, None, symbols))
        return rebuilt
    raise ValueError(f"unknown argument description {sorted(described)}")


def _rebuilt_items(items: list, examples, symbols: dict) -> list:
    """A container's items, each with its example (examples is None: constants alone)."""
    examples = examples if examples is not None else [None] * len(items)
    return [rebuild(item, example, symbols) for item, example in zip(items, examples, strict=True)]


def _symbol(sym: dict, symbols: dict):
    if sym["n"] not in symbols:
        symbols[sym["n"]] = cute.sym_int(
            sym["width"], divisibility=sym["div"], symbol=sym["symbol"]
        )
    return symbols[sym["n"]]


def _dim(dim, symbols: dict):
    return _symbol(dim["sym"], symbols) if isinstance(dim, dict) else dim


def _dlpack_tensor(described: dict, example: dict):
    memspace = described["layout"].split(" o ")[0]
    capsule = MetadataTensor(
        example["shape"],
        example["stride"],
        example["storage"],
        device_type=2 if memspace == "gmem" else 1,
    )

    def make():
        tensor = cute_runtime.from_dlpack(
            capsule,
            assumed_align=described["align"],
            use_32bit_stride=described["stride32"],
            enable_tvm_ffi=described["tvm_ffi"],
        )
        if tensor.element_type is not getattr(cutlass, described["dtype"]):
            tensor.element_type = getattr(cutlass, described["dtype"])
        return tensor

    marks = example.get("marks")
    candidates = [marks] if marks else _likely_marks(len(example["shape"]))
    for candidate in candidates:
        marked = make()
        for name, arguments in candidate:  # JSON made the tuples lists: the DSL takes tuples
            arguments = {k: tuple(v) if isinstance(v, list) else v for k, v in arguments.items()}
            marked = getattr(marked, name)(**arguments)
        marked.load_dltensor()
        if marked._dltensor_wrapper.cache_key() == described["layout"]:
            return marked
    raise ValueError(
        f"cannot re-create a tensor of type {described['layout']}"
        + (
            ""
            if marks
            else ": its dynamic modes were marked before recording began (set "
            "CUTE_AOT_RECORD from process start, so that marks are logged)"
        )
    )


def _likely_marks(rank: int) -> list[list]:
    """What a caller most likely did to a tensor whose marks were not logged: nothing, or
    mark_layout_dynamic with any leading dimension (checked against the recorded type)."""
    dims = [None, *range(rank)]
    return [[], *([["mark_layout_dynamic", {"leading_dim": d}]] for d in dims)]


# -- a DLPack tensor with metadata and no memory: from_dlpack of any shape on a CPU ---------------
class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _Tensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool, 10 float8_e4m3fn, 12 float8_e5m2
_DLPACK_TYPES = {
    "float16": (2, 16),
    "bfloat16": (4, 16),
    "float32": (2, 32),
    "float64": (2, 64),
    "int8": (0, 8),
    "int16": (0, 16),
    "int32": (0, 32),
    "int64": (0, 64),
    "uint8": (1, 8),
    "bool": (6, 8),
    "float8_e4m3fn": (10, 8),
    "float8_e5m2": (12, 8),
}


class MetadataTensor:
    """`__dlpack__` of a tensor that does not exist: shape, strides, dtype and device only (a
    fake, aligned address). The DSL reads nothing else when it types an argument."""

    _alive: list = []  # the capsules point into these: kept for the life of the build process

    def __init__(self, shape, stride, dtype: str, device_type: int = 2, device_id: int = 0):
        self.shape, self.stride = tuple(shape), tuple(stride)
        self.dtype = re.sub(r"^torch\.", "", dtype).lower()
        self.device = (device_type, device_id)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, **kwargs):
        rank = len(self.shape)
        shape = (ctypes.c_int64 * rank)(*self.shape)
        stride = (ctypes.c_int64 * rank)(*self.stride)
        code, bits = _DLPACK_TYPES[_dlpack_name(self.dtype)]
        managed = _Managed()
        managed.dl_tensor = _Tensor(
            0x10000000,
            _Device(*self.device),
            rank,
            _DataType(code, bits, 1),
            ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
            ctypes.cast(stride, ctypes.POINTER(ctypes.c_int64)),
            0,
        )
        self._alive.append((managed, shape, stride))
        return _capsule_new(ctypes.addressof(managed), b"dltensor", None)


def _dlpack_name(storage: str) -> str:
    """The wrapper's dtype spelling ('bf16', 'Float32', 'torch.bfloat16') -> a DLPack name."""
    aliases = {
        "bf16": "bfloat16",
        "f16": "float16",
        "f32": "float32",
        "f64": "float64",
        "i8": "int8",
        "i16": "int16",
        "i32": "int32",
        "i64": "int64",
        "u8": "uint8",
        "half": "float16",
        "float": "float32",
        "double": "float64",
        "boolean": "bool",
        "float8e4m3fn": "float8_e4m3fn",
        "float8e5m2": "float8_e5m2",
    }
    name = storage.lower().removeprefix("torch.")
    return aliases.get(name, name)
