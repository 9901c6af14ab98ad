"""FlashInfer's CuTe DSL kernels as cute-aot families, built ahead of time and served to
FlashInfer's own public functions (cute_aot.runtime.flashinfer.install()).

Each family mirrors the compile-cache key FlashInfer itself uses for one kernel, field by field
(tests compare them, so a FlashInfer upgrade that adds a field fails loudly), compiles FlashInfer's
own CuTe DSL code on CPU-only machines, and patches only the lookup where FlashInfer finds a
compiled kernel. The pure-Python modules here never import flashinfer or cutlass; the builders
and the patches do (a server using them has imported flashinfer already).
"""

from __future__ import annotations

# The one FlashInfer release these families are written against: its key layouts, patch points
# and kernel sources are facts of that release (kernels.md of the design notes has them).
DISTRIBUTION = "flashinfer-python"
VERSION = "0.7.4"
REQUIRES = {DISTRIBUTION: VERSION}


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (how keys spell dtypes)."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)
