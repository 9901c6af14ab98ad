"""FlashInfer's CuTe DSL kernels from bundles, in one call after importing flashinfer:

    import flashinfer
    from cute_aot.runtime import flashinfer as cute_aot_flashinfer, load_bundles
    load_bundles("bundles/")                  # or CUTE_AOT_BUNDLES
    cute_aot_flashinfer.install()             # {family: "installed" | why not}

From then on FlashInfer's own functions (`gated_delta_rule_decode`, `mm_mxfp8(backend="cute-dsl")`,
`mm_bf16(backend="tgv")`) find their compiled kernels in the bundles: only FlashInfer's lookups
of compiled kernels are replaced, never its files, checks or launch code. A kernel no bundle
holds is compiled by FlashInfer as before (mode auto, recorded as a miss) or refused (mode aot).
"""

from __future__ import annotations

from collections.abc import Iterable

from cute_aot.runtime import serving

__all__ = ["install", "uninstall"]


def install(families: Iterable[str] | None = None) -> dict[str, str]:
    """Patch FlashInfer for every installed family serving it (or those named)."""
    return serving.install(families, library="flashinfer")


def uninstall(families: Iterable[str] | None = None) -> None:
    serving.uninstall(families)
