"""Key completeness, as properties.

1. For every family: distinct keys have distinct ids and symbols, and changing any single field
   changes both (a key that forgot a field would serve one binary for two builds).
2. Dispatch writes the problem's assumptions into the key (dtypes, alignment, compiled-in sizes)
   and refuses problems no key is built for.
3. The compiled functions themselves refuse every call whose tensors differ from their key's
   assumptions (dtype, shape, layout/strides, alignment, device) before launching anything: the
   op's hot path relies on exactly this. Checked on the CPU against the real cross-compiled
   library with DLPack tensors that claim to live on a GPU: a refused call raises ValueError; a
   call the oracle calls valid gets past every check and fails only at the launch (no driver).
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
import typing

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cute_aot.artifacts.bundle import SYMBOL_RE
from cute_aot.artifacts.core import settings as cute_aot_settings
from cute_aot.artifacts.core.errors import InputError, UnsupportedProblemError
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.artifacts.verify import check_entries
from cute_aot.kernels import families
from cute_aot.kernels.arch import SUPPORTED_ARCHS
from cute_aot.kernels.router_gemm import (
    ALIGN_BYTES,
    DEFAULT_SHAPES,
    K_DIVISOR,
    MAX_TOKENS,
    RouterProblem,
    enumerate_keys,
    family,
)

PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None)
# Per family (7 of them): every example exercises every field of a key, so a few dozen random
# keys per family cover what a forgotten field would break; more only lengthen the suite.
PER_FAMILY = settings(PROPERTY, max_examples=50)


# -- 1. ids and symbols, for every family --------------------------------------------------------
def _field_strategy(kind):
    if kind is bool:
        return st.booleans()
    if kind is int:
        return st.integers(-4, 1 << 20)
    if kind is float:  # exact values (an attention scale): every bit is part of the id
        return st.floats(min_value=1e-6, max_value=16.0, allow_nan=False)
    if kind is str:
        return st.sampled_from(["dot", "splitk", "bfloat16", "float16", "float32", ""]) | st.text(
            max_size=6
        )
    raise AssertionError(f"no strategy for key field type {kind}")


def _another(current, drawn):
    """`drawn`, or where it equals `current` a value of the same type next to it (no filtered
    strategy: hypothesis describes a filter's lambda from its source at every draw)."""
    if drawn != current:
        return drawn
    if isinstance(current, bool):
        return not current
    if isinstance(current, str):
        return current + "x"
    return current + 1 if isinstance(current, int) else current * 2


def keys_of(key_class):
    hints = typing.get_type_hints(key_class)
    fields = {f.name: _field_strategy(hints[f.name]) for f in dataclasses.fields(key_class)}
    return st.builds(key_class, **fields)


FAMILIES = list(families())
FAMILY_KEYS = [found.Key for found in families().values()]


def _replay_only(key_class) -> tuple[str, ...]:
    """Fields a key class declares out of its id: what a replay needs besides the identity
    (the recorded family's example values and hardware answers, kernels/recorded)."""
    return getattr(key_class, "REPLAY_ONLY", ())


def _identity(key) -> tuple:
    skip = _replay_only(type(key))
    return tuple(getattr(key, f.name) for f in dataclasses.fields(key) if f.name not in skip)


@pytest.mark.parametrize("key_class", FAMILY_KEYS, ids=FAMILIES)
def test_distinct_keys_have_distinct_ids_and_symbols(key_class):
    @PER_FAMILY
    @given(a=keys_of(key_class), b=keys_of(key_class))
    def check(a, b):
        same = _identity(a) == _identity(b)
        assert same == (a.id == b.id) == (a.symbol == b.symbol)
        assert (a == b) == (a.canonical_json() == b.canonical_json())

    check()


@pytest.mark.parametrize("key_class", FAMILY_KEYS, ids=FAMILIES)
def test_every_field_is_part_of_the_id(key_class):
    hints = typing.get_type_hints(key_class)

    @PER_FAMILY  # each example changes every field in turn
    @given(key=keys_of(key_class), data=st.data())
    def check(key, data):
        for f in dataclasses.fields(key_class):
            current = getattr(key, f.name)
            other = _another(current, data.draw(_field_strategy(hints[f.name])))
            changed = dataclasses.replace(key, **{f.name: other})
            if f.name in _replay_only(key_class):
                assert changed.id == key.id, f"replay-only field {f.name} changes the id"
                continue
            assert changed.id != key.id, f"field {f.name} does not change the id"
            assert changed.symbol != key.symbol

    check()


@pytest.mark.parametrize("key_class", FAMILY_KEYS, ids=FAMILIES)
def test_ids_symbols_and_fields_round_trip(key_class):
    @PER_FAMILY
    @given(key=keys_of(key_class))
    def check(key):
        assert re.fullmatch(r"[0-9a-f]{20}", key.id)
        assert SYMBOL_RE.match(key.symbol) and key.symbol == f"{key.FAMILY}_{key.id}"
        assert key_class.from_fields(key.fields()) == key
        assert key.fields()["family"] == key.FAMILY

    check()


@pytest.mark.parametrize("key_class", FAMILY_KEYS, ids=FAMILIES)
def test_a_bundle_entry_of_any_key_re_derives(key_class, tmp_path):
    """What the loader checks (artifacts/verify.py) holds for every key a build can write."""

    @PER_FAMILY
    @given(keys=st.lists(keys_of(key_class), min_size=1, max_size=4, unique_by=lambda k: k.id))
    def check(keys):
        entries = tuple(
            Entry(key.FAMILY, key.fields(), key.id, key.symbol, "ab" * 32, 1) for key in keys
        )
        manifest = Manifest("p", "sm_90a", "1", "t", {}, {key_class.FAMILY: {}}, {}, {}, entries)
        check_entries(tmp_path, manifest, lambda name: key_class)

    check()


def test_every_enumerated_key_is_distinct_for_every_arch_and_shape():
    shapes = [*DEFAULT_SHAPES, (128, 2880), (264, 6144), (256, 14400), (64, 512), (32, 2040)]
    for arch in SUPPORTED_ARCHS:
        keys = enumerate_keys(arch, shapes)
        assert len({k.id for k in keys}) == len({k.symbol for k in keys}) == len(set(keys))
        assert len(keys) == len(set(keys))


# -- 2. dispatch writes the problem's assumptions into the key ------------------------------------
problems = st.tuples(
    st.integers(1, MAX_TOKENS),
    st.integers(1, 1024),
    st.integers(1, 2048).map(lambda q: q * K_DIVISOR),
    st.sampled_from(sorted(SUPPORTED_ARCHS)),
)


def dispatch(m, n, k, arch, x_dtype="bfloat16", w_dtype="bfloat16"):
    """The family's dispatch of named dims: these problems include N > K, which the positional
    `router_gemm.dispatch` refuses as the older order."""
    problem = RouterProblem(m=m, n=n, k=k, x_dtype=x_dtype, w_dtype=w_dtype)
    return family.dispatch(problem, arch).key


@PROPERTY
@given(problem=problems)
def test_dispatch_records_what_the_kernel_assumes(problem):
    m, n, k, arch = problem
    key = dispatch(m, n, k, arch)
    assert (key.x_dtype, key.w_dtype, key.out_dtype) == ("bfloat16", "bfloat16", "float32")
    assert key.align_bytes == ALIGN_BYTES
    if key.backend == "dot":  # M and K are compiled in: the key must carry them
        assert (key.m, key.k) == (m, k)
    else:  # symbolic sizes: nothing size-specific may leak into the key
        assert (key.m, key.k, key.split_k > 0) == (0, 0, True)
    assert key == dispatch(m, n, k, arch)  # a pure function


@PROPERTY
@given(
    problem=problems,
    x_dtype=st.sampled_from(["float16", "float32", "int8", "float8_e4m3fn", "bfloat16"]),
    w_dtype=st.sampled_from(["float16", "float32", "bfloat16"]),
)
def test_dispatch_refuses_dtypes_no_kernel_is_built_for(problem, x_dtype, w_dtype):
    m, n, k, arch = problem
    if (x_dtype, w_dtype) == ("bfloat16", "bfloat16"):
        assert dispatch(m, n, k, arch, x_dtype, w_dtype).x_dtype == x_dtype
        return
    with pytest.raises(UnsupportedProblemError, match=f"got x {x_dtype} and w {w_dtype}"):
        dispatch(m, n, k, arch, x_dtype, w_dtype)


@PROPERTY
@given(
    m=st.integers(-2, 40),
    k=st.integers(-16, 9000),
    n=st.integers(-2, 600),
    arch=st.sampled_from(sorted(SUPPORTED_ARCHS)),
)
def test_dispatch_refuses_what_no_kernel_serves(m, k, n, arch):
    servable = 1 <= m <= MAX_TOKENS and k >= K_DIVISOR and k % K_DIVISOR == 0 and n >= 1
    if servable:
        dispatch(m, n, k, arch)
    else:
        with pytest.raises(UnsupportedProblemError):
            dispatch(m, n, k, arch)


# -- 3. the compiled functions refuse mismatched tensors ------------------------------------------
def _cuda_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# A call the oracle deems valid reaches the kernel launch: with a driver that would run a kernel on
# made-up pointers. The GPU machine runs tests/test_inputs_gpu.py instead.
needs_no_driver = pytest.mark.skipif(
    _cuda_driver_present(), reason="a CUDA driver is present: fake GPU pointers must not launch"
)

KDL_CUDA = 2
DTYPES = {  # name -> DLPack (code, bits, lanes)
    "bfloat16": (4, 16, 1),
    "float16": (2, 16, 1),
    "float32": (2, 32, 1),
    "float64": (2, 64, 1),
    "int16": (0, 16, 1),
    "int8": (0, 8, 1),
    "bfloat16x2": (4, 16, 2),
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]
_NO_DELETE = _DELETER(lambda tensor: None)  # the memory is ours (ctypes arrays kept alive below)
_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@dataclasses.dataclass(frozen=True)
class Desc:
    """What a tensor claims to be; no memory behind `address` (it is never touched)."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    address: int = 0x7F00_0000_0000
    device_id: int = 0


class FakeGpuTensor:
    """A DLPack producer claiming a CUDA tensor: lets TVM-FFI run its checks without a GPU."""

    def __init__(self, desc: Desc):
        self.desc = desc
        self.shape = (ctypes.c_int64 * max(len(desc.shape), 1))(*desc.shape)
        self.strides = (ctypes.c_int64 * max(len(desc.strides), 1))(*desc.strides)
        self.managed = _DLManagedTensor()
        tensor = self.managed.dl_tensor
        tensor.data = desc.address
        tensor.device = _DLDevice(KDL_CUDA, desc.device_id)
        tensor.ndim = len(desc.shape)
        tensor.dtype = _DLDataType(*DTYPES[desc.dtype])
        tensor.shape, tensor.strides, tensor.byte_offset = self.shape, self.strides, 0
        self.managed.deleter = _NO_DELETE

    def __dlpack_device__(self):
        return (KDL_CUDA, self.desc.device_id)

    def __dlpack__(self, stream=None, **kwargs):
        return _capsule(ctypes.addressof(self.managed), b"dltensor", None)


def _valid_descs(key, m: int, k: int, n: int) -> dict[str, Desc]:
    return {
        "x": Desc(key.x_dtype, (m, k), (k, 1)),
        "w": Desc(key.w_dtype, (n, k), (k, 1)),
        "out": Desc(key.out_dtype, (m, n), (n, 1)),
    }


def _matches_key(key, descs: dict[str, Desc]) -> bool:
    """The oracle: do these tensors satisfy everything the key's binary assumes?"""
    x, w, out = descs["x"], descs["w"], descs["out"]
    if any(len(d.shape) != 2 for d in (x, w, out)):
        return False
    if (x.dtype, w.dtype, out.dtype) != (key.x_dtype, key.w_dtype, key.out_dtype):
        return False
    (m, k), (n, k_w), (m_out, n_out) = x.shape, w.shape, out.shape
    if (k_w, m_out, n_out) != (k, m, n):
        return False
    if key.backend == "dot" and (m, k) != (key.m, key.k):
        return False
    if key.backend == "splitk" and k % K_DIVISOR:
        return False
    for d in (x, w, out):
        rows, cols = d.shape
        if d.address % key.align_bytes or d.device_id != x.device_id:
            return False
        # row-major; a stride of a size-1 dimension never moves the address, so it is free
        if (cols != 1 and d.strides[1] != 1) or (rows != 1 and d.strides[0] != cols):
            return False
    return True


PERTURBATIONS = (
    "dtype",
    "rows",
    "cols",
    "pad_rows",
    "column_stride",
    "transpose",
    "misalign",
    "device",
    "ndim",
)


@st.composite
def call_descs(draw, key):
    """Tensors for a call of `key`: valid ones with 0-3 perturbations (the names above)."""
    m = key.m if key.backend == "dot" else draw(st.integers(1, MAX_TOKENS))
    k = key.k if key.backend == "dot" else draw(st.integers(1, 1024)) * K_DIVISOR
    n = draw(st.integers(1, 512))
    descs = _valid_descs(key, m, k, n)
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(descs)))
        d = descs[name]
        how = draw(st.sampled_from(PERTURBATIONS))
        if how == "dtype":
            d = dataclasses.replace(d, dtype=draw(st.sampled_from(sorted(DTYPES))))
        elif how in ("rows", "cols") and len(d.shape) == 2:
            axis = 0 if how == "rows" else 1
            size = draw(st.integers(0, 2 * max(d.shape[axis], 1)))
            shape = list(d.shape)
            shape[axis] = size
            d = dataclasses.replace(d, shape=tuple(shape), strides=(shape[1], 1))
        elif how == "pad_rows" and len(d.shape) == 2:  # a slice of a wider buffer
            d = dataclasses.replace(
                d, strides=(d.strides[0] + draw(st.sampled_from([1, 8, 64])), 1)
            )
        elif how == "column_stride" and len(d.shape) == 2:  # every other column
            d = dataclasses.replace(d, strides=(2 * d.shape[1], 2))
        elif how == "transpose" and len(d.shape) == 2:  # a .t() view: column-major
            d = dataclasses.replace(d, shape=d.shape[::-1], strides=(1, d.shape[1]))
        elif how == "misalign":
            d = dataclasses.replace(d, address=d.address + draw(st.sampled_from([2, 4, 8, 12])))
        elif how == "device":
            d = dataclasses.replace(d, device_id=draw(st.integers(1, 7)))
        elif how == "ndim" and len(d.shape) == 2:
            if draw(st.booleans()):  # a trailing unit dimension
                d = dataclasses.replace(d, shape=(*d.shape, 1), strides=(*d.strides, 1))
            else:  # flattened
                d = dataclasses.replace(d, shape=(d.shape[0] * d.shape[1],), strides=(1,))
        descs[name] = d
    return descs


@pytest.fixture(scope="module")
def kernels(small_bundles, tmp_path_factory):
    """The real sm_90a functions of the small bundle (loaded on the CPU), by key."""
    from cute_aot.runtime.loader import open_bundle

    _, paths, plan = small_bundles
    with cute_aot_settings.scope(CUTE_AOT_CACHE_DIR=str(tmp_path_factory.mktemp("cache"))):
        bundle = open_bundle(next(p for p in paths if "sm_90a" in p.name), "sm_90a")
    return {key: bundle.function(key.id) for key in plan["sm_90a"]}


# TVM-FFI tensors point into their producers' ctypes memory (shape, strides, the deleter) and may
# outlive a call (a raised error keeps its frame): producers live as long as the module does.
_producers: list[FakeGpuTensor] = []


def _call(function, descs: dict[str, Desc]):
    import tvm_ffi

    fakes = [FakeGpuTensor(descs[name]) for name in ("x", "w", "out")]
    _producers.extend(fakes)
    return function(*[tvm_ffi.from_dlpack(fake) for fake in fakes])


@pytest.mark.slow  # `kernels` are the real, cross-compiled ones
@needs_no_driver
@pytest.mark.parametrize("backend", ["dot", "splitk"])
def test_compiled_functions_refuse_tensors_their_key_does_not_fit(backend, kernels):
    key, function = next((k, f) for k, f in kernels.items() if k.backend == backend)
    seen = {"refused": 0, "reached launch": 0}

    @settings(
        max_examples=1500,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(descs=call_descs(key))
    def check(descs):
        valid = _matches_key(key, descs)
        with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
            _call(function, descs)
        if valid:  # past every argument check; only the launch itself fails (no driver here)
            assert info.type is RuntimeError and "Cuda Runtime Error" in str(info.value), descs
            seen["reached launch"] += 1
        else:  # refused by the checks, before anything is launched
            assert info.type in (ValueError, TypeError), (descs, info.value)
            seen["refused"] += 1

    check()
    assert seen["refused"] > 500 and seen["reached launch"] > 100, seen


@pytest.mark.slow
@needs_no_driver
def test_empty_problems_pass_the_compiled_checks_so_python_must_refuse_them(kernels):
    """Why the op's checked path refuses empty inputs itself: the split-K function accepts them."""
    key, function = next((k, f) for k, f in kernels.items() if k.backend == "splitk")
    for m, k, n in [(0, 64, 8), (2, 0, 8), (2, 64, 0)]:
        with pytest.raises(RuntimeError, match="Cuda Runtime Error"):  # reached the launch
            _call(function, _valid_descs(key, m, k, n))
    from cute_aot.runtime import router_gemm

    for m, k, n in [(0, 64, 8), (2, 0, 8), (2, 64, 0)]:
        x = torch.empty(m, k, dtype=torch.bfloat16)
        w = torch.empty(n, k, dtype=torch.bfloat16)
        with pytest.raises(InputError, match="empty problem"):
            router_gemm(x, w)


@pytest.mark.slow
def test_the_hot_path_hands_a_mismatch_to_the_checked_path(kernels, monkeypatch):
    """A cached function (the hot path) called with other tensors: the compiled checks refuse,
    and the op reports the problem as an InputError naming it."""
    from cute_aot.runtime import ops

    key, function = next((k, f) for k, f in kernels.items() if k.backend == "dot")
    m, k, n = key.m, key.k, 64
    table = ops.family_op("router_gemm").table
    key = (torch.Size((m, k)), torch.Size((n, k)))  # the input shapes
    monkeypatch.setitem(table, key, (function, (m, n)))  # entry: (function, output shape)
    cases = {
        "x must be bfloat16": (
            torch.zeros(m, k, dtype=torch.float16),
            torch.zeros(n, k, dtype=torch.bfloat16),
        ),
        "w must be bfloat16": (torch.zeros(m, k, dtype=torch.bfloat16), torch.zeros(n, k)),
        "must be on a CUDA device": (
            torch.zeros(m, k, dtype=torch.bfloat16),
            torch.zeros(n, k, dtype=torch.bfloat16),
        ),
    }
    for message, (x, w) in cases.items():
        with pytest.raises(InputError, match=message):
            ops.router_gemm(x, w)


@PROPERTY
@given(
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.int8]),
    m=st.integers(0, 4),
    k=st.integers(0, 40),
    n=st.integers(0, 4),
    k_w=st.integers(0, 40),
    transpose=st.booleans(),
)
def test_the_op_refuses_every_cpu_call_with_an_input_error(dtype, m, k, n, k_w, transpose):
    from cute_aot.runtime import router_gemm

    x = torch.zeros(k, m, dtype=dtype).t() if transpose else torch.zeros(m, k, dtype=dtype)
    w = torch.zeros(n, k_w, dtype=torch.bfloat16)
    with pytest.raises(InputError) as info:
        router_gemm(x, w)
    message = str(info.value)
    assert message.startswith("router_gemm: ")
    if dtype != torch.bfloat16:
        assert "x must be bfloat16" in message
    elif k != k_w:
        assert f"K={k}" in message and f"K={k_w}" in message
    elif 0 in (m, n, k):
        assert "empty problem" in message
    elif k % K_DIVISOR:
        assert "multiple of 8" in message
    else:
        assert "must be on a CUDA device" in message
