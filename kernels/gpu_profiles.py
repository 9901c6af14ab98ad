"""GPU models as data (gpu_profiles.json): what each answers when asked, and where each value
comes from. The virtual device (runtime/virtual) answers a workload's hardware queries from a
profile; families that compile a GPU-derived constant in (kernels/flashinfer) enumerate keys per
profile. A profile is named by model (`h200`, `b200`) or by architecture, which means that
architecture's reference profile (`sm_100a` -> `b200`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.arch import arch_for_capability, normalize_arch

PROFILES_FILE = "gpu_profiles.json"


@dataclass(frozen=True)
class GpuProfile:
    """One GPU model's answers. `sources` names, per answer, where its value comes from."""

    name: str
    arch: str
    device_name: str
    device_names: tuple[str, ...]
    driver_version: int
    attributes: dict[str, int]  # CUdevice_attribute name without its prefix -> value
    max_active_clusters: dict[int, int]  # cluster size -> clusters
    total_memory: int | None = None  # bytes; None: no source gives it
    sources: dict[str, str] = field(default_factory=dict)  # answer -> what its value rests on
    overrides: dict = field(default_factory=dict)  # what the user changed, as given

    @property
    def sm_count(self) -> int:
        return self.attributes["MULTIPROCESSOR_COUNT"]

    @property
    def cuda_version(self) -> str:
        """The CUDA version its driver supports, as torch.version.cuda spells one ("13.0")."""
        return f"{self.driver_version // 1000}.{self.driver_version % 1000 // 10}"

    @property
    def capability(self) -> tuple[int, int]:
        return self.attributes["COMPUTE_CAPABILITY_MAJOR"], self.attributes[
            "COMPUTE_CAPABILITY_MINOR"
        ]

    def clusters(self, cluster_size: int) -> int:
        """get_max_active_clusters(cluster_size) on this GPU model."""
        if cluster_size not in self.max_active_clusters:
            raise UnsupportedProblemError(
                f"GPU profile {self.name} has no max_active_clusters "
                f"for cluster size {cluster_size}"
            )
        return self.max_active_clusters[cluster_size]

    def describe(self) -> dict:
        """What a record keeps of the profile that answered (name, arch, what was overridden)."""
        return {"profile": self.name, "arch": self.arch, "overrides": self.overrides}


@functools.cache
def data() -> dict:
    return json.loads(resources.files(__package__).joinpath(PROFILES_FILE).read_text())


def _profile(name: str, entry: dict, tags: dict) -> GpuProfile:
    sources: dict[str, str] = {}

    def value(answer: str, pair):
        number, tag = pair
        if tag not in tags:
            raise ValueError(f"{PROFILES_FILE}: {name}.{answer} cites unknown source {tag!r}")
        sources[answer] = tags[tag]
        return number

    return GpuProfile(
        name=name,
        arch=normalize_arch(entry["arch"]),
        device_name=value("name", entry["name"]),
        device_names=tuple(entry["device_names"]),
        driver_version=int(value("driver_version", entry["driver_version"])),
        attributes={k: int(value(k, v)) for k, v in entry["attributes"].items()},
        max_active_clusters={
            int(size): int(value(f"max_active_clusters({size})", v))
            for size, v in entry["max_active_clusters"].items()
        },
        total_memory=int(value("total_memory", entry["total_memory"]))
        if "total_memory" in entry
        else None,
        sources=sources,
    )


@functools.cache
def profiles() -> dict[str, GpuProfile]:
    """name -> profile, as gpu_profiles.json gives them."""
    raw = data()
    return {name: _profile(name, entry, raw["sources"]) for name, entry in raw["profiles"].items()}


def profile(name: str) -> GpuProfile:
    """A profile by model name (any case) or by architecture (its reference profile)."""
    wanted = name.strip().lower()
    found = profiles().get(wanted)
    if found is not None:
        return found
    try:
        arch = normalize_arch(wanted)
    except UnsupportedProblemError:
        arch = None
    if arch in data()["reference"]:
        return profiles()[data()["reference"][arch]]
    raise UnsupportedProblemError(
        f"unknown GPU profile {name!r}; known: {', '.join(profiles())}, or an architecture "
        f"({', '.join(data()['reference'])}) for its reference profile"
    )


def reference(arch: str) -> GpuProfile | None:
    """The profile that stands for `arch` (None: the file names none)."""
    name = data()["reference"].get(normalize_arch(arch))
    return profiles()[name] if name else None


def for_device_name(name: str) -> GpuProfile | None:
    """The profile of a device name (torch.cuda.get_device_name, FlashInfer's autotune files)."""
    for found in profiles().values():
        if name in found.device_names:
            return found
    return None


def with_overrides(base: GpuProfile, changes: dict) -> GpuProfile:
    """`base` with answers replaced: {"attributes": {...}, "max_active_clusters": {...}, "name":
    ..., "driver_version": ...}; an answer overridden cites the override as its source."""
    unknown = set(changes) - {"attributes", "max_active_clusters", "name", "driver_version"}
    if unknown:
        raise UnsupportedProblemError(f"GPU profile override: unknown fields {sorted(unknown)}")
    attributes = {
        **base.attributes,
        **{k: int(v) for k, v in changes.get("attributes", {}).items()},
    }
    clusters = {
        **base.max_active_clusters,
        **{int(k): int(v) for k, v in changes.get("max_active_clusters", {}).items()},
    }
    sources = dict(base.sources)
    changed = [
        *changes.get("attributes", {}),
        *(f"max_active_clusters({size})" for size in changes.get("max_active_clusters", {})),
        *(answer for answer in ("name", "driver_version") if answer in changes),
    ]
    sources.update(dict.fromkeys(changed, "overridden by the user"))
    if (
        arch_for_capability(
            attributes["COMPUTE_CAPABILITY_MAJOR"], attributes["COMPUTE_CAPABILITY_MINOR"]
        )
        != base.arch
    ):
        raise UnsupportedProblemError(
            f"GPU profile override: compute capability {attributes['COMPUTE_CAPABILITY_MAJOR']}."
            f"{attributes['COMPUTE_CAPABILITY_MINOR']} is not {base.arch}, "
            f"{base.name}'s architecture"
        )
    return GpuProfile(
        name=base.name,
        arch=base.arch,
        device_name=changes.get("name", base.device_name),
        device_names=base.device_names,
        driver_version=int(changes.get("driver_version", base.driver_version)),
        attributes=attributes,
        max_active_clusters=clusters,
        total_memory=base.total_memory,
        sources=sources,
        overrides=changes,
    )
