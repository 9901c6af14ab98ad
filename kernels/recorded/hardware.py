"""Hardware queries a CuTe DSL trace makes, logged on the GPU that records and pinned to those
values when a CPU replays the call.

Two kinds exist in cutlass-dsl 4.8.1: `cutlass.utils.HardwareInfo` (SM count, L2 size, max
active clusters; its constructor needs a driver) and `cutlass.base_dsl.runtime.cuda.
get_device_attribute` (shared memory per SM, asked during a trace with min_blocks_per_mp > 1).
Both are patched on their class/module, so code that imported them earlier sees the patch too.
Values are named `HardwareInfo.<method>(<args>)` and `get_device_attribute(<attr>)`.

A server asks the live GPU each question a kernel's trace asked (`differences`: once per
process and question; cutlass is imported already, the caller is in cute.compile) and serves the
kernel only where every answer is the recorded one. The record also keeps the recording GPU's
name and SM count (`live_device`), to say where an answer came from.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading

HARDWARE_INFO_METHODS = (
    "get_max_active_clusters",
    "get_device_multiprocessor_count",
    "get_l2_cache_size_in_bytes",
)
_lock = threading.Lock()


def query_name(method: str, args: tuple) -> str:
    return f"{method}({','.join(str(int(a)) if isinstance(a, int) else repr(a) for a in args)})"


def _attribute_number(attribute) -> int:
    return int(getattr(attribute, "value", attribute))


@contextlib.contextmanager
def _answering(method, attribute, init=None):
    """While inside: HardwareInfo's query methods are `method(name, original)` of each, its
    constructor `init` (when given), and get_device_attribute is `attribute(original)`; the
    originals are put back afterwards, whatever happened."""
    from cutlass.base_dsl.runtime import cuda as cuda_helpers
    from cutlass.utils import hardware_info

    info = hardware_info.HardwareInfo
    replaced = ("__init__", *HARDWARE_INFO_METHODS) if init else HARDWARE_INFO_METHODS
    saved = {name: info.__dict__[name] for name in replaced}
    original_attribute = cuda_helpers.get_device_attribute
    with _lock:
        if init:
            info.__init__ = init
        for name in HARDWARE_INFO_METHODS:
            setattr(info, name, method(name, saved[name]))
        cuda_helpers.get_device_attribute = attribute(original_attribute)
    try:
        yield
    finally:
        with _lock:
            for name, original in saved.items():
                setattr(info, name, original)
            cuda_helpers.get_device_attribute = original_attribute


def logged(into: dict):
    """Run a real compile with every hardware query's result written into `into`."""

    def method(name, original):
        def logged_method(self, *args, **kwargs):
            value = original(self, *args, **kwargs)
            into[query_name(f"HardwareInfo.{name}", args)] = int(value)
            return value

        return logged_method

    def attribute(original):
        def logged_attribute(attr, *args, **kwargs):
            value = original(attr, *args, **kwargs)
            if _attribute_number(attr) not in ARCH_ATTRIBUTES:
                into[query_name("get_device_attribute", (_attribute_number(attr),))] = int(value)
            return value

        return logged_attribute

    return _answering(method, attribute)


# CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR: the record's architecture states them.
# The DSL asks them once per process, to pick its target when none is set, so on a real GPU only
# a process's first compile would carry them (and differ from the same call recorded second, or
# on a virtual GPU, which always sets the target): they are not the kernel's questions.
ARCH_ATTRIBUTES = frozenset({75, 76})


class MissingHardwareValue(RuntimeError):
    pass


def pinned(values: dict):
    """Replay a trace on a machine with no GPU: every query answers its recorded value; one
    the record does not hold raises MissingHardwareValue naming it."""

    def answer(name: str):
        if name not in values:
            raise MissingHardwareValue(
                f"the trace asks the GPU for {name}, and the record holds no value for it "
                "(record the call on a GPU with CUTE_AOT_RECORD, which logs the answers)"
            )
        return values[name]

    def init(self, device_id: int = 0, *args, **kwargs):  # no driver to ask
        self.device_id = device_id

    def method(name, original):
        return lambda self, *args, **kwargs: answer(query_name(f"HardwareInfo.{name}", args))

    def attribute(original):
        return lambda attr, *args, **kwargs: answer(
            query_name("get_device_attribute", (_attribute_number(attr),))
        )

    return _answering(method, attribute, init)


def is_probe(func) -> bool:
    """HardwareInfo's own probe kernel, which `get_max_active_clusters` compiles: never
    recorded, never served (it is how the value a record holds is found)."""
    return getattr(func, "__qualname__", "").startswith("HardwareInfo.")


def live_device() -> dict:
    """The current GPU's name and SM count (torch's properties: no compile, no cutlass)."""
    import torch

    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": properties.name, "sm_count": properties.multi_processor_count}


_QUERY = re.compile(r"^(HardwareInfo\.(\w+)|get_device_attribute)\(([-0-9,]*)\)$")


@functools.cache
def live_answer(name: str, device_index: int) -> int:
    """This GPU's answer to a query named as records name them (query_name)."""
    from cutlass.base_dsl.runtime import cuda as cuda_helpers
    from cutlass.utils import hardware_info

    match = _QUERY.match(name)
    if match is None:
        raise ValueError(f"not a hardware query this cute-aot knows: {name}")
    args = [int(a) for a in match.group(3).split(",") if a]
    if match.group(2):
        if match.group(2) not in HARDWARE_INFO_METHODS:
            raise ValueError(f"not a hardware query this cute-aot knows: {name}")
        info = hardware_info.HardwareInfo(device_index)
        return int(getattr(info, match.group(2))(*args))
    from cuda.bindings import driver

    return int(cuda_helpers.get_device_attribute(driver.CUdevice_attribute(args[0]), device_index))


def differences(replay: dict, device_index: int) -> str | None:
    """Where this GPU answers a recorded kernel's hardware queries otherwise (None: nowhere),
    said with the GPU the record was made on."""
    recorded = replay.get("hardware") or {}
    differ = []
    for name, value in sorted(recorded.items()):
        try:
            here = live_answer(name, device_index)
        except Exception as exc:  # a query this GPU (or this cutlass-dsl) cannot answer
            here = f"no answer ({type(exc).__name__}: {exc})"
        if here != value:
            differ.append(f"{name} = {value} there, {here} here")
    if not differ:
        return None
    return (
        f"its trace was recorded on {replay.get('device') or 'another GPU'}; this GPU "
        f"({live_device()['name']}) answers otherwise: {'; '.join(differ)}"
    )


# An empty kernel for the driver's occupancy calculator, built by the driver's own PTX JIT: the
# PTX ISA version each target first appears in (a target not listed keeps cutlass's probe).
_PROBE_PTX = (
    ".version {isa}\n.target sm_{cc}\n.address_size 64\n.visible .entry probe()\n{{\n ret;\n}}\n"
)
_PTX_ISA = {90: "7.8", 100: "8.6", 101: "8.6", 103: "8.8", 110: "9.0", 120: "8.7", 121: "8.8"}


def occupancy_without_compile() -> None:
    """A serving process: HardwareInfo.get_max_active_clusters asks its occupancy question of an
    empty kernel the driver builds from PTX in milliseconds, instead of cute.compile-ing one of
    its own (a compile in a process that should make none). The question is cutlass's, asked
    the same way: one 128-thread block per SM with all the shared memory it may take, clusters
    of the given size. Its kernel is empty too, so the answer is the same (checked on the GPU
    against cutlass's own for cluster sizes 1 to 16: benchmarks/occupancy_probe.py); where the
    PTX cannot be loaded, cutlass's probe answers."""
    from cutlass.utils import hardware_info

    info = hardware_info.HardwareInfo
    original = info.get_max_active_clusters
    if getattr(original, "__wrapped__", None) is not None:
        return

    def get_max_active_clusters(self, cluster_size: int, stream=None) -> int:
        if stream is None and 1 <= cluster_size <= 32:
            answer = _max_active_clusters(int(self.device), cluster_size)
            if answer is not None:
                return answer
        return original(self, cluster_size, stream)

    get_max_active_clusters.__wrapped__ = original
    info.get_max_active_clusters = get_max_active_clusters


@functools.cache
def _max_active_clusters(device: int, cluster_size: int) -> int | None:
    from cuda.bindings import driver

    ok = _driver_result
    try:
        kernel = _probe_kernel(device)
        if kernel is None:
            return None
        attribute = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        shared = ok(driver.cuDeviceGetAttribute(attribute, device))
        ok(
            driver.cuFuncSetAttribute(
                kernel,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared,
            )
        )
        dynamic = ok(driver.cuOccupancyAvailableDynamicSMemPerBlock(kernel, 1, 1))
        blocks = ok(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel, 1, dynamic))
        ok(
            driver.cuFuncSetAttribute(
                kernel,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )
        )
        config = driver.CUlaunchConfig()
        config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
        config.sharedMemBytes = dynamic
        cluster = driver.CUlaunchAttribute()
        cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        value = driver.CUlaunchAttributeValue()
        value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = cluster_size, 1, 1
        cluster.value = value
        config.numAttrs, config.attrs = 1, [cluster]
        config.gridDimX, config.gridDimY, config.gridDimZ = cluster_size, blocks, 1
        return int(ok(driver.cuOccupancyMaxActiveClusters(kernel, config)))
    except Exception:  # no context, an old driver: cutlass's own probe answers
        return None


@functools.cache
def _probe_kernel(device: int):
    """The empty kernel, loaded on `device` (None: a target this module has no PTX ISA for)."""
    from cuda.bindings import driver

    attribute = driver.CUdevice_attribute
    major = _driver_result(
        driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    )
    minor = _driver_result(
        driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    )
    cc = major * 10 + minor
    if cc not in _PTX_ISA:
        return None
    ptx = _PROBE_PTX.format(isa=_PTX_ISA[cc], cc=cc).encode() + b"\0"
    module = _driver_result(driver.cuModuleLoadData(ptx))
    return _driver_result(driver.cuModuleGetFunction(module, b"probe"))


def _driver_result(result):
    """A cuda-python driver call's value; its error raised (the callers fall back on it)."""
    from cuda.bindings import driver

    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {result[0]}")
    return result[1] if len(result) == 2 else result[1:]
