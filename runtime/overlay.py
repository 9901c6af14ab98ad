"""The write-back overlay cache: JIT results published as one-kernel bundles for later processes.

    <cache dir>/overlay/<fingerprint>/<arch>/<key id>.cuteaot

The fingerprint covers everything that changes an entry's bytes: the toolchain, the family's
version, ABI and source hash, the bundle format and the packer's code. Publishing is first-wins
via link() (see publish_once): any number of processes and hosts share the folder, NFS included,
without locks. An entry that a reader refuses (damaged, written by other code) is renamed aside,
atomically and only if it is still the file that was refused, so the next publisher can replace
it: a bad entry costs one compile, never one per process forever. `aot-cache gc` removes the
renamed files.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.atomic import publish_once
from cute_aot.artifacts.bundle import BUNDLE_SUFFIX
from cute_aot.artifacts.errors import BundleError
from cute_aot.artifacts.fingerprints import packer_code_digest
from cute_aot.kernels import family_facts
from cute_aot.runtime import paths

REFUSED_MARK = ".refused-"  # <entry>.refused-<random>: set aside, for gc


def overlay_root() -> Path:
    return paths.cache_dir() / "overlay"


def fingerprint(family: str) -> str:
    facts = {
        "toolchain": toolchain.fingerprint(),
        "family": family,
        "facts": family_facts(family),
        "packer": packer_code_digest(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def overlay_path(key, arch: str) -> Path:
    return overlay_root() / fingerprint(key.FAMILY) / arch / f"{key.id}{BUNDLE_SUFFIX}"


def identity(path: Path) -> tuple[int, ...] | None:
    """What tells the file now at `path` from one that replaced it (an inode number alone may be
    reused at once), or None when there is none."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns, info.st_size


def set_aside(path: Path, refused: tuple[int, ...] | None) -> bool:
    """Rename the refused entry out of the way, unless it was replaced meanwhile. True if moved."""
    if refused is None or identity(path) != refused:
        return False
    try:
        os.rename(path, path.with_name(f"{path.name}{REFUSED_MARK}{uuid.uuid4().hex[:12]}"))
    except OSError:
        return False  # someone else moved it first
    return True


def publish(key, arch: str, data: bytes) -> bool:
    """Publish a one-kernel bundle; False when a good entry was there first. An entry there that
    does not verify is set aside and replaced."""
    path = overlay_path(key, arch)
    if publish_once(path, data):
        return True
    existing = identity(path)
    try:
        from cute_aot.runtime.loader import verify_bundle

        verify_bundle(path, arch)
        return False  # a good entry won: first wins
    except BundleError:
        set_aside(path, existing)
    return publish_once(path, data)
