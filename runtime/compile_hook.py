"""The one hook on `cute.compile`: recording calls (runtime/capture/record.py) and serving recorded
kernels from bundles (`intercept()`), for every way a caller reaches it.

`cute.compile` is a `CompileCallable` instance, called plainly or subscripted with options
(`cute.compile[opts](...)`, a new instance), and bound at import by callers; every form ends in
`CompileCallable._compile`, so that method is replaced on the class, once. The hook costs
nothing on calls that never reach `cute.compile`, and a compile that records nor serves goes
straight to the original.

Serving follows the one fallback policy (runtime/policy.py) through the recorded family's
`Serving`: a hit returns what the caller's own compile would have. For a TVM-FFI compile that
is the bundle's TVM-FFI function, called exactly as the compiled function would be (the
compile-time constants and the environment stream left out, keyword arguments as the recorded
signature names them); for any other, the DSL's JitCompiledFunction loaded from the bundle's
C-ABI export (runtime/loader.py), which takes the arguments the compile took; a miss compiles as
before in mode auto (recorded for the next build), raises in mode aot, and mode jit never looks.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import types

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.errors import KernelNotFoundError
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.kernels.arch import DSL_DEFAULT_ARCH
from cute_aot.kernels.recorded import FAMILY, RecordedCallKey, hardware
from cute_aot.kernels.recorded.calls import MARKS_ATTRIBUTE, NotRecreatable, describe_call
from cute_aot.runtime import policy
from cute_aot.runtime.device import current_gpu_arch
from cute_aot.runtime.epoch import Resolutions
from cute_aot.runtime.registry import REGISTRY
from cute_aot.runtime.serving import installed

__all__ = ["executed", "install_hook", "intercept", "per_target", "uninstall"]

_recorders: list = []  # runtime/record.Recorder objects, innermost last
_lock = threading.Lock()
_original = None  # CompileCallable._compile as cutlass-dsl defines it
_local = threading.local()  # compiles in progress on this thread (a probe inside a compile)
_virtual = None  # on a virtual GPU (runtime/virtual): what a compile returns instead (a stub)
# (call identity, arch) -> what a hit returns; empty again when bundles load or the mode changes
_hits = Resolutions()


def executed() -> int:
    """How many real `cute.compile` executions this process made since the hook was installed
    (benchmarks and tests show that mode aot served every call without one)."""
    return sum(counts[policy.COMPILED] for counts in policy.targets().values())


def per_target() -> dict[str, dict[str, int]]:
    """target (`module:function` of what was compiled) -> {compiles, hits, misses} in this
    process: real compiles made through the hook, calls served from a bundle, and calls a
    served process found no kernel for (CUTE_AOT_REPORT writes them at exit). Counted by
    runtime/policy.py, which keeps every counter."""
    return policy.targets()


def reset_counts() -> None:
    """Forget this process's counts (a fork child starts its own)."""
    policy.reset_targets()


def _run_original(self, func, args, kwargs, target: str):
    policy.count_target(target, policy.COMPILED)
    return _original(self, func, *args, **kwargs)


def intercept() -> str:
    """Serve recorded kernels at `cute.compile` from the loaded bundles; 'installed' or why not.
    While the recorded family is installed (runtime/serving.py), the hook asks its Serving."""
    from cute_aot.runtime import serving

    install_hook()
    hardware.occupancy_without_compile()  # cutlass's occupancy probe would compile
    return serving.install([FAMILY])[FAMILY]


def uninstall() -> None:
    from cute_aot.runtime import serving

    serving.uninstall([FAMILY])


def install_hook() -> None:
    """Replace CompileCallable._compile (and log `mark_*` calls of tensors, which a replay
    needs and a tensor does not keep) once per process."""
    global _original
    with _lock:
        if _original is not None:
            return
        from cutlass.base_dsl.compiler import CompileCallable
        from cutlass.cute import runtime as cute_runtime

        _original = CompileCallable._compile
        CompileCallable._compile = _compile
        for name in ("mark_layout_dynamic", "mark_compact_shape_dynamic"):
            setattr(
                cute_runtime._Tensor, name, _logging_mark(name, getattr(cute_runtime._Tensor, name))
            )


def _logging_mark(name: str, method):
    """`method` logging its call on the tensor as given, (name, args, kwargs): a tensor is marked
    on the caller's path before every compile, served or not, so the log costs an append here;
    only a record spells it out (kernels/recorded/calls.py, logged_marks)."""

    def mark(self, *args, **kwargs):
        self.__dict__.setdefault(MARKS_ATTRIBUTE, []).append((name, args, kwargs))
        return method(self, *args, **kwargs)

    mark.__wrapped__ = method
    return mark


def _compile(self, func, *args, **kwargs):
    if settings.disabled():  # cute-aot's own tools (settings.tool_process): not ours to touch
        return _original(self, func, *args, **kwargs)
    serving, recorders = installed(FAMILY), list(_recorders)
    nested = getattr(_local, "depth", 0) > 0
    if (
        nested
        or (serving is None and not recorders and _virtual is None)
        or hardware.is_probe(func)
    ):
        return _run_original(self, func, args, kwargs, _target_name(func))
    call, why = _describe(self, func, args, kwargs)
    target = call.target if call is not None else _target_name(func)
    if serving is not None:
        served = _served(serving, call, why, target)
        if served is not None:
            return served
    queried: dict = {}
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        with contextlib.ExitStack() as stack:
            if recorders:
                _log_hardware(stack, queried)
            compiled = _run_original(self, func, args, kwargs, target)
    finally:
        _local.depth -= 1
    for recorder in recorders:
        recorder.add(call, why, queried, compiled, _call_site())
    return compiled if _virtual is None else _virtual(call, compiled)


def on_virtual_gpu(stand_in) -> None:
    """A virtual GPU (runtime/virtual): every compile returns `stand_in(call, compiled)`."""
    global _virtual
    _virtual = stand_in


def _target_name(func) -> str:
    func = getattr(func, "__func__", func)
    return (
        f"{getattr(func, '__module__', '?')}:{getattr(func, '__qualname__', type(func).__name__)}"
    )


def _log_hardware(stack: contextlib.ExitStack, into: dict) -> None:
    """Log the compile's hardware queries into `into` where that can be set up (entered here,
    so that a failure to patch is caught); else record without them: the compile goes on."""
    try:
        stack.enter_context(hardware.logged(into))
    except Exception as exc:  # e.g. a cutlass-dsl without HardwareInfo
        warn_once(("hardware-log", type(exc).__name__), f"hardware queries not logged: {exc}")


def _describe(compile_callable, func, args, kwargs):
    """(Call, None), or (None, why not) — never raises: the user's compile goes on."""
    try:
        return describe_call(compile_callable, func, args, kwargs), None
    except NotRecreatable as exc:
        return None, str(exc)
    except Exception as exc:  # a cutlass-dsl this code does not know: record why, compile
        return None, f"could not be described ({type(exc).__name__}: {exc})"


def _served(serving, call, why, target: str):
    """The bundle's function for `call`, or None for the caller's own compile (a miss in mode
    auto, counted for `target`; mode jit, not counted). Mode aot raises on a miss."""
    if policy.bypassed():
        return None
    arch = _arch(call)
    if call is not None:
        known = _hits.get((call.identity_json, arch))
        if known is not _hits.MISSING:  # a hit resolved before, in this epoch: nothing to redo
            policy.count(FAMILY, policy.HIT, target)  # as the resolution counted it
            return known
    try:
        function = _resolved(serving, call, why, arch)
    except KernelNotFoundError:  # mode aot
        policy.count_target(target, policy.MISS)
        raise
    policy.count_target(target, policy.MISS if function is None else policy.HIT)
    return function


def _resolved(serving, call, why, arch: str):
    """`_served` past what it remembered: the policy's answer for `call`, remembered if a hit."""
    if call is None:
        policy.unservable(
            FAMILY,
            "-",
            arch,
            why,
            ("not-servable", why),
            f"cute.compile call not served: {why}; compiling it",
        )
        return None
    epoch = _hits.now()
    key, unfit = _kernel_for_this_gpu(call, arch)
    if unfit:
        policy.unservable(
            FAMILY,
            key.id,
            arch,
            unfit,
            ("hardware", key.id),
            f"cute.compile of {call.target} not served: {unfit}; compiling it",
        )
        return None
    caller = sys._getframe(2)  # the user's call site is looked for only for a miss's record
    function = serving.function(
        key, arch, lambda: {"target": call.target, "site": _call_site(caller)}
    )
    if function is None:
        return None
    if call.tvm_ffi:
        function = _callable_as_compiled(function, call.signature)
    # else the DSL's JitCompiledFunction, as cute.compile returns it
    _hits.put((call.identity_json, arch), function, epoch)
    return function


def _arch(call) -> str:
    return (call.arch if call is not None else None) or current_gpu_arch() or DSL_DEFAULT_ARCH


def _kernel_for_this_gpu(call, arch: str):
    """(the key to serve, why no kernel of the call fits this GPU). The call's own kernel where
    a bundle holds one (its trace asked the GPU nothing: its id is the call's; or the bundle
    was built before answers were part of the id, and then its answers are checked). Else the
    kernel of this call whose recorded answers this GPU gives, each asked of it; None of them:
    the live call's key (for the miss log) and why, naming the answers."""
    call_id = call.call_id
    own = REGISTRY.entry_key(FAMILY, call_id, arch)
    candidates = (
        [own]
        if own is not None
        else [
            fields
            for fields in REGISTRY.entry_keys(FAMILY, arch)
            if fields.get("call") == call.identity_json
        ]
    )
    why = None
    for fields in candidates:
        built = RecordedCallKey.from_fields(fields)
        if built.call == call.identity_json:  # nearly always: the entry of this very call
            built.of_call(call_id, call.identity)
        if not built.hardware:
            return built, None
        differ = hardware.differences(built.replay_data, _device_index())
        if differ is None:
            return built, None
        why = why or f"recorded kernel {built.id}: {differ}"
    return call.key(), why


def _device_index() -> int:
    import torch

    return torch.cuda.current_device()


def _callable_as_compiled(function, spec: dict):
    """The TVM-FFI function, taking arguments as the compiled function would (by keyword too)."""
    if not spec["arg_names"] and not spec["kwonly_names"]:
        return function
    if spec["arg_defaults"] is None or spec["kwonly_defaults"] is None:
        return function  # defaults that are not plain values: positional calls only
    made = _wrappers.get(id(spec))
    if made is not None and made[0] is spec:
        rebound = _rebound(made[1], function)
        if rebound is not None:
            return rebound
    from tvm_ffi.utils.kwargs_wrapper import make_kwargs_wrapper

    wrapper = make_kwargs_wrapper(
        function,
        arg_names=spec["arg_names"],
        arg_defaults=tuple(spec["arg_defaults"]),
        kwonly_names=spec["kwonly_names"],
        kwonly_defaults=spec["kwonly_defaults"],
    )
    _wrappers[id(spec)] = (spec, wrapper)
    return wrapper


# id(signature spec) -> (the spec, the wrapper tvm-ffi generated for it): the spec objects are
# made once per compiled function and argument kinds (kernels/recorded/calls.py), kept here.
_wrappers: dict[int, tuple[dict, object]] = {}


def _rebound(wrapper, function):
    """`wrapper`'s code calling `function` instead: a kernel of a signature seen before gets its
    wrapper without generating and compiling Python again (tvm-ffi keeps the function called
    in the generated code's globals). None where this tvm-ffi keeps it elsewhere."""
    name = _target_global()
    if name is None or name not in wrapper.__globals__:
        return None
    made = types.FunctionType(
        wrapper.__code__,
        {**wrapper.__globals__, name: function},
        wrapper.__name__,
        wrapper.__defaults__,
        wrapper.__closure__,
    )
    made.__kwdefaults__ = wrapper.__kwdefaults__
    return made


@functools.cache
def _target_global() -> str | None:
    """The global through which tvm-ffi's generated wrappers call their function, if known."""
    from tvm_ffi.utils import kwargs_wrapper

    return getattr(kwargs_wrapper, "_INTERNAL_TARGET_FUNC", None)


def _call_site(frame=None) -> str:
    """file:line of the first frame outside cutlass and cute-aot from `frame` (the caller's by
    default) outwards: where the user compiled."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("cutlass", "cute_aot.runtime", "cute_aot.kernels.recorded")):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
