"""The kernel-family contract: what a family declares so that the build, the runtime and
`aot-cache` serve it without knowing anything else about it.

A family is one object, a `KernelFamily` subclass instance, registered under the Python entry-point
group ``cute_aot.families`` (ours exactly as another project's)::

    [project.entry-points."cute_aot.families"]
    rmsnorm = "my_kernels.rmsnorm:family"

The object and the module that defines it are pure Python: a server imports them on its call
path, so they never import cutlass (and import torch only inside the methods that take tensors).
The CuTe DSL code lives in the module named by `builder`, imported only to build or to JIT.

`KernelFamily` is the required part, what every family needs to be built and served: identity
(name, version), the Key class, archs, the exported function's ABI, the problems of a shape (key
enumeration), dispatch (a pure function of problem, arch and table) and compile(key, arch).

Everything else is an optional protocol below, implemented by defining its members (another
project's family needs no import of them) or by subclassing it for its defaults. Callers ask
`capability(family, Protocol)`, the one check, and never probe attributes themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.arch import normalize_arch
from cute_aot.kernels.keys import KernelKey
from cute_aot.kernels.tables import Table

Shape = tuple[int, ...]
Problem = tuple


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument of a family's exported function (and of its op)."""

    name: str
    dtype: str  # torch dtype name: "bfloat16", "float32", "float8_e4m3fn"
    rank: int
    layout: str = "row-major"  # contiguous, innermost dimension last
    align_bytes: int = 16  # of the base address
    output: bool = False  # written by the kernel; the op allocates it when the caller does not
    # The op accepts None here (e.g. a bias); the family's `bind` then gives the exported
    # function what its key's kernel ignores.
    optional: bool = False

    def describe(self) -> str:
        role = "out" if self.output else "in"
        return (
            f"{role} {self.name}{' (or None)' if self.optional else ''}: {self.dtype} rank "
            f"{self.rank} {self.layout}, {self.align_bytes}-byte aligned"
        )

    def record(self) -> dict[str, Any]:
        """As manifest data (`optional` only where set, so older records stay equal)."""
        fields = asdict(self)
        if not self.optional:
            del fields["optional"]
        return fields


@dataclass(frozen=True)
class ValueArg:
    """A non-tensor argument of an exported function: an integer, a device pointer or a CUDA
    stream (what a foreign library's launcher passes besides tensors)."""

    name: str
    kind: str  # "int64" | "pointer" | "stream"

    def describe(self) -> str:
        return f"in {self.name}: {self.kind}"

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Patch:
    """One attribute of another library that a family replaces to serve prebuilt kernels:
    `replace(original)` returns the replacement, which must fall back to `original` on a miss."""

    owner: Any  # a module or class
    attribute: str
    replace: Callable[[Any], Any]


@dataclass(frozen=True)
class Dispatch:
    """A dispatch decision: the key, and why in words (what `aot-cache explain` prints)."""

    key: KernelKey
    reason: str


class KernelFamily:
    """The required part. Subclass, set the class attributes, implement `dispatch`, `problems`
    and (for a family with an op) `problem`, `input_shapes`, `output_shape`; register an
    instance. The rest has defaults."""

    # -- required --------------------------------------------------------------------------------
    name: ClassVar[str]
    version: ClassVar[int]  # bump when codegen changes in a way the key does not show
    Key: ClassVar[type[KernelKey]]  # frozen (kernels/keys.py): everything that changes the binary
    archs: ClassVar[tuple[str, ...]]  # built for these; the build and the loader respect them
    # The exported function's arguments in order; recorded in each bundle's manifest and compared
    # at load: a bundle built against another ABI is never called.
    abi: ClassVar[tuple[TensorArg | ValueArg, ...]]
    builder: ClassVar[str]  # "package.module" defining compile(key, arch)

    def dispatch(self, problem: Problem, arch: str) -> Dispatch:
        """The one rule, with the reason `aot-cache explain` prints. Families with a table take
        `dispatch(problem, arch, table)` (see `default_table`)."""
        raise NotImplementedError

    def problems(self, shape: Shape) -> Iterable[Problem]:
        """Every problem a server asks for with this weight shape (key enumeration)."""
        raise NotImplementedError

    def problem(self, *inputs) -> Problem:
        """The problem of an op call (shapes and dtypes), after the runtime checked the ABI.
        Families with `serves` (Adapter) have no op and leave this out."""
        raise NotImplementedError

    def input_shapes(self, problem: Problem) -> tuple[tuple[int, ...], ...]:
        """The input tensors' shapes of a problem, in ABI order (warm-up fills the op's table)."""
        raise NotImplementedError

    def output_shape(self, problem: Problem) -> tuple[int, ...]:
        raise NotImplementedError

    def parse_problem(self, text: str, dtypes: str | None = None) -> Problem:
        """`aot-cache explain --shape` text (and `--dtype`) -> a problem."""
        raise NotImplementedError

    # -- defaulted -------------------------------------------------------------------------------
    # Where a key already holds the source of what it compiles (a recorded call holds its
    # kernel's own source hash), the builder is identified by an explicit version instead of
    # its files: bumped when what a key means or what the builder makes of it changes, so that
    # an edit of the builder's modules that changes neither leaves shipped bundles current.
    # `earlier_source_hashes`: the file hashes of releases, before the version, that built alike.
    builder_version: ClassVar[str | None] = None
    earlier_source_hashes: ClassVar[frozenset[str]] = frozenset()
    default_shapes: ClassVar[tuple[Shape, ...]] = ()  # what a build enumerates without --shape
    # A shape's dims in order (`aot-build --shape FAMILY:N,K`), for help texts and `parse_ints`;
    # GEMMs write the weight's shape, w [N, K], so every family and command reads one order.
    # Each family also takes its dims named, in any order (`N=256,K=7168`), and may refuse a
    # positional form it could misread (e.g. N > K where that means an older K,N order).
    shape_syntax: ClassVar[str] = ""
    # The one family that `--shape DIMS` without a `FAMILY:` prefix means (older command lines).
    unprefixed_shapes: ClassVar[bool] = False

    def parse_shape(self, text: str) -> Shape:
        """`aot-build --shape` text -> a shape; UnsupportedProblemError when it is not one."""
        return parse_ints(self, text, self.shape_syntax)

    def describe_problem(self, problem: Problem) -> dict[str, Any]:
        """The problem as named fields (miss log, messages)."""
        return {f"p{i}": value for i, value in enumerate(problem)}

    def default_table(self, arch: str) -> Table | None:
        """The tactic table dispatch reads, as data (kernels/tables.py); None when it reads
        none. Bundles carry the table they were built with, and servers dispatch with it."""
        return None

    def bind(self, function, problem: Problem):
        """What the op calls for `problem` with the arguments in ABI order, given the exported
        function. Families with optional inputs wrap `function` here to pass, where the op got
        None, a tensor the kernel of `problem`'s key never reads."""
        return function

    def compile(self, key: KernelKey, arch: str):
        """Cross-compile `key` for `arch` (imports the builder, and with it cutlass)."""
        return importlib.import_module(self.builder).compile(key, arch)

    def enumerate_keys(
        self, arch: str, shapes: Sequence[Shape] | None = None, table: Table | None = None
    ) -> list[KernelKey]:
        """The distinct keys dispatch yields for these shapes (with `table`, for families that
        read one): exactly what servers with this table will ask."""
        shapes = self.default_shapes if shapes is None else shapes
        keys = {
            dispatch_with(self, p, arch, table).key
            for shape in shapes
            for p in self.problems(shape)
        }
        return sorted(keys, key=lambda key: key.canonical_json())

    # -- derived ---------------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[TensorArg, ...]:
        return tuple(arg for arg in self.abi if isinstance(arg, TensorArg) and not arg.output)

    @property
    def output(self) -> TensorArg:
        (out,) = [arg for arg in self.abi if isinstance(arg, TensorArg) and arg.output]
        return out

    def abi_record(self) -> list[dict]:
        """The ABI as manifest data."""
        return [arg.record() for arg in self.abi]

    def supports(self, arch: str) -> bool:
        return arch in self.archs

    def check_arch(self, arch: str) -> str:
        """`arch` normalized ('sm90a' -> 'sm_90a'); UnsupportedProblemError when this family is
        not built for it."""
        arch = normalize_arch(arch)
        if not self.supports(arch):
            raise UnsupportedProblemError(
                f"{self.name} is built for {', '.join(self.archs)}, not {arch}"
            )
        return arch

    def missing_requirements(self) -> str | None:
        """Why this family cannot be built or served in this environment (a distribution its
        Adapter requires is absent or at another version); None when it can."""
        for distribution, version in requirements(self).items():
            try:
                installed = metadata.version(distribution)
            except metadata.PackageNotFoundError:
                return f"{self.name} needs {distribution}=={version}, which is not installed"
            if installed != version:
                return f"{self.name} is built against {distribution}=={version}, not {installed}"
        return None

    def __repr__(self) -> str:
        return f"<kernel family {self.name} v{self.version} ({', '.join(self.archs)})>"


# -- optional protocols ------------------------------------------------------------------------
# Runtime-checkable, so a family that defines the members has the capability whatever it
# subclasses (external families predate these classes); subclassing one gives its defaults.


@runtime_checkable
class ModelShapes(Protocol):
    """Shapes from a model's configuration: `aot-build --model-config` / `--model`."""

    def shapes_from_model(self, config: dict[str, Any]) -> list[Shape]:
        """The shapes a model (a Hugging Face config.json as a dict) needs; [] when none."""
        return []


@runtime_checkable
class TorchModelShapes(Protocol):
    """Shapes from a loaded torch model: what `preload_model` warms up."""

    def shapes_from_torch_model(self, model) -> list[Shape]:
        """The shapes a loaded torch model's weights ask for; [] when none."""
        return []


@runtime_checkable
class TorchReference(Protocol):
    """A torch implementation: tests, `aot-tune`'s correctness check, mode auto's last fallback.
    Without one, a miss that cannot be compiled raises instead."""

    def reference(self, *inputs):
        """The output tensor for these inputs."""
        raise NotImplementedError


@runtime_checkable
class Tuner(Protocol):
    """Several keys can serve a problem: what `aot-tune` times (`aot-build --all-tactics` builds
    them all) and, for a family with a `default_table`, the table made of the winners."""

    def tune_problems(self, shape: Shape) -> Iterable[Problem]:
        """The problems measured for a shape (default: every problem of it)."""
        return self.problems(shape)  # a Tuner is a KernelFamily

    def tune_candidates(self, problem: Problem, arch: str) -> list[KernelKey]:
        """Every key that serves `problem` and is worth timing for it."""
        raise NotImplementedError

    def tuned_table(self, arch: str, winners: list, provenance: dict[str, Any]) -> Table:
        """A table from measurements. winners: [(problem, key, {key id: microseconds})], the
        key being the fastest correct candidate of the problem. A family may also take
        `base=` (a Table): `aot-tune --base` then keeps its rows where nothing new covers them."""
        raise NotImplementedError(f"{type(self).__name__} has no dispatch table to tune")


@runtime_checkable
class TuningCache(Protocol):
    """The served library saves its own autotuning (`aot-build --flashinfer-tuned FILE`)."""

    def keys_from_tuning_cache(self, path: Path, arch: str) -> list[KernelKey]:
        """The keys that library's autotuning chose, read from its saved results (FlashInfer's
        `autotune(cache=FILE)` JSON); [] when the file names nothing of this family."""
        return []


@runtime_checkable
class Adapter(Protocol):
    """Kernels that serve another library's public function (FlashInfer's CuTe DSL kernels)
    instead of a cute-aot op; cute_aot.runtime.serving applies the patches."""

    serves: ClassVar[str]  # the function served, e.g. "flashinfer.mm_mxfp8"
    # The distributions the kernels' code comes from, pinned exactly, and files of theirs: their
    # versions and the files' hash are staleness facts of every bundle.
    requires: ClassVar[dict[str, str]] = {}
    foreign_sources: ClassVar[tuple[tuple[str, str], ...]] = ()  # (distribution, file in it)

    def patches(self, serving) -> list[Patch]:
        """Where the served library looks up its compiled kernels.
        `serving.function(key, arch, problem)` gives the prebuilt function of a key, or None
        where the library should compile as before (mode auto records the miss; mode aot
        raises instead)."""
        raise NotImplementedError


CAPABILITIES: tuple[type, ...] = (
    ModelShapes,
    TorchModelShapes,
    TorchReference,
    Tuner,
    TuningCache,
    Adapter,
)

_Capability = TypeVar("_Capability")


def capability(family: KernelFamily, protocol: type[_Capability]) -> _Capability | None:
    """`family` as a `protocol` of CAPABILITIES when it implements it, else None: the one place
    an optional capability is looked for."""
    return family if isinstance(family, protocol) else None


def requirements(family: KernelFamily) -> dict[str, str]:
    """{distribution: exact version} an Adapter's kernels come from; {} for any other family."""
    adapter = capability(family, Adapter)
    return adapter.requires if adapter is not None else {}


def dispatch_with(family: KernelFamily, problem: Problem, arch: str, table: Table | None):
    """family.dispatch with `table` when there is one (families without tables take none)."""
    if table is None:
        return family.dispatch(problem, arch)
    return family.dispatch(problem, arch, table)


def parse_ints(family: KernelFamily, text: str, syntax: str) -> tuple[int, ...]:
    """The dims `syntax` names (`"M,N,K"`), in that order, from positional text (`"12,256,7168"`)
    or named text in any order (`"M=12,N=256,K=7168"`, names in any case); refuses anything
    else, a mix of both forms included. Every family's shape and problem text is read here."""
    names = [name.strip() for name in syntax.split(",")]
    parts = [part.strip() for part in text.split(",")]
    if "=" in text:
        named = dict(part.partition("=")[::2] for part in parts)
        named = {name.strip().upper(): value for name, value in named.items()}
        wanted = [name.upper() for name in names]
        exact = len(named) == len(parts) and sorted(named) == sorted(wanted)
        parts = [named[name] for name in wanted] if exact else []
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        values = ()
    if len(values) != len(names) or any(value < 1 for value in values):
        example = ",".join(f"{name}=<{name.lower()}>" for name in names)
        raise UnsupportedProblemError(
            f"{family.name}: {text!r} is not {syntax} ({len(names)} positive integers in that "
            f"order, or named: {example})"
        )
    return values


def named_spelling(syntax: str, values: Sequence[int]) -> str:
    """(12, 256, 7168) of "M,N,K" -> "M=12,N=256,K=7168": the form no order can confuse."""
    names = [name.strip() for name in syntax.split(",")]
    return ",".join(f"{name}={value}" for name, value in zip(names, values, strict=True))
