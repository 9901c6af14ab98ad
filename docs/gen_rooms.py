"""The package's rooms, one layer each, and the imports between them; writes docs/rooms.md.

    python docs/gen_rooms.py           # rewrite docs/rooms.md
    python docs/gen_rooms.py --check   # exit status 1 when docs/rooms.md is out of date
    python docs/gen_rooms.py --counts  # each room's files and lines, the imports per arrow

The rooms are declared here only (ROOMS); tests/test_layout.py checks with the same collector
that every import points down and that the page is what this script writes.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PAGE = Path(__file__).with_name("rooms.md")
FOLDERS = ("aot", "artifacts", "kernels", "runtime")  # each folder is a cute_aot subpackage

# Bottom to top: (room, its cute_aot package, its job). A module's room is its longest match.
ROOMS = (
    (
        "core",
        "cute_aot.artifacts.core",
        "settings, atomic files and locks, JSON-lines, URLs, errors, notices, the cache areas",
    ),
    (
        "artifacts",
        "cute_aot.artifacts",
        "what a bundle is, and how one is made and read: format, "
        "manifest, verify, signing, ELF and fatbin, digests, the packer",
    ),
    ("kernels", "cute_aot.kernels", "kernel families and their contract"),
    ("runtime", "cute_aot.runtime", "the server: find, load, verify, dispatch, serve, fall back"),
    (
        "capture",
        "cute_aot.runtime.capture",
        "activation by the environment, recording, reports, the virtual GPU",
    ),
    ("aot", "cute_aot.aot", "the build and the operator CLIs (aot-build, aot-cache, aot-tune)"),
)
RANK = {name: rank for rank, (name, _, _) in enumerate(ROOMS)}


class Import(NamedTuple):
    importer: str  # module doing the import
    target: str  # the cute_aot module imported
    line: int
    module_level: bool  # runs when the importer is imported (not deferred inside a function)


def module_files() -> dict[str, Path]:
    """cute_aot module name -> its source file, for every module of the four folders."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("cute_aot", *parts))] = path
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def room(module: str) -> str:
    """The room of a cute_aot module: the longest package of ROOMS that holds it."""
    return max((len(package), name) for name, package, _ in ROOMS if within(module, package))[1]


def imports(modules: dict[str, Path]) -> list[Import]:
    """Every import of one cute_aot module by another, deferred ones included."""
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found += [
            Import(module, target, line, depth == 0)
            for name, line, depth in _imported_names(ast.parse(path.read_text()), package, 0)
            if (target := _owner(name, modules)) is not None and target != module
        ]
    return found


def _imported_names(node: ast.AST, package: str, depth: int):
    """(name, line, function depth) of each import under `node`; `from a import b` gives a.b."""
    for child in ast.iter_child_nodes(node):
        inner = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, ast.Import):
            yield from ((alias.name, child.lineno, depth) for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:  # relative: resolve against the importer's package
                anchor = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield from ((f"{base}.{alias.name}", child.lineno, depth) for alias in child.names)
        yield from _imported_names(child, package, inner)


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted name is or lies in (`a.b.Name` -> `a.b`), None outside cute_aot."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def counts() -> tuple[dict, dict]:
    """(room -> (files, lines), (from room, to room) -> (module-level, deferred) imports)."""
    modules = module_files()
    sizes: dict[str, tuple[int, int]] = {}
    for module, path in modules.items():
        files, lines = sizes.get(room(module), (0, 0))
        sizes[room(module)] = (files + 1, lines + len(path.read_text().splitlines()))
    arrows: dict[tuple[str, str], tuple[int, int]] = {}
    for found in imports(modules):
        pair = (room(found.importer), room(found.target))
        if pair[0] != pair[1]:
            level, deferred = arrows.get(pair, (0, 0))
            arrows[pair] = (level + found.module_level, deferred + (not found.module_level))
    order = sorted(arrows, key=lambda pair: (-RANK[pair[0]], -RANK[pair[1]]))
    return sizes, {pair: arrows[pair] for pair in order}


def render() -> str:
    """The page: the rooms, and which room imports which (counts change with every edit, so
    the page leaves them to `--counts`)."""
    _, arrows = counts()
    out = [
        "# The rooms of the package",
        "",
        "<!-- Generated by docs/gen_rooms.py: edit ROOMS there, not this page. -->",
        "",
        "One layer per room, top to bottom. A room imports only the rooms below it, deferred",
        "imports included, so the module import graph has no cycle (tests/test_layout.py). The",
        "server never imports capture, and importing the runtime activates nothing; nothing",
        "imports aot. `python docs/gen_rooms.py --counts` prints each room's files and lines,",
        "and the imports behind each arrow.",
        "",
        "| room | package | job | imports |",
        "|---|---|---|---|",
    ]
    for name, package, job in reversed(ROOMS):
        below = ", ".join(lower for upper, lower in arrows if upper == name) or "nothing"
        out.append(f"| {name} | `{package}` | {job} | {below} |")
    return "\n".join(out) + "\n"


def print_counts() -> None:
    sizes, arrows = counts()
    for name, _, _ in reversed(ROOMS):
        files, lines = sizes[name]
        print(f"{name:10s} {files:3d} files {lines:6d} lines")
    for (upper, lower), (level, deferred) in arrows.items():
        print(f"{upper:10s} -> {lower:10s} {level:3d} at module level + {deferred:2d} deferred")


def main(argv: list[str]) -> int:
    if "--counts" in argv:
        print_counts()
        return 0
    text = render()
    if "--check" in argv:
        if PAGE.exists() and PAGE.read_text() == text:
            return 0
        print(f"{PAGE} is out of date: run python docs/gen_rooms.py", file=sys.stderr)
        return 1
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
