"""A live `cute.compile` call as data: the key of the recorded family, with no tracing.

Used where cutlass is already imported (inside `cute.compile`, and by the build's replay), so
the cutlass names below are looked up lazily. What is described, and why:

- the target: `module:qualname` of the `@cute.jit` function, resolved exactly as
  `CompileCallable._compile` does (a bound method or a kernel object puts the object first);
  a kernel object is described by its class and its `__dict__` (the DSL bakes `self` in);
- the source hash of the files that define the target (a new release of the code is a new key);
- each argument by what makes up the compiled function's type: a `from_dlpack` tensor by its
  dtype and layout type (`(?,?{div=16}):(?{i64},1)`: dynamic modes read `?`), a fake tensor by
  its dtype, shape and stride with symbolic sizes numbered in order of appearance, a stream by
  kind, a scalar by its type when its parameter is dynamic and by its value when it is a
  compile-time constant (the DSL's own rule, `is_argument_constexpr`);
- the compile options that differ from the defaults, less the target architecture (the
  bundle's) and dump/keep paths (host-specific), and the `CUTE_DSL_*` variables that change code.

What cannot be described as data (a closure, an object holding a live handle) raises
NotRecreatable with the reason, which records and builds list with the call site.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import typing
from dataclasses import dataclass

from cute_aot.artifacts import settings
from cute_aot.artifacts.bundle import sha256_file
from cute_aot.kernels.recorded import RecordedCallKey, asks_tvm_ffi, canonical

# Options that say where files go, or which architecture: never part of the identity.
HOST_OPTIONS = frozenset({"GPUArch", "KeepCUBIN", "KeepPTX", "KeepSASS", "DumpDir",
                          "FlattenLocsOutputJsonPath", "RemarkOutput"})  # fmt: skip
# CUTE_DSL_* variables the compiler merges into every compile that change the code it emits.
CODEGEN_ENV = ("CUTE_DSL_ENABLE_TVM_FFI", "CUTE_DSL_COMPILER_OPT", "CUTE_DSL_LINEINFO",
               "CUTE_DSL_ENABLE_ASSERTIONS", "CUTE_DSL_ENABLE_PYIR", "CUTE_DSL_DEBUG")  # fmt: skip


class NotRecreatable(Exception):
    """This call cannot be described as data a CPU can replay; str() says why."""


@dataclass(frozen=True)
class Call:
    """One `cute.compile` call: its identity, what a replay needs, and how to call its result."""

    identity: dict
    examples: list  # per argument (positional, then keyword by name): concrete values
    signature: dict  # kwargs wrapper spec of the compiled function: names and defaults
    arch: str | None = None  # the architecture the options name, if they do

    def key(self, hardware: dict | None = None, device: dict | None = None) -> RecordedCallKey:
        """The key, with the hardware answers its trace got and the GPU that gave them."""
        replay = {"examples": self.examples, "hardware": hardware or {}}
        if device is not None:
            replay["device"] = device
        return RecordedCallKey(call=self.identity_json, replay=canonical(replay))

    @functools.cached_property
    def identity_json(self) -> str:
        """The identity's canonical JSON: what tells one compiled kernel from another."""
        return canonical(self.identity)

    @property
    def tvm_ffi(self) -> bool:
        """Whether the caller compiled for TVM-FFI (then it calls a TVM-FFI function)."""
        return asks_tvm_ffi(self.identity)

    @property
    def target(self) -> str:
        target = self.identity["target"]
        return target.get("function") or target["object"]


def resolve_target(func, args: tuple) -> tuple[object, tuple]:
    """(the undecorated function, the arguments it is traced with), as `_compile` does."""
    if inspect.ismethod(func):
        args, func = (func.__self__, *args), func.__func__
    elif not inspect.isfunction(func) and inspect.isfunction(
        inspect.getattr_static(type(func), "__call__", None)
    ):
        args, func = (func, *args), type(func).__call__
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func, tuple(args)


def describe_call(compile_callable, func, args: tuple, kwargs: dict) -> Call:
    """The Call of `compile_callable(func, *args, **kwargs)`; NotRecreatable when it has none."""
    kwargs = {
        k: v for k, v in kwargs.items() if k not in ("trace_finalize_hooks", "is_experimental")
    }
    options = kwargs.pop("options", None)
    target, args = resolve_target(func, args)
    name = _qualified_once(target)
    try:
        bound = _signature(target).bind(*args, **kwargs)
    except (TypeError, ValueError, NameError) as exc:
        raise NotRecreatable(f"{name}: arguments do not bind to its signature ({exc})") from exc
    for parameter in bound.signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            if bound.arguments.get(parameter.name):
                raise NotRecreatable(f"{name}: takes *{parameter.name}, which records do not hold")
    describer = _Describer()
    identity_args, examples, constexpr = [], [], {}
    for index, (param, value) in enumerate(bound.arguments.items()):
        parameter = bound.signature.parameters[param]
        is_constant = _is_constexpr(index, parameter, value)
        constexpr[param] = is_constant
        described, example = describer.argument(value, is_constant, f"argument {param!r}")
        identity_args.append([param, described])
        examples.append(example)
    target_data: dict = {"function": name}
    files = {_source_file(target)}
    if args and constexpr.get(next(iter(bound.arguments))) and not inspect.isfunction(func):
        owner = type(args[0])
        target_data = {"function": name, "object": _qualified(owner)}
        files.add(_source_file(owner))
    compile_options = _effective_options(compile_callable, options)
    identity = {
        "target": target_data,
        "source": _hash_files(tuple(sorted(f for f in files if f))),
        "args": identity_args,
        "options": {k: v for k, v in compile_options.items() if k not in HOST_OPTIONS},
        "env": settings.environment(CODEGEN_ENV),
    }
    arch = compile_options.get("GPUArch") or None
    env_streams = tuple(
        name for name, parameter in bound.signature.parameters.items()
        if _is_env_stream(bound.arguments.get(name, parameter.default))
    )  # fmt: skip
    signature = _wrapper_spec(target, env_streams)
    return Call(identity, examples, signature, arch)


# What depends only on the function compiled, or only on the options, is worked out once per
# process: a server's hit costs the description of its arguments, not a re-parse of its code.
@functools.cache
def _signature(target) -> inspect.Signature:
    return inspect.signature(target, eval_str=True)


@functools.cache
def _qualified_once(target) -> str:
    return _qualified(target)


def _qualified(obj) -> str:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname:
        raise NotRecreatable(f"{obj!r} has no importable name")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise NotRecreatable(f"{module}:{qualname} is defined inside a function (a closure): "
                             "a replay cannot import it")  # fmt: skip
    if module == "__main__":
        raise NotRecreatable(f"{qualname} is defined in __main__: a replay cannot import it")
    return f"{module}:{qualname}"


@functools.cache
def _source_file(obj) -> str | None:
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return None


@functools.cache
def _hash_files(paths: tuple[str, ...]) -> str:
    """The sources' hash, once per process: the code a process runs is what it imported, even
    if the files change on disk meanwhile."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(sha256_file(path)[0].encode())
    return digest.hexdigest()


_annotations: dict[tuple[int, int], bool] = {}  # (index, id of a cached signature's parameter)


def _constexpr_annotation(index: int, parameter: inspect.Parameter) -> bool:
    """`self` at 0, or a Constexpr annotation (jit_arg_adapters.is_arg_annotation_constexpr):
    what leaves a parameter out of the compiled function's signature."""
    found = _annotations.get((index, id(parameter)))
    if found is None:
        found = _annotations[index, id(parameter)] = _annotated_constexpr(index, parameter)
    return found


def _annotated_constexpr(index: int, parameter: inspect.Parameter) -> bool:
    from cutlass import Constexpr

    annotation = parameter.annotation
    if index == 0 and parameter.name in ("self", "cls"):
        return True
    if annotation is Constexpr or typing.get_origin(annotation) is Constexpr:
        return True
    return isinstance(annotation, type) and issubclass(annotation, Constexpr)


def _is_constexpr(index: int, parameter: inspect.Parameter, value) -> bool:
    """The DSL's rule (jit_arg_adapters.is_argument_constexpr): a constant annotation, or a
    type passed where no other annotation says otherwise, or None: baked into the binary."""
    annotation = parameter.annotation
    if _constexpr_annotation(index, parameter):
        return True
    if value is None:
        return True
    if isinstance(value, type):
        return annotation is inspect.Parameter.empty or typing.get_origin(annotation) is type
    return False


def _effective_options(compile_callable, options) -> dict:
    """{option class name: value} of what the compile uses, defaults left out: once per set of
    option values (`cute.compile[...]` makes a new CompileCallable at every call site run)."""
    last = _last_options
    if last[0] is compile_callable and last[1] == options:  # `cute.compile` itself, mostly
        return dict(last[2])
    chosen = compile_callable._compile_options.options
    try:
        values = tuple((cls, option.value) for cls, option in chosen.items())
        return _options_of(values, options if isinstance(options, str) else None, compile_callable)
    except TypeError:  # an unhashable option value: worked out afresh
        return _work_out_options(compile_callable, options)


_options_cache: dict = {}
_last_options: tuple = (None, None, {})  # (the CompileCallable, options, what they were)


def _options_of(values: tuple, options: str | None, compile_callable) -> dict:
    global _last_options
    key = (values, options)
    found = _options_cache.get(key)
    if found is None:
        found = _options_cache[key] = _work_out_options(compile_callable, options)
    _last_options = (compile_callable, options, found)
    return dict(found)


def _work_out_options(compile_callable, options) -> dict:
    from cutlass.base_dsl import compiler

    if isinstance(options, str) and options:
        chosen = compiler._parse_compile_options_from_str(options)
        for selector in (compiler.FrontendNext, compiler.DisableCuteExtCompile):
            if compile_callable._compile_options.options[selector].value:
                chosen.options[selector].value = True
    else:
        chosen = compile_callable._compile_options
    found = {}
    for cls, option in chosen.options.items():
        default = cls(cls._default).value if hasattr(cls, "_default") else None
        if option.value != default:
            found[cls.__name__] = option.value
    return found


@functools.cache
def _wrapper_spec(target, env_streams: tuple) -> dict:
    """What the compiled function takes when called, as the DSL's get_kwargs_wrapper_spec
    says it: the parameters not annotated as constants and not the environment's stream,
    positional then keyword-only, with their defaults."""
    names, defaults, kwonly, kwonly_defaults = [], [], [], {}
    for index, (name, parameter) in enumerate(_signature(target).parameters.items()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in env_streams:
            continue
        if _constexpr_annotation(index, parameter):
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kwonly.append(name)
            if parameter.default is not inspect.Parameter.empty:
                kwonly_defaults[name] = parameter.default
        else:
            names.append(name)
            if parameter.default is not inspect.Parameter.empty:
                defaults.append(parameter.default)
    plain = all(isinstance(v, (int, float, bool, str, type(None))) for v in [*defaults,
                *kwonly_defaults.values()])  # fmt: skip
    return {"arg_names": names, "arg_defaults": defaults if plain else None,
            "kwonly_names": kwonly, "kwonly_defaults": kwonly_defaults if plain else None,
            "env_streams": list(env_streams)}  # fmt: skip


def _is_env_stream(value) -> bool:
    return bool(getattr(value, "use_tvm_ffi_env_stream", False))


@functools.cache
def _dsl():
    """(cutlass, cutlass.cute.runtime), imported once: describing runs on every served call."""
    import cutlass
    from cutlass.cute import runtime as cute_runtime

    return cutlass, cute_runtime


class _Describer:
    """Describes arguments (identity, example) with one numbering of symbolic sizes per call:
    the same SymInt object in two arguments is one variable of the compiled function."""

    def __init__(self):
        self.symbols: dict[int, int] = {}
        self.describing: set[int] = set()  # objects whose state is being described (cycles)

    def argument(self, value, constant: bool, where: str):
        cutlass, cute_runtime = _dsl()

        if isinstance(value, cute_runtime._Tensor):
            return self._dlpack_tensor(value)
        if isinstance(value, cute_runtime._FakeTensor):
            return self._fake_tensor(value), None
        if isinstance(value, cute_runtime._Pointer):  # make_ptr: its address is a value
            return {"pointer": {"dtype": value._dtype.__name__, "memspace": value._addr_space.name,
                                "align": value._assumed_align}}, int(value._pointer)  # fmt: skip
        if _is_stream(value):
            return self._stream(value)
        if type(value).__name__ == "SymInt":
            return {"sym": self._symbol(value)}, None
        if isinstance(value, type) and issubclass(value, cutlass.Numeric):
            return {"dsl_type": value.__name__}, None
        if isinstance(value, cutlass.Numeric):
            number = {"numeric": type(value).__name__}
            if constant:
                return {**number, "value": value.value}, None
            return number, value.value
        if isinstance(value, (bool, int, float, str)) or value is None:
            kind = type(value).__name__
            return ({"py": kind, "value": value}, None) if constant else ({"py": kind}, value)
        if isinstance(value, (tuple, list)) and constant:
            items = [self.argument(item, True, f"{where}[{i}]")[0] for i, item in enumerate(value)]
            return {"tuple": items}, None
        if isinstance(value, enum.Enum) and constant:  # by name: its class holds the rest
            return {"enum": _qualified(type(value)), "name": value.name}, None
        if constant and hasattr(value, "__dict__") and not inspect.isroutine(value):
            if id(value) in self.describing:
                raise NotRecreatable(f"{where}: refers to itself, which records cannot hold")
            self.describing.add(id(value))
            state = {}
            for attr, item in sorted(vars(value).items()):
                state[attr] = self.argument(item, True, f"{where}.{attr}")[0]
            self.describing.discard(id(value))
            return {"object": _qualified(type(value)), "state": state}, None
        raise NotRecreatable(f"{where}: a {type(value).__module__}.{type(value).__qualname__} "
                             "cannot be described as data")  # fmt: skip

    def _symbol(self, sym) -> dict:
        number = self.symbols.setdefault(id(sym), len(self.symbols))
        return {"n": number, "width": sym.width, "div": sym.divisibility, "symbol": sym.symbol}

    def _dim(self, value):
        return {"sym": self._symbol(value)} if type(value).__name__ == "SymInt" else value

    def _fake_tensor(self, tensor) -> dict:
        return {"fake": {
            "dtype": tensor.element_type.__name__,
            "shape": [self._dim(d) for d in tensor.shape],
            "stride": [self._dim(d) for d in tensor.stride],
            "memspace": str(tensor.memspace),
            "align": tensor._assumed_align,
            "stride32": bool(tensor._use_32bit_stride),
        }}  # fmt: skip

    def _dlpack_tensor(self, tensor):
        if tensor._dltensor_wrapper is None:
            tensor.load_dltensor()
        wrapper = tensor._dltensor_wrapper
        identity = {"dlpack": {
            "dtype": tensor.element_type.__name__,
            "layout": wrapper.cache_key(),  # memory space, static sizes, ? for dynamic modes
            "align": tensor._assumed_align,
            "stride32": bool(tensor._use_32bit_stride),
            "tvm_ffi": hasattr(tensor, "_tvm_ffi_tensor"),
        }}  # fmt: skip
        example = {
            "shape": list(tensor.shape),
            "stride": list(tensor.stride),
            "storage": str(wrapper.dtype),
            "marks": getattr(tensor, "_cute_aot_marks", None),
        }
        return identity, example

    @staticmethod
    def _stream(value):
        if hasattr(value, "use_tvm_ffi_env_stream"):
            return {"stream": "env" if value.use_tvm_ffi_env_stream else "fake"}, None
        handle = int(value)
        return {"stream": "cuda", "null": handle == 0}, handle


def _is_stream(value) -> bool:
    kind = type(value)
    return kind.__name__ in ("CUstream", "_FakeStream") or hasattr(value, "use_tvm_ffi_env_stream")


def signature_mismatch(derived: dict, spec_of) -> str | None:
    """None when `spec_of(env stream names)` (the DSL's get_kwargs_wrapper_spec) names the
    arguments `derived` does; else the difference in words."""
    try:
        actual = spec_of(derived["env_streams"])
    except Exception:  # an older cutlass-dsl: nothing to compare against
        return None
    wanted = (list(actual.arg_names), list(actual.kwonly_names))
    mine = (list(derived["arg_names"]), list(derived["kwonly_names"]))
    if wanted != mine:
        return f"derived signature {mine} differs from the compiled function's {wanted}"
    return None
