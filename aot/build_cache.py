"""The content-addressed build cache: a rebuild that changes nothing compiles and links nothing.

    <root>/objects/<d[:2]>/<d>.o + <d>.json      d = digest(key, arch, toolchain, sources, worker)
    <root>/bundles/<d[:2]>/<d>.cuteaot + <d>.json  d = digest(every input of one bundle file)

An entry is two files: the data, then a small JSON record (its sha256 and size, plus the report
row for objects) published last as the commit marker. Both are published first-wins with link()
(`publish_once`), so any number of builds may share one cache folder, NFS included, without locks.
A record whose data does not match is a miss and is removed. The cache never fails a build: if
it cannot be written, the build goes on without it and says why once.

Trust: anyone who can write the cache folder can put objects into the bundles built from it. A
build given a signing key signs every record it publishes (ed25519 over the record, its data's
sha256 and its digest; artifacts/signing.py); a build given trusted keys uses an entry only when
its record is signed by one of them, and treats anything else as a miss, counted in `untrusted`.
Such an entry is left in place (it may be good, just not vouched for): the fresh result is then
published only where nothing is there, first-wins as always.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cute_aot.artifacts import PACKAGE_VERSION, signing, toolchain
from cute_aot.artifacts.bundle import sha256_file
from cute_aot.artifacts.core import cache_layout, settings
from cute_aot.artifacts.core.atomic import publish_once
from cute_aot.artifacts.core.errors import SignatureError
from cute_aot.artifacts.core.settings import cache_dir
from cute_aot.artifacts.digest import SPACED, json_digest
from cute_aot.artifacts.fingerprints import packer_identity
from cute_aot.kernels import family_facts, source_hash

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# Bump when the layout or the meaning of a digest changes: old entries are then never found.
CACHE_FORMAT = 1
CACHE_SUBDIR = cache_layout.BUILD.folder

# Row fields that describe one run rather than the object: never stored, never part of a digest.
VOLATILE_ROW_FIELDS = frozenset({"object", "seconds", "status", "error", "traceback", "cached"})

# Code whose change changes an object (the worker's export options) or a bundle (link, pack,
# container). Kernel sources are covered per family by source_hash.
_DATA_SUFFIX = dict(cache_layout.BUILD.parts)  # objects/ -> .o, bundles/ -> .cuteaot

# The compile worker's identity, in every object's cache digest: bump it when the object or the
# row the worker makes for the same key changes (the export, what binary_info reads from an
# object, the ELF and fatbin readers it uses). Nothing else of cute-aot moves it.
WORKER_VERSION = 1
# worker version -> the identity earlier releases computed from the worker's source files before
# it was a version: the objects they cached stay valid.
_EARLIER_WORKER_IDENTITIES = {
    1: "fcdbbcf91c63bcbd8c03dc4200ead95d9309a0d8f058064f990221e47ce2ce4b",
}


def default_cache_root() -> Path:
    """Under the per-user cute-aot cache folder ($CUTE_AOT_CACHE_DIR or ~/.cache/cute-aot)."""
    return cache_dir() / CACHE_SUBDIR


def stable_row(row: dict) -> dict:
    """What a report row says about the object itself (hash, size, resources...)."""
    return {name: value for name, value in row.items() if name not in VOLATILE_ROW_FIELDS}


def cache_digest(facts: dict) -> str:
    """The digest an entry is found by: of its facts (`BuildCache.object_facts`,
    `BuildCache.bundle_facts`), in the canonical JSON cached entries were keyed by."""
    return json_digest(facts, separators=SPACED)


@functools.cache
def worker_fingerprint() -> dict:
    """The worker's identity, and the inspection tools whose presence shapes its rows."""
    identity = _EARLIER_WORKER_IDENTITIES.get(WORKER_VERSION) or json_digest(
        {"worker": WORKER_VERSION}
    )
    return {"modules": identity, "tools": _inspection_tools()}  # "modules": the digests' name


def _inspection_tools() -> dict:
    # cuobjdump/nvdisasm decide what a row's `gpu_binary` (and so the manifest) holds: a cache
    # shared by machines with and without them must not mix their rows.
    try:
        from cute_aot.aot import binary_info
    except ImportError:
        return {}
    tools = {}
    for name in sorted(getattr(binary_info, "TOOL_DISTRIBUTIONS", {})):
        path = binary_info.find_tool(name)
        tools[name] = (binary_info.tool_version(path) or "unknown version") if path else None
    return tools


@functools.cache
def packer_fingerprint() -> dict:
    """Everything besides the objects that goes into a bundle's bytes."""
    import zstandard

    from cute_aot.artifacts.link import link_inputs

    compiler = settings.c_compiler()
    return {
        "code": packer_identity(),  # bundle format version and packer version
        "link_inputs": {name: sha256_file(path)[0] for name, path in sorted(link_inputs().items())},
        "compiler": _compiler_identity(compiler) if compiler else None,
        "zstd": zstandard.ZSTD_VERSION,
    }


def _compiler_identity(compiler: str) -> str:
    try:
        result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{compiler}: {exc}"
    return f"{compiler}: {result.stdout.strip()}"


class BuildCache:
    """Objects and bundles from earlier builds, found by the digest of everything they depend on."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        sign_key: Ed25519PrivateKey | None = None,
        trusted_keys: Mapping[str, signing.TrustedKey] | None = None,
    ):
        """sign_key: sign every record published. trusted_keys: use only entries whose record
        one of these keys signed (None: every intact entry, as a private cache may)."""
        self.root = Path(root)
        # Read once: a release plan has thousands of keys and metadata look-ups are not free.
        self.toolchain = toolchain.fingerprint()
        self.sign_key = sign_key
        self.trusted_keys = trusted_keys
        self.hits = 0
        self.misses = 0
        self.untrusted = 0  # entries (objects and bundles) refused: not signed by a trusted key
        self.write_error: str | None = None  # set once writing failed; writing then stops

    # -- digests ---------------------------------------------------------------------------

    def object_digest(self, key, arch: str) -> str:
        return cache_digest(self.object_facts(key, arch))

    def object_facts(self, key, arch: str) -> dict:
        """Everything the object of `key` for `arch` depends on (what its digest is of)."""
        return {
            "cache_format": CACHE_FORMAT,
            "key": key.canonical_json(),
            "arch": arch,
            "toolchain": self.toolchain,
            "source_hash": source_hash(key.FAMILY),
            "worker": worker_fingerprint(),
        }

    def bundle_digest(
        self, name: str, arch: str, bundle_version: str, rows: list[dict], tables: dict
    ) -> str:
        """rows: the report rows of the bundle's objects, in link order; tables: the records
        of the dispatch tables its manifest carries (part of its bytes)."""
        return cache_digest(self.bundle_facts(name, arch, bundle_version, rows, tables))

    def bundle_facts(
        self, name: str, arch: str, bundle_version: str, rows: list[dict], tables: dict
    ) -> dict:
        """Everything a bundle's bytes depend on (what its digest is of); as bundle_digest."""
        families = sorted({row["family"] for row in rows})
        return {
            "cache_format": CACHE_FORMAT,
            "name": name,
            "arch": arch,
            "bundle_version": bundle_version,
            "created_by": PACKAGE_VERSION,
            "toolchain": self.toolchain,
            "families": {f: family_facts(f) for f in families},
            "objects": [stable_row(row) for row in rows],
            "tables": tables,
            "packer": packer_fingerprint(),
        }

    # -- objects ---------------------------------------------------------------------------

    def fetch_object(self, key, arch: str, dest: Path) -> dict | None:
        """Copy a cached object to `dest`; returns its report row, or None on a miss."""
        found = self._get("objects", self.object_digest(key, arch))
        if found is None or found[1].get("key") != key.canonical_json():
            self.misses += 1
            return None
        data, record = found
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        self.hits += 1
        return {
            **record["row"],
            "object": str(dest),
            "status": "ok",
            "seconds": 0.0,
            "cached": True,
        }

    def store_object(self, key, arch: str, row: dict) -> None:
        if row.get("status") != "ok":
            return
        data = Path(row["object"]).read_bytes()
        record = {"key": key.canonical_json(), "arch": arch, "row": stable_row(row)}
        self._put("objects", self.object_digest(key, arch), data, record)

    # -- bundles ---------------------------------------------------------------------------

    def fetch_bundle(self, digest: str) -> bytes | None:
        found = self._get("bundles", digest)
        return found[0] if found else None

    def store_bundle(self, digest: str, data: bytes) -> None:
        self._put("bundles", digest, data, {})

    # -- storage ---------------------------------------------------------------------------

    def _paths(self, kind: str, digest: str) -> tuple[Path, Path]:
        """(data, record) of an entry: names as the cache layout declares them."""
        folder = self.root / kind / digest[:2]
        return (
            folder / f"{digest}{_DATA_SUFFIX[kind]}",
            folder / f"{digest}{cache_layout.BUILD.marker}",
        )

    def _get(self, kind: str, digest: str) -> tuple[bytes, dict] | None:
        data_path, record_path = self._paths(kind, digest)
        try:
            record = json.loads(record_path.read_bytes())
            data = data_path.read_bytes()
        except (OSError, ValueError):
            return None
        if (
            not isinstance(record, dict)
            or record.get("sha256") != hashlib.sha256(data).hexdigest()
            or record.get("size") != len(data)
        ):
            self._discard(record_path, data_path)  # corrupt: let the next build publish it anew
            return None
        if not self._vouched_for(kind, digest, record, record_path):
            return None
        return data, record

    def _vouched_for(self, kind: str, digest: str, record: dict, record_path: Path) -> bool:
        """Whether this build may use the entry. The data was just checked against the record's
        sha256, so a verified signature over the record covers the very bytes returned."""
        if self.trusted_keys is None:
            return True
        try:
            signing.verify_cache_record(kind, digest, record, self.trusted_keys, record_path)
        except SignatureError:
            # Not removed: it may be another writer's good entry, just not one we can vouch for.
            self.untrusted += 1
            return False
        return True

    def _put(self, kind: str, digest: str, data: bytes, record: dict) -> None:
        if self.write_error:
            return
        data_path, record_path = self._paths(kind, digest)
        record = {**record, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        if self.sign_key is not None:
            record = signing.sign_cache_record(kind, digest, record, self.sign_key)
        try:
            if not publish_once(data_path, data) and data_path.read_bytes() != data:
                # Another writer's different bytes hold the name: a record of ours would
                # describe data that is not there. Leave the entry to that writer.
                return
            publish_once(record_path, json.dumps(record, sort_keys=True).encode())  # commit marker
        except OSError as exc:
            self.write_error = f"cannot write the build cache under {self.root} ({exc})"

    @staticmethod
    def _discard(*paths: Path) -> None:
        for path in paths:
            try:
                path.unlink()
            except OSError:
                pass
