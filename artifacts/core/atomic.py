"""Publishing files so that no reader ever sees a partial one, scratch that outlives no writer,
and the one locking rule.

Every temporary file and scratch folder cute-aot makes is named by `temporary_name`, which
carries its writer's pid and machine (a hash of host name and pid namespace), `.pid<N>@<machine>.`:
a writer killed with SIGKILL cannot clean up after itself, so the next build removes what dead
writers of this machine left (`remove_dead_leftovers`). A live writer's files are never touched,
nor those of another machine's (an NFS folder).

Locks (`claimed`) are files published with link(), naming their holder; never flock or lockf,
which NFS keeps unreliably or not at all, while link() is atomic on every NFS version.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# temporary_name's `<what>.pid<N>@<machine>.<random>[.tmp]` (the random part of older versions'
# mkstemp names included); <what> is a hidden name or a cute-aot scratch prefix.
_OWNED_NAME = re.compile(
    r"^(?:\..+|cute-aot-[a-z-]+)\.pid(\d+)@([0-9a-f]{12})\.[A-Za-z0-9_]+(?:\.tmp)?$"
)
# How long a process that lost the takeover of a stale lock looks for the winner's own lock, to
# name it (the winner links its lock an instant after removing the stale one).
TAKEOVER_SETTLE = 1.0


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


def temporary_name(what: str, folder: bool = False) -> str:
    """The name of every temporary file and scratch folder cute-aot makes, the one scheme that
    `remove_dead_leftovers` (and `aot-cache gc`, by age) recognise:
    `<what>.pid<N>@<machine>.<random>.tmp`, a folder's without `.tmp`.

    `what` is `.<final name>` for a file renamed into place later (hidden from readers that
    list the folder), or `cute-aot-<purpose>` for scratch in TMPDIR.
    """
    if not (what.startswith(".") or re.fullmatch(r"cute-aot-[a-z-]+", what)):
        raise ValueError(f"{what!r}: a temporary name starts with '.' or is cute-aot-<purpose>")
    return f"{what}.{owner_tag()}.{secrets.token_hex(4)}{'' if folder else '.tmp'}"


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
        if not owned:
            continue
        pid, machine = int(owned[1]), owned[2]
        if machine != _machine() or _alive(pid):
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
    """A private folder `temporary_name(prefix)` in `parent` (default: TMPDIR), removed on
    exit; after a SIGKILL, by the next `remove_dead_leftovers(parent)`."""
    folder = Path(parent if parent is not None else tempfile.gettempdir()) / temporary_name(
        prefix, folder=True
    )
    folder.mkdir(mode=0o700)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _complete_temporary(path: Path, data: bytes, mode: int) -> Iterator[str]:
    """A fully written, fsynced file with a unique name beside `path`; removed on exit unless
    the caller has renamed it away."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path.parent / temporary_name(f".{path.name}"))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
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


def atomic_write(
    path: str | os.PathLike,
    data: bytes,
    mode: int = 0o644,
    before_replace: Callable[[], None] | None = None,
) -> Path:
    """Write `data` to `path` via a unique temporary name in the same folder, fsync, rename.

    A failure (an OSError naming `path`) leaves no temporary file behind and the previous
    `path` (if any) untouched. `before_replace` runs once the new bytes are on disk, just before
    the rename: what describes the previous file goes only when it is sure to be replaced.
    """
    path = Path(path)
    try:
        with _complete_temporary(path, data, mode) as tmp:
            if before_replace is not None:
                before_replace()
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
    """Another live process holds the lock; `holder` says who (pid, host, since), or is empty
    where another process is taking over a dead holder's lock and has not yet linked its own."""

    def __init__(self, path: Path, holder: dict):
        if holder:
            who = (
                f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
                f"since {holder.get('since', '?')}"
            )
        else:
            who = "a process taking over its dead holder's lock (which one is not known yet)"
        super().__init__(f"{path} is held by {who}")
        self.path = path
        self.holder = holder


@contextlib.contextmanager
def claimed(
    path: str | os.PathLike, wait: float = 0.0, stale_after: float | None = None
) -> Iterator[None]:
    """Hold the lock `path` while inside: cute-aot's one locking rule (build claims, the report
    merge, the shared record file, one fetch per URL).

    The lock is a file published with link() (atomic on every NFS version, unlike flock),
    complete from its first instant, naming its holder (owner tag, pid, host, since); the
    holder unlinks it at the end. A stale lock is taken over: its holder, a process of this
    machine, has died (SIGKILL, power loss), or, given `stale_after`, the file is older than
    that many seconds (how a holder on another machine, or a hung one, is judged: the bound
    must exceed the longest hold). A live holder's lock is waited for up to `wait` seconds,
    then Claimed names it. A folder where no lock can be made (read-only, full) raises
    OSError naming `path`.
    """
    path, pid = Path(path), os.getpid()
    mine = json.dumps(
        {
            "owner": owner_tag(),
            "pid": pid,
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": secrets.token_hex(8),  # tells this hold from any other, inodes being reused
        }
    )
    deadline = time.monotonic() + wait
    pause = 0.002
    while not _link_lock(path, mine):
        holder, seen = _lock_holder(path)
        if seen is not None and _stale(holder, seen, stale_after):
            if _take_over(path, seen):
                continue  # the stale one removed: link again at once
            holder = _winner(path, seen)  # lost the takeover: the dead holder holds nothing
            seen = None if holder is None else seen
        if seen is None:
            continue  # released: link again at once
        if time.monotonic() >= deadline:
            raise Claimed(path, holder)
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, 0.25)
    try:
        yield
    finally:
        # Only this hold's own file: a lock judged stale may be another's by now, and a forked
        # child leaving the block releases nothing of its parent's.
        held = _lock_holder(path)[1]
        if held is not None and held[2] == mine and pid == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _link_lock(path: Path, content: str) -> bool:
    """Publish `content` at `path` unless a file is there; True if this call did."""
    tmp = path.parent / temporary_name(f".{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(exc.errno, f"cannot take the lock ({exc.strerror})", str(path)) from None
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        # NFS: a link whose reply was lost is sent again and fails, though it was made.
        return os.stat(tmp).st_nlink == 2
    except OSError as exc:
        raise OSError(exc.errno, f"cannot take the lock ({exc.strerror})", str(path)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _lock_holder(path: Path) -> tuple[dict, tuple | None]:
    """Who holds `path`, and which file it is: (inode, mtime, text), None once it is gone."""
    try:
        with open(path, "rb") as handle:
            found = os.fstat(handle.fileno())
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return {}, None
    except OSError:  # unreadable (another user's, 0600): judged by its age alone
        try:
            found, text = os.stat(path), ""
        except FileNotFoundError:
            return {}, None
    try:
        holder = json.loads(text)
    except ValueError:  # not a lock written here (an older version's, or another program's)
        holder = {}
    return holder if isinstance(holder, dict) else {}, (found.st_ino, found.st_mtime, text)


def _stale(holder: dict, seen: tuple, stale_after: float | None) -> bool:
    owner = re.fullmatch(r"pid(\d+)@([0-9a-f]{12})", str(holder.get("owner", "")))
    if owner and owner[2] == _machine() and not _alive(int(owner[1])):
        return True
    return stale_after is not None and time.time() - seen[1] > stale_after


def _winner(path: Path, seen: tuple) -> dict | None:
    """Who holds `path` after this process lost the takeover of its stale lock `seen`: the
    winner, once its own lock is there (looked for during TAKEOVER_SETTLE s); {} where it is not
    there yet (which process won is not known); None where the lock is free."""
    deadline = time.monotonic() + TAKEOVER_SETTLE
    while True:
        holder, now = _lock_holder(path)
        if now is None:
            return None
        if now != seen:
            return holder
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.01)


def _take_over(path: Path, seen: tuple) -> bool:
    """Remove the stale lock `seen` unless it is gone or replaced; True if it is gone.

    Two waiters that both judged it stale must not both remove: the second would remove the
    lock the first has just taken. So the removal is itself a lock, held for an instant, under
    which the file is looked at again."""
    guard = path.with_name(f"{path.name}.takeover")
    if not _link_lock(guard, json.dumps({"owner": owner_tag(), "pid": os.getpid()})):
        holder, other = _lock_holder(guard)
        if other is not None and _stale(holder, other, 10.0):  # a taker killed in its instant
            with contextlib.suppress(FileNotFoundError):
                guard.unlink()
        return False
    try:
        now = _lock_holder(path)[1]
        if now == seen:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            remove_dead_leftovers(path.parent)  # what else its dead holder left there
        return now is None or now == seen
    finally:
        with contextlib.suppress(FileNotFoundError):
            guard.unlink()
