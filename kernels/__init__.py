"""Kernel families, found through the entry-point group ``cute_aot.families``.

Each entry point names a `KernelFamily` instance (kernels/contract.py). Ours register exactly as
another project's would, in pyproject.toml. A family whose package fails to
import is left out with one warning naming it; the others keep working.
"""

from __future__ import annotations

import ast
import functools
import threading
import warnings
from importlib import metadata
from pathlib import Path

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.artifacts.digest import file_source, source_digest
from cute_aot.artifacts.digest import module_file as _module_file
from cute_aot.artifacts.digest import module_source as _module_source
from cute_aot.kernels.contract import (
    CAPABILITIES,
    Adapter,
    Dispatch,
    KernelFamily,
    ModelShapes,
    Patch,
    TensorArg,
    TorchModelShapes,
    TorchReference,
    Tuner,
    TuningCache,
    ValueArg,
    capability,
    requirements,
)
from cute_aot.kernels.tables import BuildTables

__all__ = [
    "CAPABILITIES",
    "ENTRY_POINT_GROUP",
    "Adapter",
    "Dispatch",
    "KernelFamily",
    "ModelShapes",
    "Patch",
    "TensorArg",
    "TorchModelShapes",
    "TorchReference",
    "Tuner",
    "TuningCache",
    "ValueArg",
    "capability",
    "families",
    "family",
    "bundle_facts",
    "family_facts",
    "foreign_facts",
    "forget_families",
    "installed_family",
    "registered",
    "source_hash",
    "source_is_current",
    "table_records",
]

ENTRY_POINT_GROUP = "cute_aot.families"

_lock = threading.RLock()
_points: dict[str, metadata.EntryPoint] | None = None  # name -> its entry point, found once
_loaded: dict[str, KernelFamily | None] = {}  # name -> the family, None: left out (warned)
_NOT_LOADED = object()


def _warn(message: str) -> None:
    warnings.warn(f"cute-aot: {message}", RuntimeWarning, stacklevel=4)


def _entry_points() -> dict[str, metadata.EntryPoint]:
    """name -> entry point of every registered family (reading metadata, importing nothing)."""
    global _points
    with _lock:
        if _points is None:
            found: dict[str, metadata.EntryPoint] = {}
            points = metadata.entry_points(group=ENTRY_POINT_GROUP)
            for point in sorted(points, key=lambda p: p.name):
                if point.name in found:
                    _warn(
                        f"kernel family {point.name!r} is registered twice; "
                        f"{_package(point)!r} ({point.value}) is ignored"
                    )
                    continue
                found[point.name] = point
            _points = found
        return _points


def _package(point: metadata.EntryPoint) -> str:
    return point.dist.name if point.dist else point.value


def _load(name: str) -> KernelFamily | None:
    """The family registered as `name`, imported on first use; None when it is not registered
    or its package fails to import (one warning naming it; the others keep working)."""
    found = _loaded.get(name, _NOT_LOADED)  # without the lock: a served call's first use asks
    if found is not _NOT_LOADED:
        return found
    with _lock:
        if name in _loaded:
            return _loaded[name]
        point = _entry_points().get(name)
        candidate = None
        if point is not None:
            try:
                candidate = point.load()
                if isinstance(candidate, type):
                    candidate = candidate()
                if not isinstance(candidate, KernelFamily):
                    raise TypeError(
                        f"{point.value} is a {type(candidate).__name__}, not a KernelFamily"
                    )
                if candidate.name != point.name:
                    raise ValueError(
                        f"{point.value} is named {candidate.name!r}, not {point.name!r}"
                    )
            except Exception as exc:  # one broken plug-in must not take the others down
                _warn(
                    f"kernel family {point.name!r} from package {_package(point)!r} "
                    f"({point.value}) is left out: {type(exc).__name__}: {exc}"
                )
                candidate = None
        _loaded[name] = candidate
        return candidate


def registered(name: str) -> bool:
    """Whether a family of this name is registered (nothing is imported to tell)."""
    return name in _entry_points()


def installed_family(name: str) -> KernelFamily | None:
    """The installed family `name`, or None; imports that family only (loading a bundle must
    not pay for every other installed family)."""
    return _load(name)


def families() -> dict[str, KernelFamily]:
    """name -> family, every installed one (each imported once per process)."""
    loaded = {name: _load(name) for name in _entry_points()}
    return {name: found for name, found in loaded.items() if found is not None}


def forget_families() -> None:
    """Discover again on next use (after installing a family package into a running process)."""
    global _points
    with _lock:
        _points = None
        _loaded.clear()
    source_hash.cache_clear()
    _recorded_hash.cache_clear()
    foreign_facts.cache_clear()


def family(name: str) -> KernelFamily:
    """The installed family called `name`."""
    found = _load(name)
    if found is None:
        known = ", ".join(families()) or "none"
        raise UnsupportedProblemError(
            f"unknown kernel family {name!r}; installed: {known} "
            f"(families register under the entry-point group {ENTRY_POINT_GROUP!r})"
        )
    return found


def hash_modules(modules: list[str]) -> str:
    """sha256 over the named modules' current source files (read, never imported)."""
    return source_digest((module, _module_source(module)) for module in sorted(modules))


def source_is_current(name: str, facts: dict) -> bool:
    """Whether the installed sources of family `name` are the ones a bundle's facts recorded.

    A bundle records the modules it hashed (`source_modules`), so this re-hashes exactly those
    files: no import graph to parse at load. A module added to the graph changes a file that
    imports it, and one removed or moved reads as absent: either way the hash differs. Bundles
    without the list are compared with the full `source_hash`."""
    found = family(name)
    if found.builder_version is not None:
        return facts.get("source_hash") in {source_hash(name), *found.earlier_source_hashes}
    modules = facts.get("source_modules")
    if isinstance(modules, list) and modules and all(isinstance(m, str) for m in modules):
        root = found.builder.split(".")[0]
        if all(m.split(".")[0] == root or m == KEY_MODULE for m in modules):
            return _recorded_hash(tuple(modules)) == facts.get("source_hash")
    return source_hash(name) == facts.get("source_hash")


@functools.cache
def _recorded_hash(modules: tuple[str, ...]) -> str:
    return hash_modules(list(modules))


@functools.cache
def source_hash(name: str) -> str:
    """sha256 of exactly the code that shapes a family's binaries: its builder module and every
    module the builder imports from its own package, transitively, plus the key module (symbol
    names are in every binary). The family's pure-Python module (dispatch rule, tuned tables) is
    left out: a table tweak changes which key a problem asks for, never a key's binary, so it must
    not make deployed bundles stale. Files are read, never imported: no cutlass on servers.
    A family with a `builder_version` is identified by that version instead of files."""
    version = family(name).builder_version
    if version is not None:
        return source_digest([("builder_version", f"{name} {version}".encode())])
    return hash_modules(binary_modules(name))


def binary_modules(name: str) -> list[str]:
    """The modules whose source is in `source_hash(name)`, sorted (none for a family identified
    by its builder_version)."""
    found = family(name)
    if found.builder_version is not None:
        return []
    own_module = type(found).__module__
    root = found.builder.split(".")[0]
    # cute-aot's own families: their kernel code only (cute_aot.kernels); settings, errors and
    # the rest of cute-aot's infrastructure never move a family's identity.
    scope = KERNELS_PACKAGE if root == "cute_aot" else root
    seen, todo = {KEY_MODULE}, [found.builder]
    while todo:
        module = todo.pop()
        if module in seen or module == own_module:
            continue
        seen.add(module)
        todo += [
            name for name in _imports(module, root) if name == scope or name.startswith(scope + ".")
        ]
    return sorted(seen)


KERNELS_PACKAGE = "cute_aot.kernels"
KEY_MODULE = "cute_aot.kernels.keys"


def _imports(module: str, root: str) -> list[str]:
    """Modules of package `root` that `module` imports (absolute names; `from a import b` gives
    a.b when that is a module), read from its source with ast. Other packages are never looked
    up: finding `cutlass.x` would import cutlass."""
    origin = _module_file(module)
    if origin is None or not origin.endswith(".py"):
        return []
    tree = ast.parse(Path(origin).read_bytes(), origin)
    package = module if origin.endswith("__init__.py") else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.append(base)
            # `from package import module`: look submodules up in packages only (finding
            # `module.name` would import `module`)
            if base.split(".")[0] == root and (_module_file(base) or "").endswith("__init__.py"):
                names += [
                    f"{base}.{alias.name}"
                    for alias in node.names
                    if _module_file(f"{base}.{alias.name}")
                ]
    return [name for name in names if name.split(".")[0] == root]


def family_facts(name: str) -> dict:
    """What a bundle records about a family it holds, and what staleness compares at load."""
    found = family(name)
    facts = {
        "version": found.version,
        "source_hash": source_hash(name),
        "source_modules": binary_modules(name),  # what staleness re-hashes at load
        "abi": found.abi_record(),
    }
    if requirements(found):
        facts["foreign"] = foreign_facts(name)
    return facts


def table_records(names, arch: str, tables: BuildTables | None = None) -> dict[str, dict]:
    """family -> the record of the table its keys for `arch` were enumerated with (`tables`,
    else the family's default table; a family with neither has none)."""
    records = {}
    for name in sorted(names):
        table = (tables or {}).get((name, arch)) or family(name).default_table(arch)
        if table is not None:
            records[name] = table.record()
    return records


def bundle_facts(names, arch: str, tables: dict[str, dict] | None = None) -> dict[str, dict]:
    """family -> what a bundle of `arch` records of it (artifacts.pack): its facts, and the
    record of the table its keys were enumerated with (`tables`: family -> record, see
    table_records; None: the packages' own)."""
    facts = {name: family_facts(name) for name in sorted(names)}
    records = table_records(facts, arch) if tables is None else tables
    for name, record in records.items():
        facts[name]["table"] = record
    return facts


@functools.cache
def foreign_facts(name: str) -> dict[str, dict[str, str | None]]:
    """{distribution: {version, source_hash}} of the other distributions a family's kernels come
    from (an Adapter's `requires`); the hash covers the files named in its `foreign_sources`.
    Read from the installed files, never imported (importing FlashInfer imports cutlass)."""
    adapter = capability(family(name), Adapter)
    if adapter is None:
        return {}
    facts = {}
    for distribution in adapter.requires:
        try:
            installed = metadata.distribution(distribution)
        except metadata.PackageNotFoundError:
            facts[distribution] = {"version": None, "source_hash": None}
            continue
        digest = source_digest(
            (relative, file_source(Path(str(installed.locate_file(relative)))))
            for owner, relative in adapter.foreign_sources
            if owner == distribution
        )
        facts[distribution] = {"version": installed.version, "source_hash": digest}
    return facts
