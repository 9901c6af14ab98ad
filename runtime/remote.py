"""Bundles at URLs (s3://, gs://, https://, any fsspec protocol): fetched once per machine into a
content-addressed, verified download cache under the cache dir.

A URL whose path ends in `.cuteaot` names one bundle; any other names a folder or prefix, whose
`*.cuteaot` objects directly inside are its bundles. Layout, under `<cache dir>/remote/` (0700):

    <sha256>.cuteaot       verified copies, named by the sha256 of their bytes (URLs share them)
    index/<url id>.json    per URL: {"url", "fetched", "objects": [{name, url, sha256, size,
                           version}]}, version being the store's ETag or mtime: what lets the next
                           process skip the download, and an unreachable store be served offline
    locks/<url id>.lock    held while one process fetches the URL: the others wait, then reuse
                           (artifacts/atomic.claimed; a killed fetcher's is taken over)

A download goes to a pid-tagged temporary name beside its copy (atomic.remove_dead_leftovers
removes a dead writer's), is fsynced, verified, then renamed: nothing half-written or unverified is
ever used. Verified means the container's checks (every hash and size, artifacts/bundle.py) and a
signature by a key in CUTE_AOT_TRUSTED_KEYS; CUTE_AOT_REMOTE_UNSIGNED=1 leaves only the local
policy (runtime/loader.py check_trust). A refused object raises a BundleError naming its URL and
is never kept.

The store is configured as fsspec and its protocol are (fsspec's config files and
FSSPEC_<PROTOCOL>_<OPTION> variables; for s3:// also AWS_ENDPOINT_URL(_S3) and the AWS credential
chain). Only timeouts are set here, as defaults that such configuration overrides.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import posixpath
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cute_aot.artifacts import signing
from cute_aot.artifacts.bundle import (
    BUNDLE_SUFFIX,
    SHA256_RE,
    read_bundle,
    read_manifest,
    sha256_file,
)
from cute_aot.artifacts.core import cache_layout, settings, urls
from cute_aot.artifacts.core.atomic import (
    Claimed,
    atomic_write,
    claimed,
    remove_dead_leftovers,
    temporary_name,
)
from cute_aot.artifacts.core.errors import BundleError, CuteAotError, SignatureError
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.artifacts.manifest import Manifest
from cute_aot.runtime import policy
from cute_aot.runtime.loader import check_trust
from cute_aot.runtime.paths import expand_bundle_paths

LOCK_WAIT = 600.0  # another process's download of a large bundle over a slow link
# Older than any fetch: a holder on another machine sharing the cache dir (NFS) that died.
LOCK_STALE = 2 * LOCK_WAIT
# One put of an object is atomic in these: readers see the old object or the new, never a part.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


@dataclass(frozen=True)
class RemoteBundle:
    name: str  # its file name at the URL
    url: str  # the object's own URL
    path: Path  # the verified local copy
    sha256: str
    size: int
    version: str | None  # the store's ETag or mtime of the object it was copied from


@dataclass(frozen=True)
class _Listed:
    name: str
    remote_path: str
    url: str
    size: int | None
    version: str | None


def fetch(url: str) -> list[Path]:
    """Local verified copies of the bundles at `url` (a bundle file or a folder of them)."""
    return [bundle.path for bundle in fetch_bundles(url)]


def fetch_bundles(url: str, strict: bool | None = None, offline: bool = True) -> list[RemoteBundle]:
    """The bundles at `url`, each downloaded unless a verified copy of the same object is cached.

    A refused object of a folder URL is skipped with one warning unless `strict` (default: mode
    aot), as a bad file of a local folder is; a bundle URL's refusal always raises. With
    `offline`, a store that cannot be reached is served from the copies its last fetch verified,
    said once; without such copies, or without `offline`, OSError names the URL and the reason.
    """
    if strict is None:  # a refused object falls back unless mode aot
        strict = policy.on_load_failure(policy.DAMAGED) == policy.RAISE
    fs, root = urls.filesystem(url)
    folder = _cache_folder()
    url_id = hashlib.sha256(url.encode()).hexdigest()[:32]
    lock = folder / cache_layout.REMOTE_LOCKS / f"{url_id}.lock"
    index = folder / cache_layout.REMOTE_INDEX / f"{url_id}{cache_layout.REMOTE_INDEX_SUFFIX}"
    try:
        # 8 ranks of a node: one downloads, the others then find its verified copy
        with claimed(lock, wait=LOCK_WAIT, stale_after=LOCK_STALE):
            remove_dead_leftovers(folder)
            return _fetch_locked(url, fs, root, folder, index, strict, offline)
    except Claimed:
        raise OSError(
            errno.ETIMEDOUT,
            f"another process has been fetching {url} for over {LOCK_WAIT:.0f} s",
            str(lock),
        ) from None


def _fetch_locked(url, fs, root, folder: Path, index: Path, strict, offline) -> list[RemoteBundle]:
    known = {entry["name"]: entry for entry in _read_index(index)}
    single = _names_a_bundle(root)
    try:
        listed = _list(fs, root, url, single)
        if not listed:
            raise FileNotFoundError(errno.ENOENT, f"no *{BUNDLE_SUFFIX} bundles at {url}", url)
        kept = []
        for item in listed:
            try:
                kept.append(
                    _reuse(folder, known.get(item.name), item) or _download(fs, item, folder)
                )
            except BundleError as exc:
                if single or strict:
                    raise
                warn_once(
                    ("remote-refused", item.url),
                    f"skipping {exc}; its kernels fall back to the overlay cache or JIT",
                )
    except urls.Unreachable as exc:
        if not offline:
            raise
        return _serve_offline(url, list(known.values()), folder, exc)
    _write_index(index, url, kept)
    return kept


# -- the store -----------------------------------------------------------------------------------
def _names_a_bundle(root: str) -> bool:
    return root.rstrip("/").endswith(BUNDLE_SUFFIX)


def _list(fs, root: str, url: str, single: bool) -> list[_Listed]:
    """The bundle objects at `root`, sorted by name (the order local folders load in)."""
    if single:
        infos = [urls.store_call(url, fs, "info", root)]
    else:
        infos = [
            info
            for info in urls.store_call(url, fs, "ls", root, detail=True)
            if _inside(info, root)
        ]
        # Listings of some stores (http) carry no size or version: each object is asked.
        infos = [
            info
            if _version(info) and info.get("size") is not None
            else urls.store_call(url, fs, "info", info["name"])
            for info in infos
        ]
    listed = [
        _Listed(
            posixpath.basename(info["name"].rstrip("/")),
            info["name"],
            fs.unstrip_protocol(info["name"]),
            info.get("size"),
            _version(info),
        )
        for info in infos
    ]
    return sorted(listed, key=lambda item: item.name)


def _inside(info: dict, root: str) -> bool:
    """A bundle object directly inside `root` (an HTTP page may link anywhere)."""
    name = info["name"].rstrip("/")
    parent = name.rsplit("/", 1)[0]
    return (
        info.get("type") == "file" and name.endswith(BUNDLE_SUFFIX) and parent == root.rstrip("/")
    )


def _version(info: dict) -> str | None:
    """What changes whenever the object's bytes do, as far as the store says: its ETag (S3, GCS,
    most HTTP servers), else its modification time (HTTP Last-Modified, local files)."""
    for field in ("ETag", "etag", "md5Hash", "LastModified", "Last-Modified", "mtime", "updated"):
        if info.get(field) is not None:
            return f"{field}={info[field]}"
    return None


# -- copies --------------------------------------------------------------------------------------
def _cache_folder() -> Path:
    folder = settings.cache_dir() / cache_layout.REMOTE.folder
    for made in (folder, folder / cache_layout.REMOTE_INDEX, folder / cache_layout.REMOTE_LOCKS):
        made.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _reuse(folder: Path, entry: dict | None, item: _Listed | None) -> RemoteBundle | None:
    """The cached copy of `entry` if it still is what the store lists (same version and size;
    item None: offline, the store cannot say) and still passes the trust policy; else None."""
    if entry is None:
        return None
    if item is not None and (
        item.version is None
        or item.version != entry["version"]
        or item.size not in (None, entry["size"])
    ):
        return None
    path = folder / f"{entry['sha256']}{BUNDLE_SUFFIX}"
    try:
        if path.stat().st_size != entry["size"]:
            return None
        _check_remote_trust(entry["url"], read_manifest(path))
    except (OSError, BundleError):
        return None  # gone, damaged or no longer trusted: downloaded again (and judged again)
    return RemoteBundle(
        entry["name"], entry["url"], path, entry["sha256"], entry["size"], entry["version"]
    )


def _download(fs, item: _Listed, folder: Path) -> RemoteBundle:
    def once() -> RemoteBundle:
        tmp = str(folder / temporary_name(".download"))
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            fs.get_file(item.remote_path, tmp)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())  # on disk before its name says it is verified
            digest, size = sha256_file(tmp)
            if item.size is not None and size != item.size:  # a cut connection, not a bad object
                raise EOFError(f"received {size} of {item.size} bytes")
            _verify(tmp, item.url)
            final = folder / f"{digest}{BUNDLE_SUFFIX}"
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)
            return RemoteBundle(item.name, item.url, final, digest, size, item.version)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    return urls.retried(item.url, once)  # a cut transfer is downloaded again


def _verify(path: str, url: str) -> None:
    """Every container check and the remote trust policy; a refusal names `url`, not the
    temporary file."""
    try:
        read_bundle(path, check=lambda _path, manifest: _check_remote_trust(url, manifest))
    except BundleError as exc:
        if exc.path == url:
            raise
        raise type(exc)(url, str(exc).removeprefix(f"{exc.path}: ")) from None


def _check_remote_trust(url: str, manifest: Manifest) -> None:
    if settings.remote_unsigned():
        check_trust(url, manifest)  # the local policy: a tampered signed bundle is still refused
        return
    if manifest.signature is None:
        raise SignatureError(
            url,
            f"not signed: bundles from URLs must be signed by a key in "
            f"{settings.TRUSTED_KEYS.name} (or set "
            f"{settings.REMOTE_UNSIGNED.name}=1)",
        )
    signing.verify_signature(manifest, signing.trusted_keys(), url)


def _serve_offline(url: str, entries: list[dict], folder: Path, exc: OSError) -> list[RemoteBundle]:
    copies = [_reuse(folder, entry, None) for entry in entries]
    if not entries or None in copies:
        raise urls.Unreachable(
            exc.errno, f"{exc.strerror}; no verified copy of it is cached here", url
        ) from None
    warn_once(
        ("remote-offline", url),
        f"{url} {exc.strerror}; serving the {len(copies)} bundle(s) verified at its last "
        f"fetch from {folder}",
    )
    return [copy for copy in copies if copy is not None]


def _read_index(path: Path) -> list[dict]:
    """The index's entries that are well formed (a sha256 names a file); none if unreadable."""
    try:
        return index_entries(path.read_bytes())
    except OSError:
        return []


def index_entries(data: bytes) -> list[dict]:
    """The well-formed entries of an index's bytes (also what `aot-cache gc` keeps copies
    for); none if they are no index."""
    try:
        entries = json.loads(data)["objects"]
    except (ValueError, KeyError, TypeError):
        return []
    if not isinstance(entries, list):
        return []
    fields = {"name": str, "url": str, "sha256": str, "size": int}
    return [
        entry
        for entry in entries
        if isinstance(entry, dict)
        and all(isinstance(entry.get(name), kind) for name, kind in fields.items())
        and SHA256_RE.match(entry["sha256"])
        and isinstance(entry.get("version"), (str, type(None)))
    ]


def _write_index(path: Path, url: str, kept: list[RemoteBundle]) -> None:
    objects = [
        {name: value for name, value in asdict(bundle).items() if name != "path"} for bundle in kept
    ]
    document = {"url": url, "fetched": time.time(), "objects": objects}
    atomic_write(path, json.dumps(document, indent=1).encode(), mode=0o600)


# -- publishing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pushed:
    name: str
    url: str
    size: int
    sha256: str
    signed: bool


def push(sources: list[str | os.PathLike], url: str) -> list[Pushed]:
    """Upload bundle files, and the bundles of folders, under the folder or prefix `url`, each
    verified first: a damaged bundle is never published. An object store replaces an object
    atomically; elsewhere each goes up under a temporary name and is then renamed into place."""
    files = expand_bundle_paths([Path(source) for source in sources])
    if not files:
        raise CuteAotError(f"no bundle files in {', '.join(map(str, sources))}")
    fs, root = urls.filesystem(url)
    if _names_a_bundle(root):
        raise CuteAotError(f"{url}: push to a folder or prefix URL, not to a bundle's")
    base = root.rstrip("/")
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    renamed = not protocols & _OBJECT_STORES
    if renamed:
        urls.store_call(url, fs, "makedirs", base, exist_ok=True)
    pushed = []
    for path in files:
        manifest, _library = read_bundle(path)
        digest, size = sha256_file(path)
        target = f"{base}/{path.name}"
        target_url = fs.unstrip_protocol(target)
        if renamed:
            temporary = f"{base}/{temporary_name(f'.{path.name}')}"
            try:
                urls.store_call(target_url, fs, "put_file", str(path), temporary)
                urls.store_call(target_url, fs, "mv", temporary, target)
            finally:
                with contextlib.suppress(Exception):  # gone already when the rename worked
                    urls.store_call(target_url, fs, "rm", temporary)
        else:
            urls.store_call(target_url, fs, "put_file", str(path), target)
        stored = urls.store_call(target_url, fs, "info", target).get("size")
        if stored not in (None, size):
            raise OSError(
                errno.EIO, f"the store holds {stored} bytes, {size} were pushed", target_url
            )
        pushed.append(Pushed(path.name, target_url, size, digest, manifest.signature is not None))
    return pushed


def pull(url: str, out: str | os.PathLike | None = None) -> list[RemoteBundle]:
    """Download and verify the bundles at `url` into the download cache, and copy them into
    `out` under their own names. Strict: any refusal raises, and an unreachable store is an
    error, not served from the cache."""
    bundles = fetch_bundles(url, strict=True, offline=False)
    if out is None:
        return bundles
    copied = []
    for bundle in bundles:
        target = Path(out) / bundle.name
        atomic_write(target, bundle.path.read_bytes())
        copied.append(replace(bundle, path=target))
    return copied
