"""How often the tests patch cute-aot's own code: `monkeypatch.setattr`, `mock.patch(.object)` and
`setattr` calls in tests/ whose target is a cute_aot module (named as a string) or a name the test
file imported from cute_aot. A test that patches the code under test can pass with it broken.

    python benchmarks/self_patches.py [TREE] [--list]

Counts per patched name, and with --list every site. Scripts the tests hand to subprocesses
(strings) are not read.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import click

PATCHERS = ("setattr", "patch", "object")


def self_patches(tree: Path) -> list[tuple[str, str]]:
    """(site, patched name) of every self-patch in tree/tests."""
    found = []
    for path in sorted((tree / "tests").rglob("*.py")):
        if "data" in path.relative_to(tree / "tests").parts:
            continue
        module = ast.parse(path.read_text())
        own = _imported_from_cute_aot(module)
        for node in ast.walk(module):
            target = _patched(node, own)
            if target is not None:
                found.append((f"{path.relative_to(tree)}:{node.lineno}", target))
    return found


def _imported_from_cute_aot(module: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cute_aot"):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.startswith("cute_aot")
            }
    return names


def _patched(node: ast.AST, own: set[str]) -> str | None:
    """The cute-aot name a patch call patches, None when `node` is no such call."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in PATCHERS:
        return None
    if isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "os":
        return None  # os.environ and friends
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        parts = first.value.split(".")
        return parts[-2] if first.value.startswith("cute_aot") and len(parts) > 1 else None
    base = first
    while isinstance(base, ast.Attribute):
        base = base.value
    if isinstance(base, ast.Name) and base.id in own:
        return ast.unparse(first).split(".")[0]
    return None


@click.command()
@click.argument("tree", default=".", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--list", "show_sites", is_flag=True, help="Also print every site.")
def main(tree: Path, show_sites: bool) -> None:
    found = self_patches(tree)
    click.echo(f"self-patches: {len(found)}")
    click.echo(", ".join(f"{name} {n}" for name, n in Counter(n for _, n in found).most_common()))
    if show_sites:
        for site, name in found:
            click.echo(f"{site} {name}")


if __name__ == "__main__":
    main()
