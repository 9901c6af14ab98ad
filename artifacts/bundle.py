"""The bundle container, one file per (bundle, architecture), and its reader.

Layout (little-endian):
    8 bytes   magic b"CUTEAOT\\0"
    u32       format version
    u32       reserved (must be 0)
    u64       manifest length
    32 bytes  sha256 of the manifest bytes
    manifest  canonical JSON (readable without touching the payload)
    payload   zstd-compressed shared library, exactly manifest.payload.size bytes

Reading checks, in order: a regular file (opened without blocking), magic, version, lengths,
manifest hash, schema and field formats (hashes are hex, symbols are identifiers: nothing
path-like), size limits, the file's size against the manifest's, payload hash, bounded
decompression, library size and hash. The manifest-only reader makes every check up to the file
size, so a truncated file is refused by it too. Nothing is ever loaded before all pass; every
failure is a BundleError.

Writing is artifacts/bundle_writer.py's: packer code, identified by PACKER_VERSION
(artifacts/fingerprints.py) in every build-cache and overlay digest. This reader is not packer
code: a stricter check or a faster read leaves those caches valid; a change of the layout above
is a FORMAT_VERSION change, which the digest covers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import zstandard

from cute_aot.artifacts.core.errors import BundleFormatError, BundleIntegrityError, BundleSizeError
from cute_aot.artifacts.manifest import ABIS, FORMAT_VERSION, Entry, Manifest

MAGIC = b"CUTEAOT\0"
HEADER = struct.Struct("<8sIIQ32s")
MAX_MANIFEST_BYTES = 64 << 20
# A 1000-kernel bundle's library is ~13 MB (README, cold start) and the largest family build,
# MXFP8 with every tactic, ~2 MB per architecture: 512 MiB leaves ~40x headroom, while what a
# forged manifest can make a reader hold stays well inside a server's memory.
MAX_LIBRARY_BYTES = 512 << 20
# Real libraries compress 3-5x; a payload claiming far more is a decompression bomb.
MAX_COMPRESSION_RATIO = 1000
MAX_WINDOW_BYTES = 1 << 27  # zstd's own default limit, stated so it cannot drift upwards
_DECOMPRESS_CHUNK = 4 << 20
BUNDLE_SUFFIX = ".cuteaot"
# Installed bundle wheels register their bundles' folder here (aot/wheel.py writes, the runtime
# reads)
BUNDLE_ENTRY_POINT_GROUP = "cute_aot.bundles"

SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
KEY_ID_RE = re.compile(r"^[0-9a-f]{8,64}\Z")
SYMBOL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
FAMILY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[a-z]?\Z")

ManifestCheck = Callable[[Path, Manifest], None]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> tuple[str, int]:
    """(sha256, size) of a file, read in blocks (a bundle or library need not fit twice)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def bundle_filename(name: str, arch: str) -> str:
    return f"{name}-{arch}{BUNDLE_SUFFIX}"


@contextlib.contextmanager
def _open_regular(path: Path) -> Iterator[tuple[BinaryIO, int]]:
    """(reader, size) of a regular file. O_NONBLOCK: open() of a FIFO blocks until a writer comes
    (forever, in a bundle folder), so it is opened without waiting and refused by fstat, as are
    devices and sockets; links to regular files are followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BundleFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _FILE_KINDS.get(stat.S_IFMT(info.st_mode), "not a file")
            raise BundleFormatError(path, f"cannot read: not a regular file ({kind})")
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        try:
            yield handle, info.st_size
        except OSError as exc:
            raise BundleFormatError(path, f"cannot read ({exc.strerror or exc})") from None


_FILE_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _read_header(path: Path, handle) -> tuple[int, bytes]:
    raw = handle.read(HEADER.size)
    if len(raw) < HEADER.size:
        raise BundleFormatError(path, "truncated: shorter than a bundle header")
    magic, version, reserved, manifest_len, manifest_hash = HEADER.unpack(raw)
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


class DecodedManifests(Protocol):
    """Manifests decoded before, by the sha256 of their bytes (runtime/manifest_memo.py): reading
    and decoding a large manifest is most of a bundle's open."""

    def get(self, sha256: str) -> Any | None:
        """The JSON values of the manifest whose bytes hash to `sha256`; None if not kept."""

    def put(self, sha256: str, decoded: Any) -> None:
        """Keep them (or not: never raises)."""


def read_manifest(path: str | Path, decoded: DecodedManifests | None = None) -> Manifest:
    """The manifest, checked against its hash, schema and field formats; the payload is not read.

    `decoded`: manifests decoded before. When it holds the values of the manifest hash the
    header names, the manifest's bytes are not read again: those values were decoded from bytes
    that had that hash, so they are what an intact file holds (a file damaged inside its
    manifest since is not noticed here; a full read, `aot-cache verify`, notices it). Every
    check on the values runs again."""
    path = Path(path)
    with _open_regular(path) as (handle, size):
        return _read_manifest(path, handle, size, decoded)


def _read_manifest(
    path: Path, handle, file_size: int, decoded: DecodedManifests | None = None
) -> Manifest:
    manifest_len, manifest_hash = _read_header(path, handle)
    data = decoded.get(manifest_hash.hex()) if decoded is not None else None
    fresh = data is None
    if fresh:
        raw = handle.read(manifest_len)
        if len(raw) != manifest_len:
            raise BundleFormatError(path, "truncated inside the manifest")
        if hashlib.sha256(raw).digest() != manifest_hash:
            raise BundleIntegrityError(path, "manifest hash mismatch (manifest corrupted)")
        data = decode_json(raw, str(path))
    else:
        handle.seek(manifest_len, os.SEEK_CUR)  # where the payload starts, as after a read
    manifest = manifest_of(data, str(path))
    check_fields(path, manifest)
    _check_limits(path, manifest)
    # Cheap, and the trusted fast path reads nothing else: a cut-short copy must not pass it.
    _check_file_size(path, file_size, HEADER.size + manifest_len + manifest.payload["size"])
    if fresh and decoded is not None:  # only values that passed every check are kept
        decoded.put(manifest_hash.hex(), data)
    return manifest


def parse_manifest(raw: bytes, path: str = "<manifest>") -> Manifest:
    """A manifest's bytes as a Manifest, its JSON and schema checked (not its field formats)."""
    return manifest_of(decode_json(raw, path), path)


def decode_json(raw: bytes, path: str = "<manifest>") -> Any:
    """A manifest's bytes as JSON values; BundleFormatError where they are not JSON."""
    try:
        return json.loads(raw)
    # ValueError: also integers too long to convert; RecursionError: nesting too deep
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BundleFormatError(path, f"manifest is not valid JSON ({exc})") from None


def manifest_of(data: Any, path: str = "<manifest>") -> Manifest:
    """The Manifest of decoded JSON values (decode_json's, or a memo of them: `data` is left as
    given), its schema checked."""
    if not isinstance(data, dict):
        raise BundleFormatError(path, "manifest is not a JSON object")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleFormatError(
            path, f"unknown manifest format version {version!r} (this reader: {FORMAT_VERSION})"
        )
    _expect(data, _MANIFEST_SCHEMA, path, "manifest", _OPTIONAL_MANIFEST_FIELDS)
    entries = []
    for index, raw_entry in enumerate(data["entries"]):
        if not isinstance(raw_entry, dict):
            raise BundleFormatError(path, f"entry {index} is not a JSON object")
        _expect(raw_entry, _ENTRY_SCHEMA, path, f"entry {index}", _OPTIONAL_ENTRY_FIELDS)
        entries.append(Entry(**raw_entry))
    symbols = [entry.symbol for entry in entries]
    if len(set(symbols)) != len(symbols):
        raise BundleFormatError(path, "manifest lists a symbol twice")
    return Manifest(**{**data, "entries": tuple(entries)})


_MANIFEST_SCHEMA = {
    "format_version": int,
    "name": str,
    "arch": str,
    "bundle_version": str,
    "created_by": str,
    "toolchain": dict,
    "families": dict,
    "library": dict,
    "payload": dict,
    "entries": list,
}
_ENTRY_SCHEMA = {
    "family": str,
    "key": dict,
    "key_id": str,
    "symbol": str,
    "sha256": str,
    "size": int,
}
_OPTIONAL_ENTRY_FIELDS = {"gpu_binary": dict, "abi": str}
_OPTIONAL_MANIFEST_FIELDS = {"signature": dict}


def _expect(
    data: dict, schema: dict[str, type], path: str, what: str, optional: dict | None = None
) -> None:
    if _exactly(data, schema, optional or {}):
        return
    optional = {name: kind for name, kind in (optional or {}).items() if name in data}
    if set(data) != set(schema) | set(optional):
        missing = set(schema) - set(data)
        extra = set(data) - set(schema) - set(optional)
        raise BundleFormatError(
            path, f"{what}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}"
        )
    for name, kind in {**schema, **optional}.items():
        if not isinstance(data[name], kind) or (kind is int and isinstance(data[name], bool)):
            raise BundleFormatError(path, f"{what}: field {name!r} must be {kind.__name__}")


def _exactly(data: dict, schema: dict[str, type], optional: dict[str, type]) -> bool:
    """The common case in one pass, without building sets: every field of `schema`, and those of
    `optional` that are there, with exactly their types (so no bool for an int), and no other.
    Anything else goes through _expect's checks, which name what is wrong."""
    count = len(schema)
    for name, kind in optional.items():
        if name in data:
            if type(data[name]) is not kind:
                return False
            count += 1
    return len(data) == count and all(type(data.get(name)) is kind for name, kind in schema.items())


def _check_limits(path: Path, manifest: Manifest) -> None:
    """Sizes no real bundle has, refused before anything is decompressed or allocated."""
    payload_size, library_size = manifest.payload["size"], manifest.library["size"]
    if library_size > MAX_LIBRARY_BYTES:
        raise BundleFormatError(
            path, f"library size {library_size} exceeds the limit of {MAX_LIBRARY_BYTES} bytes"
        )
    if payload_size > MAX_LIBRARY_BYTES:  # real payloads are smaller than their libraries
        raise BundleFormatError(
            path, f"payload size {payload_size} exceeds the limit of {MAX_LIBRARY_BYTES} bytes"
        )
    if library_size > MAX_COMPRESSION_RATIO * max(payload_size, 1):
        raise BundleFormatError(
            path,
            f"a {payload_size}-byte payload claims a {library_size}-byte library "
            f"(over {MAX_COMPRESSION_RATIO}x: refused as a decompression bomb)",
        )


def _check_file_size(path: Path, have: int, want: int) -> None:
    if have != want:
        what = "truncated payload" if have < want else "trailing bytes after the payload"
        raise BundleSizeError(
            path,
            f"file is {have} bytes, its manifest says {want} (header, manifest, payload): {what}",
        )


def read_bundle(path: str | Path, check: ManifestCheck | None = None) -> tuple[Manifest, bytearray]:
    """Manifest and library bytes, every hash and size verified. The library is the bytearray it
    was inflated into: a copy to `bytes` would hold it twice.

    `check(path, manifest)` runs once the manifest is verified and before the payload is read
    or decompressed (the runtime refuses untrusted or incompatible bundles there, cheaply).
    """
    manifest, _payload, library = read_verified(Path(path), check)
    return manifest, library


def read_verified(path: Path, check: ManifestCheck | None) -> tuple[Manifest, bytes, bytearray]:
    """Manifest, payload and library, all verified (read_bundle's, and the writer's to keep a
    payload as it is)."""
    with _open_regular(path) as (handle, size):
        manifest = _read_manifest(path, handle, size)
        if check is not None:
            check(path, manifest)
        # The file's size matched; one byte more tells a file that grew since.
        payload = handle.read(manifest.payload["size"] + 1)
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
        if entry.abi not in ABIS:
            raise BundleFormatError(path, f"{what}: abi {entry.abi!r} is not one of {ABIS}")


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


def _unpack_library(path: Path, manifest: Manifest, payload: bytes) -> bytearray:
    """The library, from a payload read after _read_manifest checked the sizes and limits."""
    if manifest.payload["codec"] != "zstd":
        raise BundleFormatError(path, f"unknown payload codec {manifest.payload['codec']!r}")
    if len(payload) != manifest.payload["size"]:  # the file changed after its size was checked
        what = "truncated payload" if len(payload) < manifest.payload["size"] else "trailing bytes"
        raise BundleSizeError(
            path,
            f"{what}: read {len(payload)} payload bytes, manifest says {manifest.payload['size']}",
        )
    if sha256(payload) != manifest.payload["sha256"]:
        raise BundleIntegrityError(path, "payload hash mismatch (payload corrupted)")
    library = _decompress_bounded(path, payload, manifest.library["size"])
    if sha256(library) != manifest.library["sha256"]:
        raise BundleIntegrityError(path, "library hash mismatch")
    return library


def _decompress_bounded(path: Path, payload: bytes, library_size: int) -> bytearray:
    """Inflate at most library_size + 1 bytes, whatever the frame claims, into one buffer.

    The buffer grows with what actually inflates (realloc extends large blocks in place, by
    mremap) instead of being made at the declared size: bytearray(n) writes n zeros, so a payload
    that lies would cost its whole declaration before its first byte is read. Chunks are never
    collected and joined (two copies). stream_reader.read(n) may return fewer than n bytes, so
    read until end of stream, never asking for more than one byte past the promised size (that
    one byte detects an overlong payload).
    """
    library = bytearray()
    try:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        # Across frames: bytes after the first frame are read too, so they cannot hide.
        with decompressor.stream_reader(payload, read_across_frames=True) as reader:
            while len(library) <= library_size:
                chunk = reader.read(min(_DECOMPRESS_CHUNK, library_size + 1 - len(library)))
                if not chunk:
                    break
                library += chunk
    except zstandard.ZstdError as exc:
        raise BundleIntegrityError(path, f"payload does not decompress ({exc})") from None
    except MemoryError:
        del library  # the error's traceback keeps this frame alive: free the buffer now
        raise BundleIntegrityError(
            path, f"not enough memory to decompress its {library_size}-byte library"
        ) from None
    if len(library) != library_size:
        more = "more than " if len(library) > library_size else ""
        raise BundleIntegrityError(
            path,
            f"library decompresses to {more}{len(library)} bytes, manifest says {library_size}",
        )
    return library
