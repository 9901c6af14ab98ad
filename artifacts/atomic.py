"""Publishing files so that no reader ever sees a partial one, and scratch that outlives no writer.

Every temporary name made here carries its writer's pid and machine (a hash of host name and pid
namespace), `.pid<N>@<machine>.`: a writer killed with SIGKILL cannot clean up after itself, so
the next build removes what dead writers of this machine left (`remove_dead_leftovers`). A live
writer's files are never touched, nor those of another machine's (an NFS folder).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# `<what>.pid<N>@<machine>.<random>[.tmp]`; <what> is a hidden name or a cute-aot scratch prefix.
_OWNED_NAME = re.compile(
    r"^(?:\..+|cute-aot-[a-z-]+)\.pid(\d+)@([0-9a-f]{12})\.[A-Za-z0-9_]+(?:\.tmp)?$"
)


@functools.cache
def _machine() -> str:
    """This host and pid namespace (a pid names a process only within both), hashed: a name
    stays short whatever the host name."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux
        namespace = 0
    return hashlib.sha256(f"{socket.gethostname()}/{namespace}".encode()).hexdigest()[:12]


def owner_tag() -> str:
    """`pid<N>@<machine>`, the part of a temporary name that says who may still need it."""
    return f"pid{os.getpid()}@{_machine()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:  # a zombie is dead, only not yet reaped (an orphan's may never be, in a container)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (not Linux), or just gone: kept until the next build
        return True
    return stat[stat.rindex(")") + 2] not in "ZX"


def remove_dead_leftovers(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and scratch folders in `folder` whose writer, a process of this
    machine, has died; returns them. A pid reused since only delays the removal."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:  # absent or unreadable: nothing of ours to remove
        return removed
    for entry in entries:
        owned = _OWNED_NAME.match(entry.name)
        if not owned or owned[2] != _machine() or _alive(int(owned[1])):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed


@contextlib.contextmanager
def scratch_folder(prefix: str, parent: str | os.PathLike | None = None) -> Iterator[Path]:
    """A private folder `<prefix>.pid<N>@<machine>.<random>` in `parent` (default: TMPDIR),
    removed on exit; after a SIGKILL, by the next `remove_dead_leftovers(parent)`."""
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}.{owner_tag()}.", dir=parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _complete_temporary(path: Path, data: bytes, mode: int) -> Iterator[str]:
    """A fully written, fsynced file with a unique name beside `path`; removed on exit unless
    the caller has renamed it away."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.{owner_tag()}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write `data` to `path` via a unique temporary name in the same folder, fsync, rename.

    A failure (an OSError naming `path`) leaves no temporary file behind and the previous
    `path` (if any) untouched.
    """
    path = Path(path)
    try:
        with _complete_temporary(path, data, mode) as tmp:
            os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is None and exc.errno:  # a failed write() names no file: name it
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    return path


def publish_once(path: str | os.PathLike, data: bytes, mode: int = 0o444) -> bool:
    """Publish `data` at `path` unless someone already did; True if this call published it.

    Written to a unique temporary name, fsynced, then hard-linked into place: link() fails if the
    name exists, so the first publisher wins and readers only ever see complete files. No file
    lock is involved (flock is unreliable on NFS, where shared caches live).
    """
    path = Path(path)
    with _complete_temporary(path, data, mode) as tmp:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True


class Claimed(Exception):
    """Another live process holds the claim; `holder` says who (pid, host, since)."""

    def __init__(self, path: Path, holder: dict):
        super().__init__(
            f"{path} is held by pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')} since {holder.get('since', '?')}"
        )
        self.holder = holder


@contextlib.contextmanager
def claimed(path: str | os.PathLike) -> Iterator[None]:
    """Hold `path` as this process's claim while inside: a file made with O_EXCL (what NFS
    keeps atomic, unlike flock) naming its owner, removed at the end. A claim whose owner, a
    process of this machine, has died is taken over; a live owner's raises Claimed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = {
        "owner": owner_tag(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            holder = _claim_holder(path)
            owner = re.fullmatch(r"pid(\d+)@([0-9a-f]{12})", str(holder.get("owner", "")))
            if owner and owner[2] == _machine() and not _alive(int(owner[1])):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # left by a killed owner
                continue
            raise Claimed(path, holder) from None
        with os.fdopen(fd, "w") as claim:
            claim.write(json.dumps(mine))
        break
    else:
        raise Claimed(path, _claim_holder(path))
    try:
        yield
    finally:
        if _claim_holder(path).get("owner") == mine["owner"]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _claim_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):  # gone, or being written this instant
        return {}
    return holder if isinstance(holder, dict) else {}
