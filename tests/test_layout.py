"""The layout the design asks for: packages depend one way, and the server's runtime stays small.

    artifacts  <-  kernels  <-  aot (the build)  <-  aot.tools (aot-cache, aot-tune)
        ^             ^                                  |
        '---------- runtime (server)  <------------------'

artifacts (the bundle, ELF and fatbin formats) imports none of the others; kernels imports
neither the build nor the runtime; the build (aot/, its tools aside) imports neither the runtime
nor the tools; the server's runtime imports no tool, and the build only lazily (runtime/jit.py
compiles on a miss); the tools sit on top and may import all of it. No cycle between these
layers, nor between packages (folders) at module level. Read from the import statements
themselves (ast), and checked again by importing each layer's modules in a fresh interpreter,
where a cycle shows as an ImportError.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.package_source import parsed

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("artifacts", "kernels", "aot", "runtime")  # folder == cute_aot subpackage name
TOOLS = "cute_aot.aot.tools"  # the operator's tools: above the build and the server
TOOLING = f"{TOOLS}.aot_cache"
TUNING = f"{TOOLS}.aot_tune"  # aot-tune: run on GPU machines, a tool all the same
# The one runtime module that may reach the build, lazily: it compiles and publishes on a miss.
JIT_MODULE = "cute_aot.runtime.jit"


@dataclass(frozen=True)
class Import:
    importer: str  # module doing the import
    target: str  # module imported (for `from a import b`: a.b when b is a module, else a)
    line: int
    module_level: bool  # runs when the importer is imported (not deferred inside a function)


def module_files() -> dict[str, Path]:
    """cute_aot module name -> its source file, for every module of the four packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("cute_aot", *parts))] = path
    return found


MODULES = module_files()


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.function_depth = 0
        self.found: list[Import] = []

    def _deferred(self, node) -> None:
        self.function_depth += 1
        self.generic_visit(node)
        self.function_depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _deferred

    def _add(self, target: str, node: ast.AST) -> None:
        self.found.append(Import(self.module, target, node.lineno, self.function_depth == 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: resolve against the importer's package
            package = self.module if self.is_package else self.module.rpartition(".")[0]
            anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{anchor}.{base}" if base else anchor
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            # `from cute_aot.runtime import paths` imports the module cute_aot.runtime.paths
            self._add(submodule if submodule in MODULES else base, node)


def imports_of(module: str) -> list[Import]:
    path = MODULES[module]
    collector = _ImportCollector(module, path.name == "__init__.py")
    collector.visit(parsed(path))
    return collector.found


ALL_IMPORTS = [found for module in MODULES for found in imports_of(module)]


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def offending(importers, targets: tuple[str, ...], module_level_only: bool = False) -> list[str]:
    return [
        f"{MODULES[i.importer].relative_to(ROOT)}:{i.line} imports {i.target}"
        for i in ALL_IMPORTS
        if importers(i.importer)
        and any(within(i.target, target) for target in targets)
        and (i.module_level or not module_level_only)
    ]


def layer(module: str) -> str:
    """The layer a module belongs to: the tools sit inside aot/'s folder, above the build."""
    if within(module, TOOLS):
        return "tools"
    return module.split(".")[1]


def _build_module(module: str) -> bool:
    return within(module, "cute_aot.aot") and not within(module, TOOLS)


def _server_module(module: str) -> bool:
    return within(module, "cute_aot.runtime")


def test_the_collector_sees_every_package_and_resolves_imports():
    # guards the checks below against passing vacuously
    assert {name.split(".")[1] for name in MODULES} == set(PACKAGES)
    assert f"{TOOLING}.cli" in MODULES and f"{TUNING}.cli" in MODULES and JIT_MODULE in MODULES
    assert {layer(name) for name in MODULES} == {*PACKAGES, "tools"}
    loader_imports = {i.target for i in imports_of("cute_aot.runtime.loader")}
    assert "cute_aot.runtime.library_store" in loader_imports
    assert "cute_aot.artifacts.verify" in loader_imports
    jit_imports = imports_of(JIT_MODULE)
    assert any(within(i.target, "cute_aot.aot") and not i.module_level for i in jit_imports)
    # the tools reach both the build and the runtime: what the layering allows them
    tool_targets = {
        layer(i.target)
        for i in ALL_IMPORTS
        if layer(i.importer) == "tools" and within(i.target, "cute_aot")
    }
    assert {"aot", "runtime"} <= tool_targets


def test_artifacts_import_none_of_the_other_packages():
    bad = offending(
        lambda m: within(m, "cute_aot.artifacts"),
        ("cute_aot.aot", "cute_aot.kernels", "cute_aot.runtime"),
    )
    assert not bad, "the bundle/ELF/fatbin formats sit below everything:\n" + "\n".join(bad)


def test_kernels_import_neither_the_build_nor_the_runtime():
    bad = offending(lambda m: within(m, "cute_aot.kernels"), ("cute_aot.aot", "cute_aot.runtime"))
    assert not bad, "kernel families depend only on artifacts:\n" + "\n".join(bad)


def test_the_build_imports_neither_the_runtime_nor_the_tools():
    bad = offending(_build_module, ("cute_aot.runtime", TOOLS))
    assert not bad, (
        "aot/ must not import runtime/ or its tools (runtime/jit.py imports aot/):\n"
        + ("\n".join(bad))
    )


def test_the_server_runtime_does_not_import_the_build_at_module_level():
    # runtime/jit.py is exempt: it exports and packs what it compiled (and imports that lazily,
    # which the fresh-interpreter test below checks: importing the runtime loads no aot module).
    bad = offending(_server_module, ("cute_aot.aot",), module_level_only=True)
    assert not bad, "a server must not pay for the build:\n" + "\n".join(bad)
    lazy = offending(lambda m: _server_module(m) and m != JIT_MODULE, ("cute_aot.aot",))
    assert not lazy, "only runtime/jit.py reaches the build, on a miss:\n" + "\n".join(lazy)


def test_the_server_runtime_never_imports_the_tools():
    bad = offending(_server_module, (TOOLS,))
    assert not bad, "aot-cache and aot-tune live apart from what a server imports:\n" + (
        "\n".join(bad)
    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan): a cycle's members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _owner(target: str) -> str | None:
    """The module an import target names (`a.b.Name` -> `a.b`), None outside cute_aot."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _folder(module: str) -> str:
    path = MODULES[module]
    return ".".join(("cute_aot", *path.parent.relative_to(ROOT).parts))


def test_no_cycle_between_layers_nor_between_packages():
    # Layers: every import counts, deferred ones too (a lazy import is a dependency all the same).
    layers: dict[str, set[str]] = defaultdict(set)
    # Packages (folders): what runs on import, where a cycle breaks a fresh interpreter.
    folders: dict[str, set[str]] = defaultdict(set)
    for found in ALL_IMPORTS:
        target = _owner(found.target)
        if target is None:
            continue
        if layer(found.importer) != layer(target):
            layers[layer(found.importer)].add(layer(target))
        if found.module_level and _folder(found.importer) != _folder(target):
            folders[_folder(found.importer)].add(_folder(target))
    assert layers["tools"] >= {"aot", "runtime"}  # the graph is read, not empty
    assert not _cycles(layers), f"layers import each other: {_cycles(layers)}"
    assert not _cycles(folders), f"packages import each other: {_cycles(folders)}"


def test_no_family_is_named_in_the_runtime_or_the_build():
    from cute_aot.kernels import families

    names = sorted(families())
    assert names, "no kernel family installed"
    bad = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in ("runtime", "aot")
        for path in sorted((ROOT / package).rglob("*"))
        if path.is_file() and path.suffix in (".py", ".c", ".map")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(name in line for name in names)
    ]
    assert not bad, f"runtime/ and aot/ are generic over families ({names}):\n" + "\n".join(bad)


# -- importing for real ---------------------------------------------------------------------------
_IMPORT_ALL = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(sorted(n for n in sys.modules if n.startswith("cute_aot."))))
"""

# What importing each group may bring in of the other packages (by design, transitively).
GROUPS = {
    "artifacts": (lambda m: within(m, "cute_aot.artifacts"), ("cute_aot.artifacts",)),
    "kernels": (
        lambda m: within(m, "cute_aot.kernels"),
        ("cute_aot.artifacts", "cute_aot.kernels"),
    ),
    "aot (the build)": (
        _build_module,
        ("cute_aot.artifacts", "cute_aot.kernels", "cute_aot.aot"),
    ),
    "runtime (server)": (
        _server_module,
        ("cute_aot.artifacts", "cute_aot.kernels", "cute_aot.runtime"),
    ),
    "aot.tools.aot_cache": (
        lambda m: within(m, TOOLING),
        ("cute_aot.artifacts", "cute_aot.kernels", "cute_aot.aot", "cute_aot.runtime"),
    ),
    "aot.tools.aot_tune": (
        lambda m: within(m, TUNING),
        ("cute_aot.artifacts", "cute_aot.kernels", "cute_aot.aot", "cute_aot.runtime"),
    ),
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_package_imports_cleanly_in_a_fresh_interpreter(group):
    selected, allowed = GROUPS[group]
    names = [name for name in MODULES if selected(name)]
    assert names
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, json.dumps(names)],
        capture_output=True,
        text=True,
        cwd=ROOT.parent,  # not the repository root: import the installed package, not folders
        timeout=300,
    )
    assert result.returncode == 0, f"importing {group} failed:\n{result.stderr[-4000:]}"
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    pulled_in = [
        name
        for name in loaded
        if not any(within(name, package) for package in allowed)
        or (group == "aot (the build)" and within(name, TOOLS))
    ]
    assert not pulled_in, f"importing {group} loaded {pulled_in}"
