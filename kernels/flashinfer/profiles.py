"""GPU-model profiles for FlashInfer's families: the GPU-derived constants FlashInfer compiles
into some kernels (max active clusters per launch cluster size) and the SM count its untuned
rules read come from kernels/gpu_profiles.json, the one file of GPU models (each value with its
source). Keys are enumerated per profile: a bundle built for the B200 profile serves B200s;
another GPU model asks for other keys. A build for an architecture enumerates its reference
profile (B200 for sm_100a, B300 for sm_103a)."""

from __future__ import annotations

from cute_aot.kernels.gpu_profiles import GpuProfile, profile, profiles, reference
from cute_aot.kernels.gpu_profiles import for_device_name as profile_for_device_name

__all__ = ["GpuProfile", "build_profiles", "profile", "profile_for_device_name", "profiles"]


def build_profiles(arch: str) -> tuple[GpuProfile, ...]:
    """The profiles whose keys a build for `arch` enumerates by default."""
    found = reference(arch)
    return (found,) if found is not None and found.max_active_clusters else ()
