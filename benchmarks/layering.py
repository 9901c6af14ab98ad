"""The package's shape, for before/after comparisons of a restructuring: files and lines per
layer, the largest modules, which layers import which at module level (ast, not imports run),
and what `import cute_aot.runtime` loads in a fresh interpreter (time, cute_aot modules, and
whether any build module, tool, cutlass or torch came with it).

    python benchmarks/layering.py [TREE] --out results/layering.json

TREE is a checkout of cute-aot (default: this one). It is measured as installed: run it with
`cute_aot` importable from TREE (an editable install of it, or PYTHONPATH pointing at a folder
where `cute_aot` links to TREE). Layers: artifacts, kernels, aot (the build), tools (aot-cache and
aot-tune, wherever they live: aot/tools/ now, runtime/aot_cache and runtime/tuning before), and
runtime (the server).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import click
from result_file import emit

PACKAGES = ("artifacts", "kernels", "aot", "runtime")
TOOL_PACKAGES = ("cute_aot.aot.tools", "cute_aot.runtime.aot_cache", "cute_aot.runtime.tuning")

RUNTIME_PROBE = """
import json, sys, time
start = time.perf_counter()
import cute_aot.runtime
took = time.perf_counter() - start
ours = [name for name in sys.modules if name.startswith("cute_aot")]
print(json.dumps({
    "ms": round(took * 1e3, 1),
    "cute_aot_modules": len(ours),
    "build_or_tool_modules": sorted(n for n in ours if n.startswith(("cute_aot.aot",) + TOOLS)),
    "cutlass": "cutlass" in sys.modules,
    "torch": "torch" in sys.modules,
}))
"""


def layer(module: str) -> str:
    if module.startswith(TOOL_PACKAGES):
        return "tools"
    return module.split(".")[1]


def module_name(tree: Path, path: Path) -> str:
    parts = path.relative_to(tree).with_suffix("").parts
    return ".".join(("cute_aot", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported(module: str, is_package: bool, node: ast.stmt) -> list[str]:
    """The cute_aot modules a module-level import statement names (relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if not node.level:
        return [node.module or ""]
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return [".".join([*base, node.module] if node.module else base)]


@click.command()
@click.argument("tree", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def main(tree: str | None, out_path: Path | None) -> None:
    root = Path(tree or Path(__file__).resolve().parents[1]).resolve()
    sizes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    modules: list[tuple[int, str]] = []
    edges: dict[str, set[str]] = defaultdict(set)
    folder_edges: dict[str, set[str]] = defaultdict(set)  # by top folder: tools where they sit
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            module, text = module_name(root, path), path.read_text()
            lines = text.count("\n")
            sizes[layer(module)][0] += 1
            sizes[layer(module)][1] += lines
            modules.append((lines, str(path.relative_to(root))))
            for node in ast.parse(text).body:  # module level: what importing it runs
                for target in imported(module, path.name == "__init__.py", node):
                    if not target.startswith("cute_aot."):
                        continue
                    if layer(target) != layer(module):
                        edges[layer(module)].add(layer(target))
                    folder, target_folder = module.split(".")[1], target.split(".")[1]
                    if folder != target_folder:
                        folder_edges[folder].add(target_folder)
    probe = RUNTIME_PROBE.replace("TOOLS", repr(TOOL_PACKAGES))
    runtime = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    result = {
        "commit": subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "?",
        "layers": {name: {"files": f, "lines": n} for name, (f, n) in sorted(sizes.items())},
        "total": {"files": len(modules), "lines": sum(n for n, _ in modules)},
        "module_level_imports": {name: sorted(to) for name, to in sorted(edges.items())},
        "module_level_imports_by_folder": {
            name: sorted(to) for name, to in sorted(folder_edges.items())
        },
        "largest_modules": {path: n for n, path in sorted(modules, reverse=True)[:10]},
        "import_cute_aot_runtime": runtime,
    }
    emit(result, out_path)


if __name__ == "__main__":
    main()
