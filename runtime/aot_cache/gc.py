"""The overlay cache's housekeeping: what it holds (`aot-cache ls`), and pruning it while servers
use it (`aot-cache gc`).

Safe with live readers and publishers: files are unlinked one at a time (a process that has one
open or mapped keeps reading it; one that opens it a moment later takes the miss path and
compiles again), nothing younger than a grace period is touched (a publisher's fresh link
survives), and folders are never removed (a publisher may be about to create a file in one).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from cute_aot.artifacts.bundle import BUNDLE_SUFFIX
from cute_aot.kernels import families
from cute_aot.runtime import overlay

GRACE_S = 60.0
TEMPORARY_DEBRIS_S = 3600.0  # a publisher's temporary this old was left by a killed process


@dataclass(frozen=True)
class CacheFile:
    path: Path
    size: int
    age_s: float
    reason: str | None = None  # why it is removed; None: kept


def current_fingerprints() -> dict[str, str]:
    """Overlay fingerprint -> family, for this installation's toolchain and kernel sources."""
    return {overlay.fingerprint(name): name for name in families()}


def overlay_files() -> list[Path]:
    root = overlay.overlay_root()
    return sorted(root.glob(f"*/*/*{BUNDLE_SUFFIX}")) if root.is_dir() else []


def overlay_summary() -> list[dict]:
    """One row per <fingerprint>/<arch> folder: family (if this installation uses it), keys, bytes."""
    current = current_fingerprints()
    groups: dict[Path, dict] = {}
    for path in overlay_files():
        try:
            stat = path.stat()
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
        group["file_size"] += stat.st_size
        group["newest_mtime"] = max(group["newest_mtime"], stat.st_mtime)
    return list(groups.values())


def _is_temporary(path: Path) -> bool:
    """publish_once's temporary names: .<name>.<random>.tmp"""
    return path.name.startswith(".") and path.name.endswith(".tmp")


def _files(root: Path, now: float) -> list[CacheFile]:
    found = []
    for path in root.rglob("*") if root.is_dir() else []:
        try:
            stat = path.lstat()
        except FileNotFoundError:
            continue
        if path.is_file() and not path.is_symlink():
            found.append(CacheFile(path, stat.st_size, now - stat.st_mtime))
    return sorted(found, key=lambda f: (-f.age_s, str(f.path)))  # oldest first


def plan(
    max_size: int | None = None,
    older_than: float | None = None,
    stale: bool = False,
    grace: float = GRACE_S,
    now: float | None = None,
) -> tuple[list[CacheFile], list[CacheFile]]:
    """(remove, keep). Temporaries of killed publishers always go; then entries older than
    `older_than`, of fingerprints this installation does not use (`stale`), and the oldest
    until at most `max_size` bytes are left. Nothing younger than `grace` seconds is removed."""
    root = overlay.overlay_root()
    current = current_fingerprints()
    remove, keep = [], []
    for item in _files(root, time.time() if now is None else now):
        reason = None
        if item.age_s < grace:
            pass
        elif _is_temporary(item.path):
            if item.age_s >= TEMPORARY_DEBRIS_S:
                reason = "temporary left by a killed publisher"
        elif older_than is not None and item.age_s >= older_than:
            reason = "older than --older-than"
        elif stale and item.path.relative_to(root).parts[0] not in current:
            reason = "other toolchain or kernel sources (--stale)"
        (remove if reason else keep).append(CacheFile(item.path, item.size, item.age_s, reason))
    if max_size is not None:
        total = sum(f.size for f in keep)
        for item in list(keep):  # oldest first
            if total <= max_size:
                break
            if item.age_s >= grace and not _is_temporary(item.path):
                keep.remove(item)
                remove.append(CacheFile(item.path, item.size, item.age_s, "over --max-size"))
                total -= item.size
    return remove, keep


def remove_files(files: list[CacheFile]) -> list[CacheFile]:
    """Unlink each file; returns those this call removed (another gc may have been faster)."""
    removed = []
    for item in files:
        try:
            os.unlink(item.path)
        except FileNotFoundError:
            continue
        removed.append(item)
    return removed
