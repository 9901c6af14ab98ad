"""The write-back overlay cache: JIT results published as one-kernel bundles for later processes.

    <cache dir>/overlay/<toolchain+source fingerprint>/<arch>/<key id>.cuteaot

The fingerprint covers the toolchain and the family's source hash, so a kernel compiled by other
code or another compiler is never found. Publishing is first-wins via link() (see publish_once):
any number of processes and hosts can share the folder, NFS included, without locks.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.atomic import publish_once
from cute_aot.artifacts.bundle import BUNDLE_SUFFIX
from cute_aot.kernels import source_hash
from cute_aot.runtime import paths


def overlay_root() -> Path:
    return paths.cache_dir() / "overlay"


def fingerprint(family: str) -> str:
    facts = {"toolchain": toolchain.fingerprint(), "family": family, "source": source_hash(family)}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def overlay_path(key, arch: str) -> Path:
    return overlay_root() / fingerprint(key.FAMILY) / arch / f"{key.id}{BUNDLE_SUFFIX}"


def publish(key, arch: str, data: bytes) -> bool:
    """Publish a one-kernel bundle; False when another process got there first."""
    return publish_once(overlay_path(key, arch), data)
