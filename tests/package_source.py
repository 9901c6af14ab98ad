"""The package's own modules as the tests that scan them read them: listed and parsed once per
test process (the one-place tests and the layout test each walk the whole package)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aot", "artifacts", "kernels", "runtime")  # each folder is the cute_aot subpackage


@functools.cache
def package_files() -> tuple[Path, ...]:
    """Every module file of the four packages, in path order."""
    return tuple(
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    )


@functools.cache
def parsed(path: Path) -> ast.Module:
    """`path`'s syntax tree, shared between tests: read it, never change it."""
    return ast.parse(path.read_text(), str(path))
