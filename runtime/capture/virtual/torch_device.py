"""torch as a virtual GPU sees it: fake CUDA tensors, real CPU ones, and torch.cuda answering as
the profile's GPU.

A dispatch mode on every thread sends each op that touches CUDA (a `cuda` device argument, or a
fake tensor among its inputs) to torch's FakeTensorMode, which gives shapes, strides and dtypes
and no memory; every other op runs for real, so a library that plans on the CPU (`.tolist()` of
a CPU tensor) plans as it would on a GPU. Reading a fake tensor's values is unanswerable.
torch.cuda's queries are replaced by functions that take what torch's own take (libraries pass
`device=` by keyword) and answer from the profile. This is applied the moment torch is imported
(runtime/capture/activation.py), before the workload sees it.
"""

from __future__ import annotations

import contextlib
import functools
import threading

from cute_aot.runtime.capture.virtual import known_values, torch_guard
from cute_aot.runtime.capture.virtual.questions import (
    Unanswerable,
    UnansweredAttribute,
    check_not_made,
    in_assert,
    unanswerable,
)

# torch.cuda.get_device_properties' fields, from the driver attributes they are read from.
PROPERTY_ATTRIBUTES = {
    "major": "COMPUTE_CAPABILITY_MAJOR",
    "minor": "COMPUTE_CAPABILITY_MINOR",
    "multi_processor_count": "MULTIPROCESSOR_COUNT",
    "max_threads_per_multi_processor": "MAX_THREADS_PER_MULTIPROCESSOR",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "warp_size": "WARP_SIZE",
    "regs_per_multiprocessor": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "shared_memory_per_block": "MAX_SHARED_MEMORY_PER_BLOCK",
    "shared_memory_per_block_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "shared_memory_per_multiprocessor": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "L2_cache_size": "L2_CACHE_SIZE",
    "clock_rate": "CLOCK_RATE",
    "memory_clock_rate": "MEMORY_CLOCK_RATE",
    "memory_bus_width": "GLOBAL_MEMORY_BUS_WIDTH",
    "is_integrated": "INTEGRATED",
    "is_multi_gpu_board": "MULTI_GPU_BOARD",
}


class DeviceProperties:
    """torch.cuda.get_device_properties() of the profile's GPU."""

    def __init__(self, profile):
        self._profile = profile
        self.name = profile.device_name
        if profile.total_memory is not None:
            self.total_memory = profile.total_memory

    def __getattr__(self, name):
        attribute = PROPERTY_ATTRIBUTES.get(name)
        if attribute is not None and attribute in self._profile.attributes:
            return self._profile.attributes[attribute]
        raise unanswerable(
            f"torch.cuda.get_device_properties().{name}",
            f"profile {self._profile.name} holds no value for it",
            UnansweredAttribute,
        )

    def __repr__(self):
        return f"_CudaDeviceProperties(name='{self.name}', virtual profile {self._profile.name})"


class Stream:
    """A CUDA stream of the virtual GPU: a handle, nothing runs on it."""

    def __init__(self, device=None, priority=0, stream_id=0, **kwargs):
        self.device = _device()
        self.priority = priority
        self.cuda_stream = stream_id

    def synchronize(self):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event if event is not None else Event()

    def query(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Stream) and other.cuda_stream == self.cuda_stream

    def __hash__(self):
        return hash(self.cuda_stream)


class Event:
    """A CUDA event of the virtual GPU: recorded, waited on; its timings are unanswerable
    (nothing ran), so an autotuner cannot pick by them."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **kwargs):
        self.enable_timing = enable_timing

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end_event):
        raise unanswerable(
            "torch.cuda.Event.elapsed_time",
            "nothing runs on a virtual GPU: a timing would be invented",
        )


class MemPool:
    """A memory pool of the virtual GPU: fake tensors take nothing from it."""

    def __init__(self, allocator=None, *args, **kwargs):
        self.allocator = allocator

    @property
    def id(self):
        return (0, id(self))


class CUDAGraph:
    """A CUDA graph of the virtual GPU: a capture runs its work (so its kernels compile and are
    recorded) and writes no values; a replay launches nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def capture_begin(self, *args, **kwargs):
        _capture.depth = _capturing() + 1

    def capture_end(self):
        _capture.depth = max(0, _capturing() - 1)

    def replay(self):
        pass

    def reset(self):
        pass

    def instantiate(self):
        pass

    def pool(self):
        return (0, id(self))

    def enable_debug_mode(self):
        pass

    def debug_dump(self, path):
        pass


_capture = threading.local()


def _capturing() -> int:
    """How many captures this thread is inside (non-zero while capturing)."""
    return getattr(_capture, "depth", 0)


_default_stream = None
_current = threading.local()  # the stream `torch.cuda.stream(s)` made current, per thread


def _device():
    import torch

    return torch.device("cuda", 0)


def _answers(profile) -> dict:
    """torch.cuda's name -> the virtual GPU's answer (each takes what torch's own takes)."""
    global _default_stream
    _default_stream = Stream()
    properties = DeviceProperties(profile)

    def current_stream(device=None):
        return getattr(_current, "stream", None) or _default_stream

    def set_stream(stream):
        _current.stream = stream

    @contextlib.contextmanager
    def stream(stream):
        saved = getattr(_current, "stream", None)
        _current.stream = stream
        try:
            yield stream
        finally:
            _current.stream = saved

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):  # fake tensors take no memory from any pool
        yield

    def mem_get_info(device=None):
        if profile.total_memory is None:
            raise unanswerable(
                "torch.cuda.mem_get_info", f"profile {profile.name} holds no memory size"
            )
        return profile.total_memory, profile.total_memory

    def nothing():  # a function object of its own per name (torch.compile maps them apart)
        return lambda *args, **kwargs: None

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": nothing(),
        "_lazy_init": nothing(),
        "init": nothing(),
        "_exchange_device": lambda device: 0,
        "_maybe_exchange_device": lambda device: 0,
        "get_device_capability": lambda device=None: profile.capability,
        "get_device_properties": lambda device=None: properties,
        "get_device_name": lambda device=None: profile.device_name,
        "get_arch_list": lambda: [profile.arch.removesuffix("a")],
        "synchronize": nothing(),
        # a capture runs its work (its kernels compile) and writes no values; a replay
        # launches nothing
        "is_current_stream_capturing": lambda: bool(_capturing()),
        "CUDAGraph": CUDAGraph,
        "graph_pool_handle": lambda: (0, 0),
        "current_stream": current_stream,
        "default_stream": lambda device=None: _default_stream,
        "set_stream": set_stream,
        "stream": stream,
        "Stream": Stream,
        "Event": Event,
        "mem_get_info": mem_get_info,
        "MemPool": MemPool,
        "use_mem_pool": use_mem_pool,
        "empty_cache": nothing(),
        "manual_seed": nothing(),
        "manual_seed_all": nothing(),
        "seed": nothing(),
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "reset_peak_memory_stats": nothing(),
    }


def start(profile) -> None:
    """When torch is imported (now, if it is): answer as `profile`, fake CUDA on every thread."""
    from cute_aot.runtime.capture.import_hook import after_import

    after_import("torch", lambda: _install(profile))


def _install(profile) -> None:
    import torch
    import torch.cuda

    for name, answer in _answers(profile).items():
        setattr(torch.cuda, name, answer)
    torch.cuda.graphs.CUDAGraph = CUDAGraph  # torch.cuda.graph(...) makes one there
    # torch's own C entry points that libraries call directly (a CPU build has none of them)
    current = torch.cuda.current_stream
    torch._C._cuda_getCurrentRawStream = lambda device=0: current().cuda_stream
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getDeviceCount = lambda: 1
    torch._C._host_emptyCache = lambda: None  # torch.cuda.graph frees pinned host memory
    # NVTX ranges mark a profiler's timeline: nothing runs, nothing to mark
    for name in ("range_push", "range_pop", "mark", "range_start", "range_end"):
        setattr(torch.cuda.nvtx, name, lambda *args, **kwargs: 0)
    torch.cuda.nvtx.range = contextlib.contextmanager(lambda *args, **kwargs: (yield))
    torch.Generator = _generator_class()
    if torch.version.cuda is None:  # a CPU build of torch: libraries ask which CUDA it has
        torch.version.cuda = profile.cuda_version
    torch_guard.install()
    # torch.compile would have inductor write Triton code for a GPU that is not there: compiled
    # regions run eagerly, so the kernels they call are reached as their eager calls reach them
    torch.compiler.set_stance("force_eager")
    _remember_cuda_kernels(torch.library.Library)
    _checks_on_known_values(torch)
    for name in ("tensor", "as_tensor", "asarray"):
        setattr(torch, name, _made_on_host(getattr(torch, name)))
    routing = _routing_mode()
    routing.__enter__()  # this thread, for the life of the process
    _enter_on_every_thread(routing)


def _generator_class():
    """torch.Generator that makes a `cuda` generator of the virtual GPU: a CPU generator that
    says it is on cuda:0 (fake random ops read no state from it). Every real generator is still
    an instance of it."""
    import torch

    real = torch._C.Generator

    class Kind(type(real)):
        def __instancecheck__(cls, instance):
            return isinstance(instance, real)

        def __subclasscheck__(cls, subclass):
            return issubclass(subclass, real)

    class Generator(real, metaclass=Kind):
        def __new__(cls, device="cpu"):
            if torch.device(device).type != "cuda":
                return real(device)
            return real.__new__(_CudaGenerator, "cpu")

    class _CudaGenerator(real):
        def __init__(self, device="cpu"):
            pass

        @property
        def device(self):
            return torch.device("cuda", 0)

    return Generator


def _made_on_host(make):
    """torch.tensor(data, device="cuda") and its kin build the tensor with torch's dispatch modes
    set aside, then move it: made on the host here and moved through `.to`, where the virtual
    GPU sees it (and keeps its values)."""
    import torch

    def made(*args, device=None, **kwargs):
        if device is None or torch.device(device).type != "cuda":
            return make(*args, device=device, **kwargs)
        return make(*args, **kwargs).to(device)

    made.__wrapped__ = make
    return made


def _checks_on_known_values(torch) -> None:
    """torch.testing.assert_close whose operands a virtual GPU does not know is not made: it is
    counted as such, with its site, and the workload runs on to its next kernel. Where every
    operand is known (host-made metadata), the check is made."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    real = torch.testing.assert_close

    def assert_close(actual, expected, *args, **kwargs):
        operands = tree_leaves((actual, expected))
        if any(isinstance(t, FakeTensor) and not known_values.known(t) for t in operands):
            check_not_made("torch.testing.assert_close")
            return None
        return real(actual, expected, *args, **kwargs)

    assert_close.__wrapped__ = real
    torch.testing.assert_close = assert_close


def _routing_mode():
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    item = torch.ops.aten._local_scalar_dense.default
    overwrites = {torch.ops.aten.copy_.default, torch.ops.aten.fill_.Scalar}
    overwrites |= {torch.ops.aten.fill_.Tensor, torch.ops.aten.zero_.default}

    def touches_cuda(args, kwargs) -> bool:
        device = kwargs.get("device")
        if device is not None and getattr(device, "type", str(device).split(":")[0]) == "cuda":
            return True
        return any(isinstance(leaf, FakeTensor) for leaf in tree_leaves((args, kwargs)))

    def written(func, args, kwargs) -> list:
        """The tensors `func` writes into (its schema's mutable arguments)."""
        found = []
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            found += [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]
        return found

    def computes_values(func) -> bool:
        """Whether `func`'s results are values a host knows: not drawn on the device, not
        uninitialized memory, not written inside a capture (nothing runs until a replay)."""
        if torch.Tag.nondeterministic_seeded in func.tags or _capturing():
            return False
        return not func.overloadpacket.__name__.lstrip("_").startswith(_UNINITIALIZED)

    def on_host(func, args, kwargs, out, targets, dynamic):
        """`func` run again on the CPU copies of its operands' values; None when one of them is
        unknown or nothing of the result would be kept."""
        if not computes_values(func):
            return None
        results = tree_leaves(out)
        wanted = dynamic or any(known_values.known(t) for t in targets if isinstance(t, FakeTensor))
        wanted = wanted or any(not isinstance(t, FakeTensor) for t in targets)
        wanted = wanted or any(
            isinstance(r, FakeTensor) and (r.device.type != "cuda" or known_values.keepable(r))
            for r in results
        )
        if not wanted:
            return None
        if func in overwrites and isinstance(args[0], FakeTensor):
            if not known_values.known(args[0]) and not known_values.start_blank(args[0]):
                return None

        def host(value):
            if isinstance(value, FakeTensor):
                found = known_values.values(value)
                if found is None:
                    raise LookupError
                return found
            if isinstance(value, torch.device) and value.type == "cuda":
                return torch.device("cpu")
            return value

        try:
            host_args, host_kwargs = tree_map(host, (args, kwargs))
        except LookupError:
            return None
        try:
            return (func(*host_args, **host_kwargs),)
        except Exception:  # no CPU kernel for it (fp8 arithmetic, ...): the values stay unknown
            return None

    def paired(out, host_out):
        """The fake results, each fresh one with its values kept; results on the host are the
        real values."""

        def pair(result, value):
            if not isinstance(result, FakeTensor) or not isinstance(value, torch.Tensor):
                return result
            if result.device.type != "cuda":
                return value
            if not known_values.known(result):  # a view or an in-place result is known already
                known_values.keep(result, value)
            return result

        return tree_map(pair, out, host_out)

    def like(value):
        """A fake CUDA tensor laid out as a host result whose shape came from values."""
        if not isinstance(value, torch.Tensor):
            return value
        with fake:
            return torch.empty_strided(
                value.shape, value.stride(), dtype=value.dtype, device=_device()
            )

    def as_fake(value):
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            return fake.from_tensor(value)
        return value

    def run(func, args, kwargs):
        if func is item:
            found = known_values.values(args[0])
            if found is not None:
                return found.item()
            if args[0].dtype == torch.bool and in_assert():
                check_not_made("assert on values of CUDA tensors")  # a check, not a value
                return True
            if not known_values.keepable(args[0]):
                raise unanswerable(
                    "a floating-point value of a CUDA tensor (.item(), .tolist(), control flow)",
                    "a virtual GPU computes no floating-point values: a CPU's rounding is not a "
                    "GPU's",
                )
            raise unanswerable(
                "a value of a CUDA tensor (.item(), .tolist(), control flow on it)",
                "it was made on the device (by a launch, a random draw, uninitialized "
                "memory) or derived from such a value: nothing computed it",
            )
        targets = written(func, args, kwargs)
        dynamic = None
        try:
            # host tensors enter as fakes too: FakeTensorMode runs an op of real tensors alone
            # for real, and a real CUDA op needs a GPU
            fake_args, fake_kwargs = tree_map(as_fake, (args, kwargs))
            with fake:
                out = func(*fake_args, **fake_kwargs)
        except Unanswerable:
            raise
        except Exception as exc:
            if not _reads_values(exc):
                raise
            out, dynamic = None, exc
        host_out = on_host(func, args, kwargs, out, targets, dynamic)
        if host_out is None:
            for target in targets:
                if isinstance(target, FakeTensor):
                    known_values.forget(target)
                else:
                    raise unanswerable(
                        "copying a CUDA tensor into host memory",
                        "its values were made on the device, or derived from such values",
                    )
            if dynamic is not None:
                a_bool = _returns_a_bool(func)
                if a_bool and in_assert():  # `assert torch.equal(a, b)`
                    check_not_made("assert on values of CUDA tensors")
                    return True
                raise unanswerable(
                    f"{func} of a CUDA tensor",
                    f"its result's {'value' if a_bool else 'shape'} depends on values written "
                    "on the device",
                ) from dynamic
            return out
        if dynamic is not None:
            out = tree_map(like, host_out[0])
        return paired(out, host_out[0])

    class VirtualCuda(TorchDispatchMode):
        """CUDA ops to fake tensors (with their values where the host knows them), the rest
        for real."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if kwargs.get("pin_memory"):  # host memory the GPU could read: plain memory will do
                kwargs = {**kwargs, "pin_memory": False}
            if not touches_cuda(args, kwargs):
                return func(*args, **kwargs)
            body = _python_cuda_kernel(func)
            if body is not None:  # the library's own Python: its kernels are there to reach
                with self:  # its torch ops are the virtual GPU's too
                    return body(*args, **kwargs)
            return run(func, args, kwargs)

    return VirtualCuda()


# aten ops whose results hold whatever memory held before (names without a leading underscore)
_UNINITIALIZED = ("empty", "new_empty", "resize")


# (op name, overload name) -> (Python kernel, whether it takes the dispatch key set first), of
# every `Library.impl(..., "CUDA")` made in this process (vLLM registers its ops so)
_CUDA_KERNELS: dict[tuple[str, str], tuple] = {}


def _remember_cuda_kernels(library) -> None:
    """Remember each Python kernel registered for CUDA: torch keeps it in C++, out of reach."""
    real = library.impl

    @functools.wraps(real)
    def impl(self, op_name, fn, dispatch_key="", *args, with_keyset=False, **kwargs):
        done = real(self, op_name, fn, dispatch_key, *args, with_keyset=with_keyset, **kwargs)
        if dispatch_key == "CUDA" and callable(fn):
            if isinstance(op_name, str):
                name, _, overload = op_name.partition(".")
                _CUDA_KERNELS[f"{self.ns}::{name}", overload] = (fn, with_keyset)
            else:  # an OpOverload
                schema = op_name._schema
                _CUDA_KERNELS[schema.name, schema.overload_name] = (fn, with_keyset)
        return done

    library.impl = impl


def _python_cuda_kernel(func):
    """The Python a CUDA call of a library's op runs on a real GPU: a `torch.library.custom_op`'s
    body, or a kernel registered with `Library.impl(..., "CUDA")` (None for aten's ops and for
    ops with no Python kernel). Fake mode would run the op's fake instead, which launches nothing
    and so reaches none of its kernels."""
    if getattr(func, "namespace", "aten") in ("aten", "prim", "prims"):
        return None
    from torch._library.custom_ops import _maybe_get_opdef

    opdef = _maybe_get_opdef(func)
    if opdef is not None:
        bodies = opdef._backend_fns
        return bodies.get("cuda") or bodies.get(None)
    schema = func._schema
    found = _CUDA_KERNELS.get((schema.name, schema.overload_name))
    if found is None:
        return None
    kernel, with_keyset = found
    if not with_keyset:
        return kernel
    import torch

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    return functools.partial(kernel, keys)


def _returns_a_bool(func) -> bool:
    """Whether an aten op answers with one Python bool (aten.equal, aten.is_nonzero, ...)."""
    returns = func._schema.returns
    return len(returns) == 1 and str(returns[0].type) == "bool"


def _reads_values(exc: Exception) -> bool:
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    return isinstance(exc, (DataDependentOutputException, DynamicOutputShapeException))


def _enter_on_every_thread(mode) -> None:
    """Dispatch modes are per thread: each new thread enters the mode before its target runs."""
    bootstrap = threading.Thread._bootstrap_inner

    def run_in_mode(self):
        mode.__enter__()
        bootstrap(self)

    threading.Thread._bootstrap_inner = run_in_mode
