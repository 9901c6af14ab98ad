"""Kernel families. Each lives in ``kernels/<family>/``:

- ``__init__.py``: the pure-Python part (Key, dispatch, tuned tables, key enumeration); the
  server imports it and it never imports cutlass;
- ``build.py``: the CuTe DSL part, ``compile(key, arch)``, imported only to build or JIT.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from importlib import resources
from types import ModuleType

from cute_aot.artifacts.errors import UnsupportedProblemError

FAMILIES = ("router_gemm",)


def family(name: str) -> ModuleType:
    """The pure-Python part of a family."""
    if name not in FAMILIES:
        raise UnsupportedProblemError(
            f"unknown kernel family {name!r}; known: {', '.join(FAMILIES)}"
        )
    return importlib.import_module(f"{__name__}.{name}")


def family_builder(name: str) -> ModuleType:
    """The CuTe DSL part of a family (imports cutlass: build machines and JIT misses only)."""
    family(name)
    return importlib.import_module(f"{__name__}.{name}.build")


@functools.cache
def source_hash(name: str) -> str:
    """sha256 over the family's source and data files: a bundle built from other sources is stale."""
    family(name)
    digest = hashlib.sha256()
    folder = resources.files(f"{__name__}.{name}")
    for item in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if item.is_file() and item.name.endswith((".py", ".json")):
            digest.update(item.name.encode() + b"\0" + item.read_bytes() + b"\0")
    return digest.hexdigest()
