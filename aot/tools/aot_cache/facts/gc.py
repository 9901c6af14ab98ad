"""The per-user cache dir's housekeeping: what the overlay holds (`aot-cache ls`), and pruning
all five caches while servers and builds use them (`aot-cache gc`).

What is collected, in units that go together or not at all (commit marker listed first), as
artifacts/core/cache_layout.py declares each area (AREAS: folder, unit, marker, gc rule); the
walkers below take every name from there:

    overlay/<fingerprint>/<arch>/<key id>.cuteaot           one file (runtime/overlay.py)
    overlay/.../<key id>.cuteaot.refused-<random>           set aside by a reader: always goes
    libs/<sha256>.verified.json + libs/<sha256>.so          the facts, then the library (loader)
    manifests/<sha256>.<python>.marshal                     a decoded manifest (manifest_memo)
    <build>/{objects,bundles}/<d[:2]>/<d>.json + <d>.{o,cuteaot}   record, then data (build_cache)
    remote/<sha256>.cuteaot                                 a verified download (runtime/remote.py)
    remote/index/<url id>.json                              what a URL held at its last fetch
    .<name>.<random>.tmp anywhere under those, and elsewhere in the cache dir when every cache is
    collected: temporaries (artifacts/core/atomic.py), only once an hour old (younger ones may still
    be being written)

Downloads are judged by age and size like the other units, and an index is in use whenever one
of the copies it names is (it ages no sooner than the newest). Besides, a copy that no index names
(its URL now holds another object) and an index whose copies are all gone are never read again,
so they go once unused for an hour (a fetch names its copies only after its last download).
remote/locks/ is never touched: removing the file of a held lock would let a second process
fetch the same URL.

A unit's last use is the newest atime or mtime of its files: readers read (atime), writers
publish (mtime). With the usual `relatime` mount option the kernel updates atime at least once a
day on a read, which is enough for ages counted in days; on a `noatime` mount last use falls
back to when the unit was written.

Safe with live servers and builds:
- A unit's commit marker is unlinked before its data, so a concurrent reader finds a whole entry
  or a miss: never a build record without its object, never a library whose verified facts
  outlive it (the loader trusts a library only with its facts, and re-verifies without them).
- Unlinking a library a server has mapped or opened is fine: the mapping and the descriptor keep
  the inode alive. A reader that opens a name a moment later takes its miss path.
- Nothing last used less than `grace` seconds ago goes (a publisher's fresh link survives), and
  right before each unlink the file is looked at again: one replaced or used since it was planned
  is kept. Folders are never removed (a publisher may be about to create a file in one).
- Symbolic links are never followed: every folder below a cache's root is opened with
  O_NOFOLLOW relative to its parent's descriptor, and files are unlinked relative to their
  folder's, so nothing outside the cache dir is read or removed. A link found where a unit's file
  belongs is removed as the link it is.
- Files and folders that vanish mid-walk (another gc, a reader discarding a bad entry) are
  skipped; removing what is already gone counts as nothing.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from cute_aot.artifacts.core import cache_layout, settings
from cute_aot.artifacts.core.cache_layout import CacheArea
from cute_aot.kernels import families
from cute_aot.runtime import overlay, remote

CACHES = tuple(sorted(area.name for area in cache_layout.AREAS))
OTHER = "other"  # temporaries elsewhere in the cache dir (keys/, ...)
GRACE_S = 60.0
TEMPORARY_DEBRIS_S = 3600.0  # a temporary this old was left by a killed writer
UNREAD_S = TEMPORARY_DEBRIS_S  # a download no index names, unused this long, is not in flight
MAX_DEPTH = 8  # the caches are 3 folders deep; a deeper tree is not ours to walk

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass(frozen=True)
class FileState:
    """One file of a unit as the walk saw it."""

    name: str
    identity: tuple[int, int, int, int]  # dev, inode, size, mtime: tells it from a replacement
    size: int
    last_use_ns: int  # max(atime, mtime)


@dataclass(frozen=True)
class CacheUnit:
    """Files that are kept or removed together, commit marker first."""

    cache: str  # build | libs | manifests | overlay | remote | other
    kind: str  # entry | refused | library | manifest | object | bundle | copy | index | temporary
    base: Path  # the folder the walk started from (followed, as the user named it)
    folder: tuple[str, ...]  # the unit's folder below `base`: never followed
    files: tuple[FileState, ...]
    age_s: float = 0.0  # since last use, when planned
    reason: str | None = None  # why it is removed; None: kept
    unread: str | None = None  # why nothing will read it again (remote/): goes after UNREAD_S

    @property
    def path(self) -> Path:
        """The unit's data file (its last), or whatever is left of it."""
        return self.base.joinpath(*self.folder, self.files[-1].name)

    @property
    def paths(self) -> list[Path]:
        return [self.base.joinpath(*self.folder, f.name) for f in self.files]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def last_use(self) -> float:
        return max(f.last_use_ns for f in self.files) / 1e9


@dataclass(frozen=True)
class CacheRoot:
    """Where one cache lives: `base` is followed (the user chose it), `below` never is."""

    name: str
    base: Path
    below: tuple[str, ...]
    area: CacheArea | None = None  # None: the rest of the cache dir (OTHER)

    @property
    def path(self) -> Path:
        return self.base.joinpath(*self.below)


# -- the overlay, for `aot-cache ls` ---------------------------------------------------------------
def current_fingerprints() -> dict[str, str]:
    """Overlay fingerprint -> family, for this installation's toolchain and kernel sources."""
    return {overlay.fingerprint(name): name for name in families()}


def overlay_files() -> list[Path]:
    root = overlay.overlay_root()
    return sorted(root.glob(f"*/*/*{cache_layout.OVERLAY.marker}")) if root.is_dir() else []


def overlay_summary() -> list[dict]:
    """One row per <fingerprint>/<arch> folder: family (if this installation uses it), keys, bytes.
    With no overlay entries nothing is fingerprinted: listing must not create the overlay's
    signing key as a side effect."""
    files = overlay_files()
    current = current_fingerprints() if files else {}
    groups: dict[Path, dict] = {}
    for path in files:
        try:
            info = path.stat()
        except FileNotFoundError:  # removed by a concurrent gc
            continue
        fingerprint = path.parent.parent.name
        group = groups.setdefault(
            path.parent,
            {
                "path": str(path.parent),
                "arch": path.parent.name,
                "fingerprint": fingerprint,
                "family": current.get(fingerprint),
                "status": "current" if fingerprint in current else "unused here",
                "keys": 0,
                "file_size": 0,
                "newest_mtime": 0.0,
            },
        )
        group["keys"] += 1
        group["file_size"] += info.st_size
        group["newest_mtime"] = max(group["newest_mtime"], info.st_mtime)
    return list(groups.values())


# -- walking without following links ---------------------------------------------------------------
def _open_folder(base: Path, below: tuple[str, ...]) -> int | None:
    """A descriptor of base/below, opening each part of `below` with O_NOFOLLOW relative to its
    parent: a part that is (or has just become) a link is refused, never followed."""
    try:
        fd = os.open(base, _DIR_FLAGS)
    except OSError:
        return None
    for part in below:
        try:
            child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            child = None
        os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _list(fd: int) -> list[str]:
    """Names in the folder open at `fd` (a seam for tests that make files vanish mid-walk)."""
    return os.listdir(fd)


def _file_state(name: str, info: os.stat_result) -> FileState:
    return FileState(
        name,
        (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns),
        info.st_size,
        max(info.st_atime_ns, info.st_mtime_ns),
    )


def _walk(
    root: CacheRoot, walked: set[tuple[int, int]], skip: frozenset | set = frozenset()
) -> list[tuple[tuple[str, ...], FileState]]:
    """(folder below root.base, file) for every non-folder under the root, links included as
    themselves. The root's folder (device, inode) is added to `walked`; folders in `skip` are
    left out."""
    fd = _open_folder(root.base, root.below)
    if fd is None:
        return []
    info = os.fstat(fd)
    walked.add((info.st_dev, info.st_ino))
    found: list[tuple[tuple[str, ...], FileState]] = []
    _walk_folder(fd, root.below, skip, found)
    return found


def _walk_folder(fd: int, folder: tuple[str, ...], skip: set, found: list) -> None:
    """Closes fd."""
    try:
        names = _list(fd)
    except OSError:  # removed meanwhile
        names = []
    try:
        for name in sorted(names):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:  # vanished between listing and looking
                continue
            if not stat.S_ISDIR(info.st_mode):
                found.append((folder, _file_state(name, info)))
            elif (info.st_dev, info.st_ino) not in skip and len(folder) < MAX_DEPTH:
                try:
                    child = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except OSError:  # vanished, or swapped for a link since the stat
                    continue
                _walk_folder(child, (*folder, name), skip, found)
    finally:
        os.close(fd)


# -- what is where ---------------------------------------------------------------------------------
def is_temporary(name: str) -> bool:
    """atomic.py's temporary names: .<name>.<random>.tmp"""
    return len(name) > len("..tmp") and name.startswith(".") and name.endswith(".tmp")


def cache_roots(caches: Iterable[str] = CACHES, build_root: Path | None = None) -> list[CacheRoot]:
    """The roots of the chosen caches. The build cache's default is `build` in the cache dir;
    `build_root` (aot-build --cache-dir) is followed as given, like the cache dir itself."""
    base = settings.cache_dir()
    chosen = set(caches)
    roots = [
        CacheRoot(area.name, base, (area.folder,), area)
        if area is not cache_layout.BUILD or build_root is None
        else CacheRoot(area.name, Path(build_root), (), area)
        for area in cache_layout.AREAS
        if area.name in chosen
    ]
    return sorted(roots, key=lambda root: CACHES.index(root.name))


def _temporary(root: CacheRoot, folder: tuple[str, ...], file: FileState) -> CacheUnit:
    return CacheUnit(root.name, "temporary", root.base, folder, (file,))


def _is_refused(area: CacheArea, name: str) -> bool:
    """<entry><marker>.refused-<random>: set aside by overlay.set_aside."""
    entry, mark, _ = name.partition(cache_layout.OVERLAY_REFUSED)
    return bool(mark) and area.is_unit_file(entry, area.marker)


def _entry_units(root: CacheRoot, walked: set) -> list[CacheUnit]:
    """One file per unit at any depth (the overlay's entries), and entries set aside."""
    area = root.area
    units = []
    for folder, file in _walk(root, walked):
        if is_temporary(file.name):
            kind = "temporary"
        elif area.is_unit_file(file.name, area.marker):
            kind = area.kind
        elif _is_refused(area, file.name):
            kind = "refused"
        else:
            continue  # not ours to judge
        units.append(CacheUnit(root.name, kind, root.base, folder, (file,)))
    return units


def _memo_units(root: CacheRoot, walked: set) -> list[CacheUnit]:
    """Decoded manifests directly in manifests/ (read again only while their bundle is opened);
    temporaries at any depth."""
    area = root.area
    units = []
    for folder, file in _walk(root, walked):
        if is_temporary(file.name):
            units.append(_temporary(root, folder, file))
        elif folder == root.below and area.is_unit_file(file.name, area.marker):
            units.append(CacheUnit(root.name, area.kind, root.base, folder, (file,)))
    return units


def _paired_units(
    root: CacheRoot,
    found: list[tuple[tuple[str, ...], FileState]],
    kind: str,
    data_suffix: str,
) -> list[CacheUnit]:
    """<stem><marker> + <stem><data suffix> per folder, as units (marker first); either may be
    missing (a writer between its two files, a reader that discarded a bad entry)."""
    area = root.area
    pairs: dict[tuple[tuple[str, ...], str], dict[str, FileState]] = {}
    units = []
    for folder, file in found:
        if is_temporary(file.name):
            units.append(_temporary(root, folder, file))
            continue
        for role, suffix in (("marker", area.marker), ("data", data_suffix)):
            if area.is_unit_file(file.name, suffix):
                pairs.setdefault((folder, file.name.removesuffix(suffix)), {})[role] = file
                break
    for (folder, _), files in sorted(pairs.items()):
        ordered = tuple(files[role] for role in ("marker", "data") if role in files)
        units.append(CacheUnit(root.name, kind, root.base, folder, ordered))
    return units


def _pair_units(root: CacheRoot, walked: set) -> list[CacheUnit]:
    """Units directly in the area's folder (libraries and their facts); temporaries at any
    depth."""
    found = [
        (folder, f)
        for folder, f in _walk(root, walked)
        if folder == root.below or is_temporary(f.name)
    ]
    return _paired_units(root, found, root.area.kind, root.area.data)


def _shard_units(root: CacheRoot, walked: set) -> list[CacheUnit]:
    """Only the area's parts are walked: --build-cache may name a folder that holds more."""
    units = []
    for part, suffix in root.area.parts:
        sub = replace(root, below=(*root.below, part))
        found = [
            (folder, f)
            for folder, f in _walk(sub, walked)
            if is_temporary(f.name) or _is_shard(folder, sub.below, f.name)
        ]
        units += _paired_units(sub, found, part.removesuffix("s"), suffix)
    return units


def _is_shard(folder: tuple[str, ...], below: tuple[str, ...], name: str) -> bool:
    """<kind>/<d[:2]>/<d>...: one folder down, named by the first two digits of the name."""
    return len(folder) == len(below) + 1 and name[:2] == folder[-1]


def _read_index(base: Path, folder: tuple[str, ...], name: str) -> bytes:
    """An index's bytes, without following a link and, where the kernel lets the owner, without
    moving its atime (gc is no use)."""
    fd = _open_folder(base, folder)
    if fd is None:
        return b""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            file = os.open(name, flags | getattr(os, "O_NOATIME", 0), dir_fd=fd)
        except PermissionError:  # O_NOATIME: not the file's owner
            file = os.open(name, flags, dir_fd=fd)
        with os.fdopen(file, "rb") as handle:
            if not stat.S_ISREG(os.fstat(file).st_mode):
                return b""
            return handle.read(1 << 24)
    except OSError:  # gone, or a link where an index belongs: it names nothing
        return b""
    finally:
        os.close(fd)


def _download_units(root: CacheRoot, walked: set) -> list[CacheUnit]:
    """Copies directly in remote/, indexes in remote/index/, temporaries at any depth; an
    unread copy or index is marked as such."""
    area = root.area
    index_folder = (*root.below, cache_layout.REMOTE_INDEX)
    units, copies, indexes = [], [], []
    for folder, file in _walk(root, walked):
        if is_temporary(file.name):
            units.append(_temporary(root, folder, file))
        elif folder == root.below and area.stem.fullmatch(file.name.removesuffix(area.marker)):
            copies.append(CacheUnit(root.name, area.kind, root.base, folder, (file,)))
        elif folder == index_folder and cache_layout.REMOTE_INDEX_STEM.fullmatch(
            file.name.removesuffix(cache_layout.REMOTE_INDEX_SUFFIX)
        ):
            indexes.append(CacheUnit(root.name, "index", root.base, folder, (file,)))
    present = {unit.files[0].name.removesuffix(area.marker): unit for unit in copies}
    named: set[str] = set()
    for unit in indexes:
        data = _read_index(root.base, unit.folder, unit.files[0].name)
        shas = {entry["sha256"] for entry in remote.index_entries(data)} & set(present)
        named |= shas
        # An index is used whenever its copies are (offline, a server reads both): it ages
        # no sooner than the newest of them.
        file = unit.files[0]
        newest = max([file.last_use_ns, *(present[sha].files[0].last_use_ns for sha in shas)])
        unit = replace(unit, files=(replace(file, last_use_ns=newest),))
        units.append(unit if shas else replace(unit, unread="names no copy left"))
    for unit in copies:
        if unit.files[0].name.removesuffix(area.marker) not in named:
            unit = replace(unit, unread="no index names it (its URL holds another object)")
        units.append(unit)
    return units


def _other_temporaries(skip: set) -> list[CacheUnit]:
    """Temporaries anywhere else in the cache dir (keys/, the miss log's folder...)."""
    root = CacheRoot(OTHER, settings.cache_dir(), ())
    found = _walk(root, set(), skip)
    return [_temporary(root, folder, f) for folder, f in found if is_temporary(f.name)]


_COLLECT = {  # how each of cache_layout.GC_RULES finds an area's units
    "entries": _entry_units,
    "memos": _memo_units,
    "pairs": _pair_units,
    "shards": _shard_units,
    "downloads": _download_units,
}
assert set(_COLLECT) == set(cache_layout.GC_RULES)


def find_units(caches: Iterable[str] = CACHES, build_root: Path | None = None) -> list[CacheUnit]:
    """Every unit of the chosen caches; with all of them, temporaries elsewhere in the cache
    dir."""
    chosen = set(caches)
    walked: set[tuple[int, int]] = set()
    units: list[CacheUnit] = []
    for root in cache_roots(chosen, build_root):
        units += _COLLECT[root.area.gc](root, walked)
    if chosen >= set(CACHES):
        units += _other_temporaries(walked)  # the caches' own folders were walked above
    return units


# -- deciding --------------------------------------------------------------------------------------
def _reason(
    unit: CacheUnit,
    older_than: float | None,
    current: dict[str, str] | None,
    grace: float,
) -> str | None:
    if unit.kind == "refused":
        return "set aside by a reader (never read again)"
    if unit.kind == "temporary":
        return "temporary left by a killed writer" if unit.age_s >= TEMPORARY_DEBRIS_S else None
    if unit.age_s < grace:
        return None
    if unit.unread and unit.age_s >= UNREAD_S:
        return unit.unread
    if older_than is not None and unit.age_s >= older_than:
        return "unused for longer than --older-than"
    if current is not None and unit.cache == "overlay":
        fingerprint = unit.folder[1] if len(unit.folder) > 1 else ""
        if fingerprint not in current:
            return "other toolchain or kernel sources (--stale)"
    return None


def _evictable(unit: CacheUnit, grace: float) -> bool:
    # A young temporary is its writer's, not ours; a unit used within the grace period is in use.
    return unit.kind != "temporary" and unit.age_s >= grace


def plan(
    max_size: int | None = None,
    older_than: float | None = None,
    stale: bool = False,
    grace: float = GRACE_S,
    now: float | None = None,
    caches: Iterable[str] = CACHES,
    build_root: Path | None = None,
) -> tuple[list[CacheUnit], list[CacheUnit]]:
    """(remove, keep), least recently used first. Refused overlay entries, temporaries of
    killed writers and downloads nothing reads any more always go; then units unused for
    `older_than` seconds, overlay entries of fingerprints this installation does not use
    (`stale`), and, after those, the least recently used until at most `max_size` bytes are
    left in the chosen caches. Nothing used less than `grace` seconds ago is removed."""
    now = time.time() if now is None else now
    current = current_fingerprints() if stale else None  # only then: it reads the overlay key
    units = [replace(u, age_s=now - u.last_use) for u in find_units(caches, build_root)]
    remove, keep = [], []
    for unit in sorted(units, key=lambda u: (u.last_use, str(u.path))):
        reason = _reason(unit, older_than, current, grace)
        (remove if reason else keep).append(replace(unit, reason=reason))
    if max_size is not None:
        total = sum(u.size for u in keep)
        for unit in list(keep):  # least recently used first
            if total <= max_size:
                break
            if _evictable(unit, grace):
                keep.remove(unit)
                remove.append(replace(unit, reason="least recently used, over --max-size"))
                total -= unit.size
    return remove, keep


# -- removing --------------------------------------------------------------------------------------
def _unlink(fd: int, name: str) -> None:
    """A seam for tests that watch the order of removal."""
    os.unlink(name, dir_fd=fd)


def _as_planned(fd: int, file: FileState) -> bool | None:
    """True: the file is the one planned and unused since; False: replaced or used meanwhile;
    None: gone."""
    try:
        info = os.stat(file.name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    now = _file_state(file.name, info)
    return now.identity == file.identity and now.last_use_ns <= file.last_use_ns


def _remove_unit(unit: CacheUnit) -> bool:
    """Unlink the unit's files, commit marker first; False if nothing was removed here."""
    fd = _open_folder(unit.base, unit.folder)
    if fd is None:  # the folder went (or became a link): nothing of ours to remove
        return False
    removed = False
    try:
        if any(_as_planned(fd, f) is False for f in unit.files):
            return False  # republished or used since it was planned: in use, keep it whole
        for file in unit.files:
            # Looked at again right before its unlink: after the marker went, a writer may have
            # published fresh data under the data's name; that is theirs.
            if not _as_planned(fd, file):
                continue
            try:
                _unlink(fd, file.name)
            except FileNotFoundError:  # another gc, or a reader discarding it, was faster
                continue
            removed = True
    finally:
        os.close(fd)
    return removed


def remove_files(units: Iterable[CacheUnit]) -> list[CacheUnit]:
    """Remove each unit's files; returns the units this call removed (another gc, or a reader
    discarding a bad entry, may have been faster; a unit used since it was planned is kept)."""
    return [unit for unit in units if _remove_unit(unit)]


def summary(
    removed: list[CacheUnit], keep: list[CacheUnit], roots: list[CacheRoot]
) -> dict[str, dict]:
    """Per cache: its root, units and bytes removed and kept."""
    rows = {root.name: {"root": str(root.path)} for root in roots}
    if any(u.cache == OTHER for u in removed + keep):
        rows[OTHER] = {"root": str(settings.cache_dir())}
    for row in rows.values():
        row.update(removed=0, bytes_removed=0, kept=0, bytes_kept=0)
    for units, label in ((removed, "removed"), (keep, "kept")):
        for unit in units:
            rows[unit.cache][label] += 1
            rows[unit.cache][f"bytes_{label}"] += unit.size
    return rows
