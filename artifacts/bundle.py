"""The bundle container: one file per (bundle, architecture).

Layout (little-endian):
    8 bytes   magic b"CUTEAOT\\0"
    u32       format version
    u32       reserved (must be 0)
    u64       manifest length
    32 bytes  sha256 of the manifest bytes
    manifest  canonical JSON (readable without touching the payload)
    payload   zstd-compressed shared library, exactly manifest.payload.size bytes

Reading checks, in order: magic, version, lengths, manifest hash, schema and field formats (hashes
are hex, symbols are identifiers: nothing path-like), payload size and hash, bounded decompression,
library size and hash. Nothing is ever loaded before all pass; every failure is a BundleError.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import zstandard

from cute_aot.artifacts.atomic import atomic_write
from cute_aot.artifacts.errors import BundleError, BundleFormatError, BundleIntegrityError
from cute_aot.artifacts.manifest import FORMAT_VERSION, Manifest

MAGIC = b"CUTEAOT\0"
_HEADER = struct.Struct("<8sIIQ32s")
MAX_MANIFEST_BYTES = 64 << 20
MAX_LIBRARY_BYTES = 4 << 30
# Real libraries compress 3-5x; a payload claiming far more is a decompression bomb.
MAX_COMPRESSION_RATIO = 1000
MAX_WINDOW_BYTES = 1 << 27  # zstd's own default limit, stated so it cannot drift upwards
_DECOMPRESS_CHUNK = 4 << 20
BUNDLE_SUFFIX = ".cuteaot"
ZSTD_LEVEL = 10  # fixed level, single thread: the same library always gives the same bytes

SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
KEY_ID_RE = re.compile(r"^[0-9a-f]{8,64}\Z")
SYMBOL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
FAMILY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[a-z]?\Z")

ManifestCheck = Callable[[Path, Manifest], None]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_filename(name: str, arch: str) -> str:
    return f"{name}-{arch}{BUNDLE_SUFFIX}"


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
    return manifest, _container(manifest, payload)


def _container(manifest: Manifest, payload: bytes) -> bytes:
    raw_manifest = manifest.to_json()
    header = _HEADER.pack(
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
    old, payload = _read_verified(path, None)[:2]
    if (manifest.library, manifest.payload) != (old.library, old.payload):
        raise BundleIntegrityError(path, "new manifest describes another library or payload")
    try:
        atomic_write(path, _container(manifest, payload))  # the old file stays on failure
    except OSError as exc:
        raise BundleError(path, f"cannot rewrite ({exc.strerror or exc})") from None
    return manifest


def _read_header(path: Path, handle) -> tuple[int, bytes]:
    raw = handle.read(_HEADER.size)
    if len(raw) < _HEADER.size:
        raise BundleFormatError(path, "truncated: shorter than a bundle header")
    magic, version, reserved, manifest_len, manifest_hash = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise BundleFormatError(path, "not a cute-aot bundle (bad magic)")
    if version != FORMAT_VERSION:
        raise BundleFormatError(
            path, f"unknown bundle format version {version} (this reader: {FORMAT_VERSION})"
        )
    if reserved != 0:
        raise BundleFormatError(path, f"reserved header field is {reserved}, not 0")
    if manifest_len > MAX_MANIFEST_BYTES:
        raise BundleFormatError(path, f"manifest length {manifest_len} exceeds the limit")
    return manifest_len, manifest_hash


def read_manifest(path: str | Path) -> Manifest:
    """The manifest, checked against its hash, schema and field formats; the payload is not read."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            return _read_manifest(path, handle)
    except OSError as exc:
        raise BundleFormatError(path, f"cannot read ({exc.strerror or exc})") from None


def _read_manifest(path: Path, handle) -> Manifest:
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        raise BundleFormatError(path, "not a regular file")  # a FIFO or device would block
    manifest_len, manifest_hash = _read_header(path, handle)
    raw = handle.read(manifest_len)
    if len(raw) != manifest_len:
        raise BundleFormatError(path, "truncated inside the manifest")
    if hashlib.sha256(raw).digest() != manifest_hash:
        raise BundleIntegrityError(path, "manifest hash mismatch (manifest corrupted)")
    manifest = Manifest.from_json(raw, str(path))
    check_fields(path, manifest)
    return manifest


def read_bundle(path: str | Path, check: ManifestCheck | None = None) -> tuple[Manifest, bytes]:
    """Manifest and library bytes, every hash and size verified.

    `check(path, manifest)` runs once the manifest is verified and before the payload is read
    or decompressed (the runtime refuses untrusted or incompatible bundles there, cheaply).
    """
    manifest, _payload, library = _read_verified(Path(path), check)
    return manifest, library


def _read_verified(path: Path, check: ManifestCheck | None) -> tuple[Manifest, bytes, bytes]:
    try:
        with open(path, "rb") as handle:
            manifest = _read_manifest(path, handle)
            if check is not None:
                check(path, manifest)
            # Never ask for more than the file holds: the size is the writer's claim.
            left = os.fstat(handle.fileno()).st_size - handle.tell()
            payload = handle.read(min(manifest.payload["size"], left) + 1)
    except OSError as exc:
        raise BundleFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    return manifest, payload, _unpack_library(path, manifest, payload)


def check_fields(path: Path, manifest: Manifest) -> None:
    """Formats the schema's types do not capture. Anything later used in a path (the library's
    sha256 names its cache file) or as a symbol must be exactly what it claims to be."""
    if not ARCH_RE.match(manifest.arch):
        raise BundleFormatError(path, f"arch {manifest.arch!r} is not an architecture name")
    _expect_record(path, "library", manifest.library, {"sha256": str, "size": int})
    _expect_record(path, "payload", manifest.payload, {"codec": str, "sha256": str, "size": int})
    for record in ("library", "payload"):
        facts = getattr(manifest, record)
        if not SHA256_RE.match(facts["sha256"]):
            raise BundleFormatError(path, f"{record} sha256 {facts['sha256']!r} is not 64 hex")
        if facts["size"] < 0:
            raise BundleFormatError(path, f"{record} size {facts['size']} is negative")
    _check_toolchain(path, manifest.toolchain)
    for name, facts in manifest.families.items():
        if not FAMILY_RE.match(name) or not isinstance(facts, dict):
            raise BundleFormatError(path, f"families: {name!r} is not a family record")
    for index, entry in enumerate(manifest.entries):
        what = f"entry {index}"
        if not FAMILY_RE.match(entry.family):
            raise BundleFormatError(path, f"{what}: family {entry.family!r} is not a family name")
        if not KEY_ID_RE.match(entry.key_id):
            raise BundleFormatError(path, f"{what}: key id {entry.key_id!r} is not hex")
        if not SYMBOL_RE.match(entry.symbol):
            raise BundleFormatError(
                path, f"{what}: symbol {entry.symbol!r} is not a plain C identifier"
            )
        if not SHA256_RE.match(entry.sha256) or entry.size < 0:
            raise BundleFormatError(path, f"{what}: object sha256/size malformed")


def _expect_record(path: Path, what: str, record: dict, schema: dict[str, type]) -> None:
    if set(record) != set(schema) or any(
        not isinstance(record[name], kind) or isinstance(record[name], bool)
        for name, kind in schema.items()
    ):
        fields = ", ".join(f"{name}: {kind.__name__}" for name, kind in schema.items())
        raise BundleFormatError(path, f"manifest {what} must be {{{fields}}}, got {record!r:.200}")


def _check_toolchain(path: Path, toolchain: dict) -> None:
    """The fields the runtime compares must have the types it compares them as."""
    kinds = {"tvm_ffi": str, "cuda_runtime_major": int, "cutlass_dsl": dict}
    for name, kind in kinds.items():
        value = toolchain.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise BundleFormatError(path, f"toolchain field {name!r} must be {kind.__name__}")
    for dist, version in (toolchain.get("cutlass_dsl") or {}).items():
        if not isinstance(version, str):
            raise BundleFormatError(path, f"toolchain cutlass_dsl[{dist!r}] must be a version")


def _unpack_library(path: Path, manifest: Manifest, payload: bytes) -> bytes:
    payload_size = manifest.payload["size"]
    library_size = manifest.library["size"]
    if manifest.payload["codec"] != "zstd":
        raise BundleFormatError(path, f"unknown payload codec {manifest.payload['codec']!r}")
    if len(payload) < payload_size:
        raise BundleFormatError(path, f"truncated payload: {len(payload)} of {payload_size} bytes")
    if len(payload) > payload_size:
        raise BundleFormatError(path, "trailing bytes after the payload")
    if sha256(payload) != manifest.payload["sha256"]:
        raise BundleIntegrityError(path, "payload hash mismatch (payload corrupted)")
    if library_size > MAX_LIBRARY_BYTES:
        raise BundleFormatError(path, f"library size {library_size} exceeds the limit")
    if library_size > MAX_COMPRESSION_RATIO * max(payload_size, 1):
        raise BundleFormatError(
            path,
            f"a {payload_size}-byte payload claims a {library_size}-byte library "
            f"(over {MAX_COMPRESSION_RATIO}x: refused as a decompression bomb)",
        )
    library = _decompress_bounded(path, payload, library_size)
    if sha256(library) != manifest.library["sha256"]:
        raise BundleIntegrityError(path, "library hash mismatch")
    return library


def _decompress_bounded(path: Path, payload: bytes, library_size: int) -> bytes:
    """Inflate at most library_size + 1 bytes, whatever the frame claims.

    stream_reader.read(n) may return fewer than n bytes, so read until end of stream, never asking
    for more than one byte past the promised size (that one byte detects an overlong payload).
    """
    chunks, total = [], 0
    try:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        # Across frames: bytes after the first frame are read too, so they cannot hide.
        with decompressor.stream_reader(payload, read_across_frames=True) as reader:
            while total <= library_size:
                chunk = reader.read(min(_DECOMPRESS_CHUNK, library_size + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except zstandard.ZstdError as exc:
        raise BundleIntegrityError(path, f"payload does not decompress ({exc})") from None
    if total != library_size:
        raise BundleIntegrityError(
            path,
            f"library decompresses to {'more than ' if total > library_size else ''}{total} "
            f"bytes, manifest says {library_size}",
        )
    return b"".join(chunks)
