"""Hardware queries a CuTe DSL trace makes, logged on the GPU that records and pinned to those
values when a CPU replays the call.

Two kinds exist in cutlass-dsl 4.8.1: `cutlass.utils.HardwareInfo` (SM count, L2 size, max
active clusters; its constructor needs a driver) and `cutlass.base_dsl.runtime.cuda.
get_device_attribute` (shared memory per SM, asked during a trace with min_blocks_per_mp > 1).
Both are patched on their class/module, so code that imported them earlier sees the patch too.
Values are named `HardwareInfo.<method>(<args>)` and `get_device_attribute(<attr>)`.

A server does not re-run the queries (one of them compiles a probe kernel): a recorded kernel
whose trace asked any carries the recording GPU's name and SM count, and serves only where the
live GPU has the same (see `same_device`).
"""

from __future__ import annotations

import contextlib
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
def logged(into: dict):
    """Run a real compile with every hardware query's result written into `into`."""
    from cutlass.base_dsl.runtime import cuda as cuda_helpers
    from cutlass.utils import hardware_info

    info = hardware_info.HardwareInfo
    originals = {name: getattr(info, name) for name in HARDWARE_INFO_METHODS}
    original_attribute = cuda_helpers.get_device_attribute

    def wrap(name, method):
        def logged_method(self, *args, **kwargs):
            value = method(self, *args, **kwargs)
            into[query_name(f"HardwareInfo.{name}", args)] = int(value)
            return value

        return logged_method

    def attribute(attr, *args, **kwargs):
        value = original_attribute(attr, *args, **kwargs)
        into[query_name("get_device_attribute", (_attribute_number(attr),))] = int(value)
        return value

    with _lock:
        for name, method in originals.items():
            setattr(info, name, wrap(name, method))
        cuda_helpers.get_device_attribute = attribute
    try:
        yield into
    finally:
        with _lock:
            for name, method in originals.items():
                setattr(info, name, method)
            cuda_helpers.get_device_attribute = original_attribute


class MissingHardwareValue(RuntimeError):
    pass


@contextlib.contextmanager
def pinned(values: dict):
    """Replay a trace on a machine with no GPU: every query answers its recorded value; one
    the record does not hold raises MissingHardwareValue naming it."""
    from cutlass.base_dsl.runtime import cuda as cuda_helpers
    from cutlass.utils import hardware_info

    info = hardware_info.HardwareInfo
    saved = {name: info.__dict__[name] for name in ("__init__", *HARDWARE_INFO_METHODS)}
    original_attribute = cuda_helpers.get_device_attribute

    def answer(name: str):
        if name not in values:
            raise MissingHardwareValue(
                f"the trace asks the GPU for {name}, and the record holds no value for it "
                "(record the call on a GPU with CUTE_AOT_RECORD, which logs the answers)"
            )
        return values[name]

    def pinned_init(self, device_id: int = 0, *args, **kwargs):
        self.device_id = device_id

    def pinned_method(name):
        return lambda self, *args, **kwargs: answer(query_name(f"HardwareInfo.{name}", args))

    with _lock:
        info.__init__ = pinned_init
        for name in HARDWARE_INFO_METHODS:
            setattr(info, name, pinned_method(name))
        cuda_helpers.get_device_attribute = lambda attr, *args, **kwargs: answer(
            query_name("get_device_attribute", (_attribute_number(attr),))
        )
    try:
        yield
    finally:
        with _lock:
            for name, method in saved.items():
                setattr(info, name, method)
            cuda_helpers.get_device_attribute = original_attribute


def is_probe(func) -> bool:
    """HardwareInfo's own probe kernel, which `get_max_active_clusters` compiles: never
    recorded, never served (it is how the value a record holds is found)."""
    return getattr(func, "__qualname__", "").startswith("HardwareInfo.")


def live_device() -> dict:
    """The current GPU's name and SM count (torch's properties: no compile, no cutlass)."""
    import torch

    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": properties.name, "sm_count": properties.multi_processor_count}
