"""The bundle container: one file per (bundle, architecture).

Layout (little-endian):
    8 bytes   magic b"CUTEAOT\\0"
    u32       format version
    u32       reserved (0)
    u64       manifest length
    32 bytes  sha256 of the manifest bytes
    manifest  canonical JSON (readable without touching the payload)
    payload   zstd-compressed shared library, exactly manifest.payload.size bytes

Reading checks, in order: magic, version, lengths, manifest hash and schema, payload size and
hash, bounded decompression, library size and hash. Nothing is ever loaded before all pass.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from pathlib import Path

import zstandard

from cute_aot.artifacts.atomic import atomic_write
from cute_aot.artifacts.errors import BundleFormatError, BundleIntegrityError
from cute_aot.artifacts.manifest import FORMAT_VERSION, Manifest

MAGIC = b"CUTEAOT\0"
_HEADER = struct.Struct("<8sIIQ32s")
MAX_MANIFEST_BYTES = 64 << 20
MAX_LIBRARY_BYTES = 4 << 30
BUNDLE_SUFFIX = ".cuteaot"
ZSTD_LEVEL = 10  # fixed level, single thread: the same library always gives the same bytes


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_filename(name: str, arch: str) -> str:
    return f"{name}-{arch}{BUNDLE_SUFFIX}"


def encode_bundle(manifest: Manifest, library: bytes) -> tuple[Manifest, bytes]:
    """Compress `library` and complete the manifest's hashes; returns the file's bytes."""
    payload = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(library)
    manifest = replace(
        manifest,
        library={"sha256": sha256(library), "size": len(library)},
        payload={"codec": "zstd", "sha256": sha256(payload), "size": len(payload)},
    )
    raw_manifest = manifest.to_json()
    header = _HEADER.pack(
        MAGIC, FORMAT_VERSION, 0, len(raw_manifest), hashlib.sha256(raw_manifest).digest()
    )
    return manifest, header + raw_manifest + payload


def write_bundle(path: str | Path, manifest: Manifest, library: bytes) -> Manifest:
    """Write a bundle atomically (a reader sees the old file or the new one, never a mix)."""
    manifest, data = encode_bundle(manifest, library)
    atomic_write(path, data)
    return manifest


def _read_header(path: Path, handle) -> tuple[int, bytes]:
    raw = handle.read(_HEADER.size)
    if len(raw) < _HEADER.size:
        raise BundleFormatError(path, "truncated: shorter than a bundle header")
    magic, version, _reserved, manifest_len, manifest_hash = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise BundleFormatError(path, "not a cute-aot bundle (bad magic)")
    if version != FORMAT_VERSION:
        raise BundleFormatError(
            path, f"unknown bundle format version {version} (this reader: {FORMAT_VERSION})"
        )
    if manifest_len > MAX_MANIFEST_BYTES:
        raise BundleFormatError(path, f"manifest length {manifest_len} exceeds the limit")
    return manifest_len, manifest_hash


def read_manifest(path: str | Path) -> Manifest:
    """The manifest, checked against its hash and schema; the payload is not read."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            return _read_manifest(path, handle)[0]
    except OSError as exc:
        raise BundleFormatError(path, f"cannot read ({exc.strerror or exc})") from None


def _read_manifest(path: Path, handle) -> tuple[Manifest, int]:
    manifest_len, manifest_hash = _read_header(path, handle)
    raw = handle.read(manifest_len)
    if len(raw) != manifest_len:
        raise BundleFormatError(path, "truncated inside the manifest")
    if hashlib.sha256(raw).digest() != manifest_hash:
        raise BundleIntegrityError(path, "manifest hash mismatch (manifest corrupted)")
    return Manifest.from_json(raw, str(path)), _HEADER.size + manifest_len


def read_bundle(path: str | Path) -> tuple[Manifest, bytes]:
    """Manifest and library bytes, every hash and size verified."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            manifest, offset = _read_manifest(path, handle)
            payload = handle.read(_expected_int(manifest.payload, "size", path) + 1)
    except OSError as exc:
        raise BundleFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    return manifest, _unpack_library(path, manifest, payload)


def _expected_int(record: dict, name: str, path: Path) -> int:
    value = record.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BundleFormatError(path, f"manifest field {name!r} is not a size")
    return value


def _unpack_library(path: Path, manifest: Manifest, payload: bytes) -> bytes:
    payload_size = _expected_int(manifest.payload, "size", path)
    library_size = _expected_int(manifest.library, "size", path)
    if manifest.payload.get("codec") != "zstd":
        raise BundleFormatError(path, f"unknown payload codec {manifest.payload.get('codec')!r}")
    if len(payload) < payload_size:
        raise BundleFormatError(path, f"truncated payload: {len(payload)} of {payload_size} bytes")
    if len(payload) > payload_size:
        raise BundleFormatError(path, "trailing bytes after the payload")
    if sha256(payload) != manifest.payload.get("sha256"):
        raise BundleIntegrityError(path, "payload hash mismatch (payload corrupted)")
    if library_size > MAX_LIBRARY_BYTES:
        raise BundleFormatError(path, f"library size {library_size} exceeds the limit")
    try:
        # Bounded: never inflate past the size the (hash-checked) manifest promises.
        reader = zstandard.ZstdDecompressor().stream_reader(payload)
        library = reader.read(library_size + 1)
    except zstandard.ZstdError as exc:
        raise BundleIntegrityError(path, f"payload does not decompress ({exc})") from None
    if len(library) != library_size:
        raise BundleIntegrityError(
            path, f"library is {len(library)} bytes, manifest says {library_size}"
        )
    if sha256(library) != manifest.library.get("sha256"):
        raise BundleIntegrityError(path, "library hash mismatch")
    return library
