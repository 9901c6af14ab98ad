"""GPU-model profiles (gpu_profiles.json): the GPU-derived constants that FlashInfer compiles
into some kernels (max active clusters per launch cluster size) and the SM count its untuned
rules read, per GPU model, with where each number comes from. Keys are enumerated per profile:
a bundle built for the B200 profile serves B200s; another GPU model asks for other keys."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from cute_aot.artifacts.errors import UnsupportedProblemError

PROFILES_FILE = "gpu_profiles.json"


@dataclass(frozen=True)
class GpuProfile:
    name: str
    arch: str
    device_names: tuple[str, ...]
    sm_count: int
    max_active_clusters: tuple[tuple[int, int], ...]  # (cluster size, clusters), sorted
    source: str

    def clusters(self, cluster_size: int) -> int:
        """get_max_active_clusters(cluster_size) on this GPU model."""
        for size, count in self.max_active_clusters:
            if size == cluster_size:
                return count
        raise UnsupportedProblemError(
            f"GPU profile {self.name} has no max_active_clusters for cluster size {cluster_size}"
        )


@functools.cache
def _data() -> dict:
    text = resources.files(__package__).joinpath(PROFILES_FILE).read_text()
    return json.loads(text)


@functools.cache
def profiles() -> dict[str, GpuProfile]:
    """name -> profile, as gpu_profiles.json gives them."""
    found = {}
    for name, entry in _data()["profiles"].items():
        found[name] = GpuProfile(
            name=name,
            arch=entry["arch"],
            device_names=tuple(entry["device_names"]),
            sm_count=int(entry["sm_count"]),
            max_active_clusters=tuple(
                sorted(
                    (int(size), int(count)) for size, count in entry["max_active_clusters"].items()
                )
            ),
            source=entry["source"],
        )
    return found


def profile(name: str) -> GpuProfile:
    found = profiles().get(name)
    if found is None:
        raise UnsupportedProblemError(
            f"unknown GPU profile {name!r}; known: {', '.join(profiles())}"
        )
    return found


def build_profiles(arch: str) -> tuple[GpuProfile, ...]:
    """The profiles whose keys a build for `arch` enumerates by default."""
    return tuple(profile(name) for name in _data()["build"].get(arch, ()))


def profile_for_device_name(name: str) -> GpuProfile | None:
    """The profile of a device name (torch.cuda.get_device_name, FlashInfer's autotune metadata)."""
    for found in profiles().values():
        if name in found.device_names:
            return found
    return None
