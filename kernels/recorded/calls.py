"""A live `cute.compile` call as data: the key of the recorded family, with no tracing.

Used where cutlass is already imported (inside `cute.compile`, and by the build's replay), so
the cutlass names below are looked up lazily. What is described, and why:

- the target: `module:qualname` of the `@cute.jit` function, resolved exactly as
  `CompileCallable._compile` does (a bound method or a kernel object puts the object first);
  a kernel object is described by its class and its `__dict__` (the DSL bakes `self` in), a
  class among its constants by its importable name;
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

import dataclasses
import enum
import functools
import inspect
import operator
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.digest import source_digest
from cute_aot.artifacts.toolchain import CODEGEN_ENV
from cute_aot.kernels.recorded import (
    RecordedCallKey,
    asks_tvm_ffi,
    call_id_of_escaped,
    canonical,
    escaped_json,
)

# Options that say where files go, or which architecture: never part of the identity.
HOST_OPTIONS = frozenset(
    {
        "GPUArch",
        "KeepCUBIN",
        "KeepPTX",
        "KeepSASS",
        "DumpDir",
        "FlattenLocsOutputJsonPath",
        "RemarkOutput",
    }
)


class NotRecreatable(Exception):
    """This call cannot be described as data a CPU can replay; str() says why."""


@dataclass
class Call:
    """One `cute.compile` call: its identity, what a replay needs, and how to call its result.
    Made by describe_call, which writes the identity's JSON and that JSON escaped from cached
    pieces; a hit remembered before reads nothing else."""

    identity: dict
    signature: dict  # kwargs wrapper spec of the compiled function: names and defaults
    arch: str | None  # the architecture the options name, if they do
    # Per argument (positional, then keyword by name): (its identity, the value given).
    arguments: tuple
    identity_json: str  # canonical(identity): what tells one compiled kernel from another
    escaped_json: str  # that text escaped as a JSON string's inside: what its id hashes

    def key(self, hardware: dict | None = None, device: dict | None = None) -> RecordedCallKey:
        """The key, with the hardware answers its trace got and the GPU that gave them."""
        replay = {"examples": self.examples, "hardware": hardware or {}}
        if device is not None:
            replay["device"] = device
        return RecordedCallKey(call=self.identity_json, replay=canonical(replay))

    @functools.cached_property
    def call_id(self) -> str:
        """The id a kernel of this call has where its trace asked the GPU nothing (a hit
        remembered before needs none: worked out on first use)."""
        return call_id_of_escaped(self.escaped_json)

    @functools.cached_property
    def tvm_ffi(self) -> bool:
        """Whether the caller compiled for TVM-FFI (then it calls a TVM-FFI function)."""
        return asks_tvm_ffi(self.identity)

    @functools.cached_property
    def examples(self) -> list:
        """Per argument: the concrete value a replay needs (a dynamic one's), else None. Only a
        record or a miss asks: a hit needs the call's id alone."""
        return [_example(described, value) for described, value in self.arguments]

    @property
    def target(self) -> str:
        target = self.identity["target"]
        return target.get("function") or target["object"]


def resolve_target(func, args: tuple) -> tuple[object, tuple]:
    """(the undecorated function, the arguments it is traced with), as `_compile` does."""
    if inspect.ismethod(func):
        args, func = (func.__self__, *args), func.__func__
    elif not inspect.isfunction(func) and _called_as_object(type(func)):
        args, func = (func, *args), type(func).__call__
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func, tuple(args)


@functools.cache
def _called_as_object(kind: type) -> bool:
    """Whether instances of `kind` are compiled as kernel objects (a plain `__call__`)."""
    return inspect.isfunction(inspect.getattr_static(kind, "__call__", None))


def describe_call(compile_callable, func, args: tuple, kwargs: dict) -> Call:
    """The Call of `compile_callable(func, *args, **kwargs)`; NotRecreatable when it has none."""
    kwargs = {
        k: v for k, v in kwargs.items() if k not in ("trace_finalize_hooks", "is_experimental")
    }
    options = kwargs.pop("options", None)
    target, args = resolve_target(func, args)
    name = _qualified_once(target)
    try:
        bound = _bind(target, args, kwargs)
    except (TypeError, ValueError, NameError) as exc:
        raise NotRecreatable(f"{name}: arguments do not bind to its signature ({exc})") from exc
    for variadic in _variadic(target):
        if bound.get(variadic):
            raise NotRecreatable(f"{name}: takes *{variadic}, which records do not hold")
    describer = _Describer()
    described_args, pieces, escaped_pieces, env_streams = [], [], [], set()
    first_constant = False
    flags = _parameters(target)
    cute_runtime = _dsl()[1]
    tensor, fake_tensor, fake_stream = (
        cute_runtime._Tensor,
        cute_runtime._FakeTensor,
        cute_runtime._FakeStream,
    )
    for index, (param, value) in enumerate(bound.items()):
        parameter = flags[param]
        annotated, takes_type, _, _, written = parameter
        # the DSL's rule (jit_arg_adapters.is_argument_constexpr): `self` first, a constant
        # annotation, None, or a type where no other annotation says otherwise
        constant = (
            annotated
            or value is None
            or (index == 0 and param in _SELF)
            or (takes_type and isinstance(value, type))
        )
        # What the common kinds are made of, inline (a hit describes every argument): the
        # cache's key. A float by its repr, which tells -0.0 from 0.0 and keeps NaN one value.
        kind = type(value)
        if kind in _PLAIN:
            if not constant:
                made_of = kind
            else:
                made_of = (kind, repr(value)) if kind is float else (kind, value)
        elif kind is tensor:
            made_of = describer.dlpack_facts(value)
        elif kind is fake_tensor:  # its symbols numbered in this call, as its description has
            made_of = describer.fake_facts(value)
        elif kind is fake_stream:
            made_of = (kind, bool(value.use_tvm_ffi_env_stream))
        elif _is_cuda_stream(kind):
            made_of = (kind, int(value) == 0)
        elif not constant and _is_numeric(kind):  # a dynamic scalar: its type says it all
            made_of = kind
        elif constant and _described_by_state(kind):  # a kernel object, mostly: `self`
            made_of = _state_facts(value)  # None: not plain values alone, described afresh
        else:
            made_of = None  # described afresh
        found = written.get(made_of) if made_of is not None else None
        if found is None:
            found = _written(describer, parameter, param, value, constant, made_of)
        described, piece, escaped_piece = found
        described_args.append(described)
        pieces.append(piece)
        escaped_pieces.append(escaped_piece)
        if index == 0:
            first_constant = constant
        if described is _ENV_STREAM:
            env_streams.add(param)
    owner = type(args[0]) if args and first_constant and not inspect.isfunction(func) else None
    target_data, source, tail, tail_escaped = _target_facts(target, name, owner)
    chosen = _effective_options(compile_callable, options)
    env = settings.environment(CODEGEN_ENV)
    identity = {
        "target": target_data,
        "source": source,
        "args": [[param, entry] for param, entry in zip(bound, described_args, strict=True)],
        "options": chosen.identity,
        "env": env,
    }
    # canonical(identity), its keys in sorted order, written from the pieces' cached JSON; and
    # so its escaped text, which spares escaping 3 KB for the call's id
    env_json, env_escaped = _env_json(tuple(env.items()))
    written = _LAYOUT.format(",".join(pieces), env_json, chosen.json, tail)
    escaped = _LAYOUT_ESCAPED.format(
        ",".join(escaped_pieces), env_escaped, chosen.escaped, tail_escaped
    )
    arch = chosen.arch
    env_streams |= _env_stream_defaults(target) - bound.keys()
    if env_streams:  # in the signature's order, as the DSL's spec names them
        env_streams = [param for param in flags if param in env_streams]
    signature = _wrapper_spec(target, tuple(env_streams))
    arguments = tuple(zip(described_args, bound.values(), strict=True))
    return Call(identity, signature, arch, arguments, written, escaped)


_SELF = ("self", "cls")
# How canonical(identity) is laid out (keys sorted: args, env, options, then the target's tail
# from "source" on), and that layout escaped: the escaped text of pieces put together is the
# escaped text of the whole.
_LAYOUT = '{{"args":[{}],"env":{},"options":{},{}'
_LAYOUT_ESCAPED = escaped_json(_LAYOUT)


@functools.cache
def _target_facts(target, name: str, owner: type | None) -> tuple[dict, str, str, str]:
    """(the identity's target, its source hash, how its JSON ends from "source" on, that end
    escaped) of a function compiled, or of a kernel object's class and its `__call__`."""
    target_data: dict = {"function": name}
    files = {_source_file(target)}
    if owner is not None:
        target_data = {"function": name, "object": _qualified(owner)}
        files.add(_source_file(owner))
    source = _hash_files(tuple(sorted(f for f in files if f)))
    tail = f'"source":{canonical(source)},"target":{canonical(target_data)}}}'
    return target_data, source, tail, escaped_json(tail)


@functools.lru_cache(maxsize=64)
def _env_json(items: tuple) -> tuple[str, str]:
    text = canonical(dict(items))
    return text, escaped_json(text)


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
        raise NotRecreatable(
            f"{module}:{qualname} is defined inside a function (a closure): "
            "a replay cannot import it"
        )
    if module == "__main__":
        raise NotRecreatable(f"{qualname} is defined in __main__: a replay cannot import it")
    owner = sys.modules.get(module)
    if owner is not None and _named(owner, qualname) is None:  # made at run time (type(...))
        raise NotRecreatable(
            f"{module}:{qualname} is made at run time, not defined under that name: a replay "
            "cannot import it"
        )
    return f"{module}:{qualname}"


def _named(owner, qualname: str):
    """What `qualname` names in module `owner` (None where a part is missing)."""
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    return owner


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
    return source_digest(((path, Path(path).read_bytes()) for path in paths), each_hashed=True)


@functools.cache
def _parameters(target) -> dict[str, tuple[bool, bool, str, str, dict]]:
    """name -> (annotated as a constant, a type passed to it is a constant, how the argument's
    entry in the identity JSON opens, that opening escaped, the entries written for it) of each
    parameter (jit_arg_adapters.is_arg_annotation_constexpr), worked out once per target. The
    last is `_written`'s: what an argument is made of -> (its description, its whole entry in
    the identity JSON, that entry escaped)."""
    from cutlass import Constexpr

    found = {}
    for name, parameter in _signature(target).parameters.items():
        annotation = parameter.annotation
        annotated = (
            annotation is Constexpr
            or typing.get_origin(annotation) is Constexpr
            or isinstance(annotation, type)
            and issubclass(annotation, Constexpr)
        )
        takes_type = annotation is inspect.Parameter.empty or typing.get_origin(annotation) is type
        opening = f"[{canonical(name)},"
        found[name] = (annotated, takes_type, opening, escaped_json(opening), {})
    return found


def _bind(target, args: tuple, kwargs: dict) -> dict:
    """{parameter: value given} in the signature's order, as `Signature.bind(...).arguments`
    has it: plainly where nothing is unusual (no variadic or positional-only parameters, every
    required one given, no name twice), else by `inspect`, which raises with the reason."""
    plain = _plain_binding(target)
    if plain is not None and len(args) <= plain[1]:
        names, _, known, required = plain
        arguments = dict(zip(names, args, strict=False))
        if not kwargs or (kwargs.keys() <= known and kwargs.keys().isdisjoint(arguments)):
            if kwargs:
                arguments.update((name, kwargs[name]) for name in names if name in kwargs)
            if required <= arguments.keys():
                return arguments
    return _signature(target).bind(*args, **kwargs).arguments


@functools.cache
def _plain_binding(target):
    """(names in order, how many may be given by position, all names, required names), or
    None where the signature is one `_bind` leaves to `inspect`."""
    parameters = list(_signature(target).parameters.values())
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(parameter.kind not in plain for parameter in parameters):
        return None
    names = tuple(parameter.name for parameter in parameters)
    positional = sum(parameter.kind is plain[0] for parameter in parameters)
    required = frozenset(p.name for p in parameters if p.default is inspect.Parameter.empty)
    return names, positional, frozenset(names), required


@functools.cache
def _variadic(target) -> tuple[str, ...]:
    return tuple(
        name
        for name, parameter in _signature(target).parameters.items()
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    )


@dataclass(frozen=True)
class _Options:
    """The options a compile uses, as its identity holds them (never mutated: shared)."""

    identity: dict  # {option class name: value} differing from the defaults, less HOST_OPTIONS
    json: str  # canonical(identity)
    escaped: str  # that text escaped
    arch: str | None  # the GPUArch they name

    @classmethod
    def of(cls, effective: dict) -> _Options:
        identity = {k: v for k, v in effective.items() if k not in HOST_OPTIONS}
        text = canonical(identity)
        return cls(identity, text, escaped_json(text), effective.get("GPUArch") or None)


def _effective_options(compile_callable, options) -> _Options:
    """What the compile uses, defaults left out: once per set of option values
    (`cute.compile[...]` makes a new CompileCallable at every call site run)."""
    text = options if isinstance(options, str) else None
    seen = _by_callable.get((id(compile_callable), text))
    if seen is not None and seen[0] is compile_callable:  # `cute.compile` itself, mostly
        return seen[1]
    chosen = compile_callable._compile_options.options
    try:
        values = (tuple(chosen), tuple(map(_VALUE, chosen.values())))
        found = _options_of(values, text, compile_callable)
    except TypeError:  # an unhashable option value: worked out afresh
        return _Options.of(_work_out_options(compile_callable, options))
    if len(_by_callable) >= 64:  # `cute.compile[...]` made anew at every call site run
        _by_callable.clear()
    _by_callable[(id(compile_callable), text)] = (compile_callable, found)  # held: ids stay
    return found


_VALUE = operator.attrgetter("value")
_options_cache: dict = {}  # (option values, options string) -> _Options
# (id of a CompileCallable, options string) -> (that CompileCallable, its _Options)
_by_callable: dict = {}


def _options_of(values: tuple, options: str | None, compile_callable) -> _Options:
    found = _options_cache.get((values, options))
    if found is None:
        found = _options_cache[(values, options)] = _Options.of(
            _work_out_options(compile_callable, options)
        )
    return found


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
    flags = _parameters(target)
    for index, (name, parameter) in enumerate(_signature(target).parameters.items()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in env_streams:
            continue
        if flags[name][0] or (index == 0 and name in ("self", "cls")):
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kwonly.append(name)
            if parameter.default is not inspect.Parameter.empty:
                kwonly_defaults[name] = parameter.default
        else:
            names.append(name)
            if parameter.default is not inspect.Parameter.empty:
                defaults.append(parameter.default)
    plain = all(
        isinstance(v, (int, float, bool, str, type(None)))
        for v in [*defaults, *kwonly_defaults.values()]
    )
    return {
        "arg_names": names,
        "arg_defaults": defaults if plain else None,
        "kwonly_names": kwonly,
        "kwonly_defaults": kwonly_defaults if plain else None,
        "env_streams": list(env_streams),
    }


@functools.cache
def _env_stream_defaults(target) -> frozenset:
    """Parameters whose default is the environment's stream (what a call leaving them out
    passes): the compiled function does not take them."""
    return frozenset(
        name
        for name, parameter in _signature(target).parameters.items()
        if getattr(parameter.default, "use_tvm_ffi_env_stream", False)
    )


@functools.cache
def _is_numeric(kind: type) -> bool:
    return issubclass(kind, _dsl()[0].Numeric)


@functools.cache
def _described_by_state(kind: type) -> bool:
    """Whether a constant of `kind` is described by its class and its `__dict__` (the last rule
    of _Describer.argument), no rule before it applying."""
    cutlass, cute_runtime = _dsl()
    earlier = (type, bool, int, float, str, tuple, list, enum.Enum, cutlass.Numeric)
    runtime_kinds = (cute_runtime._Tensor, cute_runtime._FakeTensor, cute_runtime._Pointer)
    return (
        not issubclass(kind, earlier + runtime_kinds)
        and kind.__name__ not in ("CUstream", "_FakeStream", "SymInt")
        and not hasattr(kind, "use_tvm_ffi_env_stream")
        and not hasattr(kind, "__get__")  # functions, methods, descriptors: routines
    )


def _state_facts(value) -> tuple | None:
    """What a constant object's description is made of, (its class, its state), where its
    `__dict__` holds plain values and classes alone (each described by itself; a float by its
    repr); None where it holds anything else, whose own state could change unseen."""
    try:
        state = vars(value)
    except TypeError:  # no __dict__ on this instance: argument() says why
        return None
    items = []
    for attr, item in state.items():
        kind = type(item)
        if kind in _PLAIN:
            items.append((attr, kind, repr(item) if kind is float else item))
        elif isinstance(item, type):
            items.append((attr, item))
        else:
            return None
    return (type(value), tuple(items))


@functools.cache
def _is_cuda_stream(kind: type) -> bool:
    """A driver stream handle (described by whether it is the null stream)."""
    return kind.__name__ == "CUstream" and not hasattr(kind, "use_tvm_ffi_env_stream")


@functools.cache
def _dsl():
    """(cutlass, cutlass.cute.runtime), imported once: describing runs on every served call."""
    import cutlass
    from cutlass.cute import runtime as cute_runtime

    return cutlass, cute_runtime


_PLAIN = (bool, int, float, str, type(None))
_ENV_STREAM = {"stream": "env"}
# What an argument is made of -> (its description, its canonical JSON, that JSON escaped): a
# server's arguments repeat (a few dtypes and layouts, the same flags), so the common kinds are
# described and written once. Never mutated; cleared when a program's endless distinct
# constants fill it.
_DESCRIBED: dict[tuple, tuple[dict, str, str]] = {}
_DESCRIBED_MAX = 4096


# Entries a parameter's table (`_parameters`) keeps before it starts again.
_WRITTEN_MAX = 512


def _written(describer, parameter: tuple, param: str, value, constant: bool, made_of):
    """(argument `param`'s description, its entry in the identity JSON, that entry escaped),
    kept in the parameter's table under `made_of` where that is not None: the next call with
    an argument made alike finds the whole entry written."""
    _, _, opening, opening_escaped, written = parameter
    found = _DESCRIBED.get(made_of) if made_of is not None else None
    described, text, escaped = found or describer.described(value, constant, param, made_of)
    entry = (described, f"{opening}{text}]", f"{opening_escaped}{escaped}]")
    if made_of is not None:
        if len(written) >= _WRITTEN_MAX:
            written.clear()
        written[made_of] = entry
    return entry


class _Describer:
    """Describes arguments with one numbering of symbolic sizes per call: the same SymInt
    object in two arguments is one variable of the compiled function."""

    def __init__(self):
        self.symbols: dict[int, int] = {}
        self.describing: set[int] = set()  # objects whose state is being described (cycles)

    def described(self, value, constant: bool, param: str, made_of) -> tuple[dict, str, str]:
        """(argument `param`'s description, its canonical JSON, that JSON escaped), kept in the
        cache under `made_of` where that is not None (describe_call's key of a common kind)."""
        described = self.argument(value, constant, f"argument {param!r}")
        text = canonical(described)
        found = (described, text, escaped_json(text))
        if made_of is not None:
            if len(_DESCRIBED) >= _DESCRIBED_MAX:
                _DESCRIBED.clear()
            _DESCRIBED[made_of] = found
        return found

    def argument(self, value, constant: bool, where: str) -> dict:
        kind = type(value)
        if kind in _PLAIN:  # the most common arguments first: a hit describes every one
            name = kind.__name__
            return {"py": name, "value": value} if constant else {"py": name}
        cutlass, cute_runtime = _dsl()
        if isinstance(value, cute_runtime._Tensor):
            return self._dlpack_tensor(value)
        if isinstance(value, cutlass.Numeric):
            number = {"numeric": kind.__name__}
            return {**number, "value": value.value} if constant else number
        if isinstance(value, cute_runtime._FakeTensor):
            return self._fake_tensor(value)
        if isinstance(value, cute_runtime._Pointer):  # make_ptr: its address is a value
            return {
                "pointer": {
                    "dtype": value._dtype.__name__,
                    "memspace": value._addr_space.name,
                    "align": value._assumed_align,
                }
            }
        if _is_stream(value):
            if hasattr(value, "use_tvm_ffi_env_stream"):
                return _ENV_STREAM if value.use_tvm_ffi_env_stream else {"stream": "fake"}
            return {"stream": "cuda", "null": int(value) == 0}
        if kind.__name__ == "SymInt":
            return {"sym": self._symbol(value)}
        if isinstance(value, type) and issubclass(value, cutlass.Numeric):
            return {"dsl_type": value.__name__}
        if isinstance(value, type) and constant:  # by name: its module holds the rest (a kernel
            return {"class": _qualified(value)}  # object's compile key may hold its class MRO)
        if isinstance(value, (bool, int, float, str)):  # subclasses of the plain types
            name = kind.__name__
            return {"py": name, "value": value} if constant else {"py": name}
        if isinstance(value, (tuple, list)) and constant:
            return {
                "tuple": [
                    self.argument(item, True, f"{where}[{i}]") for i, item in enumerate(value)
                ]
            }
        if isinstance(value, enum.Enum):  # by name: its class holds the rest
            return {"enum": _qualified(kind), "name": value.name}
        container = self._container(value, constant, where)
        if container is not None:
            return container
        if constant and hasattr(value, "__dict__") and not inspect.isroutine(value):
            if id(value) in self.describing:
                raise NotRecreatable(f"{where}: refers to itself, which records cannot hold")
            self.describing.add(id(value))
            state = {
                attr: self.argument(item, True, f"{where}.{attr}")
                for attr, item in sorted(vars(value).items())
            }
            self.describing.discard(id(value))
            return {"object": _qualified(kind), "state": state}
        raise NotRecreatable(
            f"{where}: a {kind.__module__}.{kind.__qualname__} cannot be described as data"
        )

    def _container(self, value, constant: bool, where: str) -> dict | None:
        """A plain container as data, its items described in turn (tensors and all): a
        NamedTuple or a dataclass by its class and fields, a tuple or list passed as a dynamic
        argument, a dict by its items in the order of their keys' descriptions, a frozenset by
        its items in order. None: not a plain container."""
        kind = type(value)
        if isinstance(value, tuple) and hasattr(kind, "_fields"):
            fields = self._fields(value, kind._fields, constant, where)
            return {"namedtuple": _qualified(kind), "fields": fields}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names = [field.name for field in dataclasses.fields(value)]
            return {
                "dataclass": _qualified(kind),
                "fields": self._fields(value, names, constant, where),
            }
        if kind in (tuple, list):  # dynamic here: constant ones are described above
            items = [self.argument(v, constant, f"{where}[{i}]") for i, v in enumerate(value)]
            return {kind.__name__: items}
        if kind is dict:
            return {
                "dict": [
                    [described, self.argument(item, constant, f"{where}[{key!r}]")]
                    for described, key, item in self.ordered_items(value, where)
                ]
            }
        if kind is frozenset:
            items = [self.argument(item, True, f"{where} item") for item in value]
            return {"frozenset": sorted(items, key=canonical)}
        return None

    def ordered_items(self, mapping: dict, where: str) -> list[tuple]:
        """(key's description, key, value) of each item, in the order of the keys' canonical
        JSON: a dict's order of insertion is not part of what it holds."""
        items = [
            (self.argument(key, True, f"{where} key {key!r}"), key, item)
            for key, item in mapping.items()
        ]
        return sorted(items, key=lambda entry: canonical(entry[0]))

    def _fields(self, value, names, constant: bool, where: str) -> list:
        return [
            [name, self.argument(getattr(value, name), constant, f"{where}.{name}")]
            for name in names
        ]

    def _symbol(self, sym) -> dict:
        number = self.symbols.setdefault(id(sym), len(self.symbols))
        return {"n": number, "width": sym.width, "div": sym.divisibility, "symbol": sym.symbol}

    def fake_facts(self, tensor) -> tuple:
        """("fake", dtype, shape, stride, memspace, alignment, 32-bit strides): what its
        description holds, a symbolic size as ("sym", its number in this call, width,
        divisibility, name) and any other with its type: equal facts describe alike."""
        return (
            "fake",
            tensor.element_type.__name__,
            self._dims(tensor.shape),
            self._dims(tensor.stride),
            str(tensor.memspace),
            tensor._assumed_align,
            bool(tensor._use_32bit_stride),
        )

    def _dims(self, values) -> tuple:
        return tuple(
            ("sym", *self._symbol(value).values())
            if type(value).__name__ == "SymInt"
            else (type(value), value)
            for value in values
        )

    def _fake_tensor(self, tensor) -> dict:
        _, dtype, shape, stride, memspace, align, stride32 = self.fake_facts(tensor)
        return {
            "fake": {
                "dtype": dtype,
                "shape": [_dim_described(dim) for dim in shape],
                "stride": [_dim_described(dim) for dim in stride],
                "memspace": memspace,
                "align": align,
                "stride32": stride32,
            }
        }

    @staticmethod
    def dlpack_facts(tensor) -> tuple:
        """("dlpack", dtype, layout, alignment, 32-bit strides, TVM-FFI): what its description
        holds."""
        if tensor._dltensor_wrapper is None:
            tensor.load_dltensor()
        return (
            "dlpack",
            tensor.element_type.__name__,
            tensor._dltensor_wrapper.cache_key(),  # static sizes, ? for dynamic modes
            tensor._assumed_align,
            bool(tensor._use_32bit_stride),
            hasattr(tensor, "_tvm_ffi_tensor"),
        )

    def _dlpack_tensor(self, tensor) -> dict:
        _, dtype, layout, align, stride32, tvm_ffi = self.dlpack_facts(tensor)
        return {
            "dlpack": {
                "dtype": dtype,
                "layout": layout,
                "align": align,
                "stride32": stride32,
                "tvm_ffi": tvm_ffi,
            }
        }


# Where the hook (runtime/compile_hook.py) logs a tensor's `mark_*` calls, as they were given:
# [(method name, args, kwargs)]. A tensor does not keep its marks; a replay needs them.
MARKS_ATTRIBUTE = "_cute_aot_marks"


def logged_marks(tensor) -> list | None:
    """The tensor's logged marks as a record keeps them: [name, {parameter: value}] each, the
    method's defaults applied and tuples as lists (None: none logged)."""
    logged = tensor.__dict__.get(MARKS_ATTRIBUTE)
    if logged is None:
        return None
    spelled = []
    for name, args, kwargs in logged:
        bound = _mark_signature(name).bind(tensor, *args, **kwargs)
        bound.apply_defaults()
        arguments = {
            parameter: list(value) if isinstance(value, tuple) else value
            for parameter, value in bound.arguments.items()
            if parameter != "self"
        }
        spelled.append([name, arguments])
    return spelled


@functools.cache
def _mark_signature(name: str) -> inspect.Signature:
    method = getattr(_dsl()[1]._Tensor, name)
    return inspect.signature(getattr(method, "__wrapped__", method))


def _dim_described(dim: tuple):
    """A size of a fake tensor's facts as its description holds it."""
    if dim[0] == "sym":
        _, number, width, divisibility, name = dim
        return {"sym": {"n": number, "width": width, "div": divisibility, "symbol": name}}
    return dim[1]


def _example(described: dict, value):
    """What a replay needs of an argument besides its description: the value of a dynamic one
    (a tensor's shape, strides and marks; an address; a stream handle; a scalar), else None."""
    if "dlpack" in described:
        return {
            "shape": list(value.shape),
            "stride": list(value.stride),
            "storage": str(value._dltensor_wrapper.dtype),
            "marks": logged_marks(value),
        }
    if "pointer" in described:
        return int(value._pointer)
    if described.get("stream") == "cuda":
        return int(value)
    if "value" not in described and "numeric" in described:
        return value.value
    if "value" not in described and "py" in described:
        return value
    return _container_example(described, value)


def _container_example(described: dict, value):
    """The examples of a container's items, in the order of its description (None where no
    item has one: constants alone)."""
    if "fields" in described:  # a NamedTuple or a dataclass
        items = [_example(item, getattr(value, name)) for name, item in described["fields"]]
    elif "tuple" in described or "list" in described:
        parts = described.get("tuple", described.get("list"))
        items = [_example(item, v) for item, v in zip(parts, value, strict=True)]
    elif "dict" in described:
        ordered = _Describer().ordered_items(value, "key")
        items = [
            _example(item, v)
            for (_, item), (_, _, v) in zip(described["dict"], ordered, strict=True)
        ]
    else:
        return None
    return items if any(item is not None for item in items) else None


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
