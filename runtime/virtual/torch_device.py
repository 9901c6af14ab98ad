"""torch as a virtual GPU sees it: fake CUDA tensors, real CPU ones, and torch.cuda answering as
the profile's GPU.

A dispatch mode on every thread sends each op that touches CUDA (a `cuda` device argument, or a
fake tensor among its inputs) to torch's FakeTensorMode, which gives shapes, strides and dtypes
and no memory; every other op runs for real, so a library that plans on the CPU (`.tolist()` of
a CPU tensor) plans as it would on a GPU. Reading a fake tensor's values is unanswerable.
torch.cuda's queries are replaced by functions that take what torch's own take (libraries pass
`device=` by keyword) and answer from the profile. This is applied the moment torch is imported
(runtime/activation.py), before the workload sees it.
"""

from __future__ import annotations

import contextlib
import threading

from cute_aot.runtime.virtual import Unanswerable, UnansweredAttribute, unanswerable

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
        # nothing is ever captured into a CUDA graph here (autotuners ask before they time)
        "is_current_stream_capturing": lambda: False,
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
    from cute_aot.runtime.activation import after_import

    after_import("torch", lambda: _install(profile))


def _install(profile) -> None:
    import torch
    import torch.cuda

    for name, answer in _answers(profile).items():
        setattr(torch.cuda, name, answer)
    # torch's own C entry points that libraries call directly (a CPU build has none of them)
    current = torch.cuda.current_stream
    torch._C._cuda_getCurrentRawStream = lambda device=0: current().cuda_stream
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getDeviceCount = lambda: 1
    # NVTX ranges mark a profiler's timeline: nothing runs, nothing to mark
    for name in ("range_push", "range_pop", "mark", "range_start", "range_end"):
        setattr(torch.cuda.nvtx, name, lambda *args, **kwargs: 0)
    torch.cuda.nvtx.range = contextlib.contextmanager(lambda *args, **kwargs: (yield))
    torch.Generator = _generator_class()
    if torch.version.cuda is None:  # a CPU build of torch: libraries ask which CUDA it has
        torch.version.cuda = profile.cuda_version
    if not torch.backends.cuda.is_built():
        _index_through_meta()
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


def _routing_mode():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    fake = FakeTensorMode(allow_non_fake_inputs=True)

    def touches_cuda(args, kwargs) -> bool:
        device = kwargs.get("device")
        if device is not None and getattr(device, "type", str(device).split(":")[0]) == "cuda":
            return True
        return any(isinstance(leaf, FakeTensor) for leaf in tree_leaves((args, kwargs)))

    class VirtualCuda(TorchDispatchMode):
        """CUDA ops to fake tensors, the rest for real."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if kwargs.get("pin_memory"):  # host memory the GPU could read: plain memory will do
                kwargs = {**kwargs, "pin_memory": False}
            if not touches_cuda(args, kwargs):
                return func(*args, **kwargs)
            try:
                with fake:
                    return func(*args, **kwargs)
            except Unanswerable:
                raise
            except Exception as exc:
                if _reads_values(exc):
                    raise unanswerable(
                        f"{func} of a CUDA tensor",
                        "a host read of device memory (.item(), .tolist(), control flow on values)",
                    ) from exc
                raise

    return VirtualCuda()


def _index_through_meta() -> None:
    """A CPU build of torch has no CUDA device guard, and Tensor indexing (`x[:1]`, `x[i] = v`)
    takes one before it dispatches. On such a build a fake CUDA tensor is indexed through a meta
    twin (same sizes, strides and offset): the result is re-made on the fake tensor, a view where
    indexing gives a view, and an assignment is checked there (a fake tensor holds no values)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    def twin(value):
        if isinstance(value, (tuple, list)):
            return type(value)(twin(item) for item in value)
        if not isinstance(value, torch.Tensor) or value.device.type == "meta":
            return value
        extent = (
            1
            + value.storage_offset()
            + sum((n - 1) * s for n, s in zip(value.shape, value.stride(), strict=True) if n > 0)
        )
        base = torch.empty(extent, dtype=value.dtype, device="meta")
        return base.as_strided(value.shape, value.stride(), value.storage_offset())

    def meta_result(index_op, *args):
        try:
            return index_op(*args)
        except (RuntimeError, NotImplementedError) as exc:  # a boolean mask: shape from values
            raise unanswerable(
                "indexing a CUDA tensor by its values",
                "a host read of device memory (the result's shape depends on them)",
            ) from exc

    get_item, set_item = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def getitem(self, index):
        if self.device.type != "cuda":
            return get_item(self, index)
        found = meta_result(get_item, twin(self), twin(index))
        if found._is_view():
            return torch.as_strided(self, found.shape, found.stride(), found.storage_offset())
        return torch.empty_strided(
            found.shape, found.stride(), dtype=found.dtype, device=self.device
        )

    def setitem(self, index, value):
        if self.device.type != "cuda":
            return set_item(self, index, value)
        meta_result(set_item, twin(self), twin(index), twin(value))

    FakeTensor.__getitem__ = getitem
    FakeTensor.__setitem__ = setitem
    # Copying into a CUDA tensor (an autotuner staging its inputs) takes the guard as well: the
    # copy is checked on meta twins, as torch checks it, and the fake destination stays as it is.
    copy = torch.Tensor.copy_

    def copied(self, src, non_blocking=False):
        reads = isinstance(src, torch.Tensor) and src.device.type == "cuda"
        if self.device.type != "cuda" and not reads:
            return copy(self, src, non_blocking)
        if self.device.type != "cuda":
            raise unanswerable(
                "copying a CUDA tensor into host memory", "a host read of device memory"
            )
        copy(twin(self), twin(src))
        return self

    torch.Tensor.copy_ = copied
    # Moving to the GPU takes the guard too: torch.tensor(data, device="cuda"), x.to("cuda"),
    # x.cuda() are made on the CPU, then as a fake CUDA tensor of the same layout.
    for name in ("tensor", "as_tensor"):
        setattr(torch, name, _made_on_cpu(getattr(torch, name)))
    to, cuda = torch.Tensor.to, torch.Tensor.cuda

    def moved(self, *args, **kwargs):
        device, dtype = _target_of_to(args, kwargs)
        if device is None or device.type != "cuda":
            return to(self, *args, **kwargs)
        if self.device.type == "cuda":
            return self if dtype in (None, self.dtype) else to(self, dtype)
        return torch.empty_like(self, dtype=dtype or self.dtype, device=device)

    torch.Tensor.to = moved
    torch.Tensor.cuda = lambda self, device=None, *args, **kwargs: moved(self, "cuda")
    torch.Tensor.cuda.__wrapped__ = cuda


def _target_of_to(args, kwargs):
    """(device, dtype) a Tensor.to call asks for (None where it does not say)."""
    import torch

    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for arg in args:
        if isinstance(arg, torch.Tensor):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, (str, torch.device, int)) and not isinstance(arg, bool):
            device = arg
    return (torch.device(device) if device is not None else None), dtype


def _made_on_cpu(make):
    import torch

    def made(*args, device=None, **kwargs):
        if device is None or torch.device(device).type != "cuda":
            return make(*args, device=device, **kwargs)
        return torch.empty_like(make(*args, **kwargs), device=device)  # fake: layout, no values

    made.__wrapped__ = make
    return made


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
