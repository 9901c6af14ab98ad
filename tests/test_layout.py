"""The rooms of the package (declared in docs/gen_rooms.py, listed in docs/rooms.md), one layer
each, bottom to top:

    core       artifacts/core/     settings, files and locks, JSON-lines, URLs, errors, notices
    artifacts  artifacts/          what a bundle is: format, manifest, verify, sign, ELF, the packer
    kernels    kernels/            kernel families and their contract
    runtime    runtime/            the server: find, load, verify, dispatch, serve, fall back
    capture    runtime/capture/    activation, recording, reports, the virtual GPU
    aot        aot/                the build and the operator CLIs (aot-build, aot-cache, aot-tune)

A room imports only rooms below it, deferred imports included (a lazy import is a dependency
all the same), so the module import graph has no cycle at all, and no import exists to break
one. Read from the import statements (ast), and checked again by importing each room in a fresh
interpreter: what it loads of cute-aot is of its own room and the rooms below.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_rooms", ROOT / "docs" / "gen_rooms.py")
gen_rooms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_rooms)
ROOMS, RANK, room, within = gen_rooms.ROOMS, gen_rooms.RANK, gen_rooms.room, gen_rooms.within
MODULES = gen_rooms.module_files()
EDGES = [(found, found.target) for found in gen_rooms.imports(MODULES)]


def test_the_collector_sees_every_room_and_resolves_imports():
    # guards the checks below against passing vacuously
    assert {room(name) for name in MODULES} == set(RANK)
    loader = {target for found, target in EDGES if found.importer == "cute_aot.runtime.loader"}
    assert {"cute_aot.runtime.library_store", "cute_aot.artifacts.verify"} <= loader
    deferred = [found for found, _ in EDGES if not found.module_level]
    assert deferred, "no deferred import seen: the collector misses function bodies"
    arrows = {(room(found.importer), room(target)) for found, target in EDGES}
    # every room but the lowest uses the one beneath it
    names = [name for name, _, _ in ROOMS]
    assert set(zip(names[1:], names[:-1], strict=True)) <= arrows


def test_every_import_points_down():
    upward = [
        f"{MODULES[found.importer].relative_to(ROOT)}:{found.line} ({room(found.importer)}) "
        f"imports {target} ({room(target)})"
        for found, target in EDGES
        if RANK[room(target)] > RANK[room(found.importer)]
    ]
    assert not upward, "a room imports only the rooms below it:\n" + "\n".join(upward)


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


def test_the_module_graph_has_no_cycle_even_through_deferred_imports():
    graph: dict[str, set[str]] = defaultdict(set)
    for found, target in EDGES:
        graph[found.importer].add(target)
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]  # the finder finds one
    assert not _cycles(graph), f"modules import each other: {_cycles(graph)}"


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
hooks = [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("cute_aot")]
print(json.dumps([sorted(n for n in sys.modules if n.startswith("cute_aot.")), hooks]))
"""


@pytest.mark.parametrize("name", list(RANK))
def test_each_room_imports_only_itself_and_what_is_below_in_a_fresh_interpreter(name):
    names = [module for module in MODULES if room(module) == name]
    assert names
    # No activation variable: the startup hook stays out, and what loads is what imports load.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, json.dumps(names)],
        capture_output=True,
        text=True,
        cwd=ROOT.parent,  # not the repository root: import the installed package, not folders
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, f"importing {name} failed:\n{result.stderr[-4000:]}"
    loaded, hooks = json.loads(result.stdout.strip().splitlines()[-1])
    package = next(package for room_, package, _ in ROOMS if room_ == name)
    above = [
        module
        for module in loaded
        if module in MODULES
        and RANK[room(module)] > RANK[name]
        and not within(package, module)  # a parent package: Python imports it first, always
    ]
    assert not above, f"importing the {name} room loaded {above}"
    if name == "runtime":  # the server: importing it activates nothing
        assert hooks == [], f"importing the runtime installed import hooks: {hooks}"


def test_the_rooms_page_is_what_the_script_writes():
    """docs/rooms.md: after moving a module or adding one, run python docs/gen_rooms.py."""
    assert (ROOT / "docs" / "rooms.md").read_text() == gen_rooms.render()
