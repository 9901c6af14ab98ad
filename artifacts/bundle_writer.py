"""Writing the bundle container (artifacts/bundle.py holds the layout and reads it).

Packer code: what it writes is in every bundle's bytes, so a change of those bytes bumps
PACKER_VERSION (artifacts/fingerprints.py), which is in every build-cache and overlay digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import zstandard

from cute_aot.artifacts.bundle import HEADER, MAGIC, read_verified, sha256
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.artifacts.core.errors import BundleError, BundleIntegrityError
from cute_aot.artifacts.manifest import FORMAT_VERSION, Manifest

ZSTD_LEVEL = 10  # fixed level, single thread: the same library always gives the same bytes


def encode_bundle(
    manifest: Manifest, library: bytes, sign: Callable[[Manifest], Manifest] | None = None
) -> tuple[Manifest, bytes]:
    """Compress `library` and complete the manifest's hashes (then `sign` it, when given: a
    signature covers the hashes); returns the manifest and the file's bytes."""
    payload = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(library)
    manifest = replace(
        manifest,
        library={"sha256": sha256(library), "size": len(library)},
        payload={"codec": "zstd", "sha256": sha256(payload), "size": len(payload)},
    )
    if sign is not None:
        manifest = sign(manifest)
    return manifest, container(manifest, payload)


def container(manifest: Manifest, payload: bytes) -> bytes:
    """The file's bytes: header, canonical manifest, payload as given."""
    raw_manifest = manifest.to_json()
    header = HEADER.pack(
        MAGIC, FORMAT_VERSION, 0, len(raw_manifest), hashlib.sha256(raw_manifest).digest()
    )
    return header + raw_manifest + payload


def write_bundle(path: str | Path, manifest: Manifest, library: bytes) -> Manifest:
    """Write a bundle atomically (a reader sees the old file or the new one, never a mix)."""
    manifest, data = encode_bundle(manifest, library)
    atomic_write(path, data)
    return manifest


def rewrite_manifest(path: str | Path, manifest: Manifest) -> Manifest:
    """Replace a verified bundle's manifest, keeping its payload bytes (signing uses this).

    The new manifest must describe the same library and payload.
    """
    path = Path(path)
    old, payload = read_verified(path, None)[:2]
    if (manifest.library, manifest.payload) != (old.library, old.payload):
        raise BundleIntegrityError(path, "new manifest describes another library or payload")
    try:
        atomic_write(path, container(manifest, payload))  # the old file stays on failure
    except OSError as exc:
        raise BundleError(path, f"cannot rewrite ({exc.strerror or exc})") from None
    return manifest
