"""The miss log: one JSON line per kernel a server had to compile, ready for the next build.

`aot-build --from-misses LOG` builds exactly these keys; `CUTE_AOT_MISS_LOG` chooses where
(default: misses.jsonl in the cache dir). Each process records a key once (not once per shape
or per resolution).

A file is appended to: past MAX_LOG_BYTES it is rotated to `<log>.1` (one generation kept; the
reader reads both); it is opened without following links and never blocks on a FIFO; a record
that a full disk cut short is closed with a newline before the next one, so that only the torn
record is lost.

A folder (a path ending in '/', or an existing folder) or a URL prefix (any fsspec protocol:
s3://bucket/misses/) gets one file per process, `<host>-<pid>-<UTC time of its first
miss>.jsonl` (host: CUTE_AOT_HOST, else the host name): no two machines ever write one file
(NFS appends interleave, object stores cannot append). The op path only adds a line to memory;
a daemon thread writes the process's whole file, replacing its last version, at most every
FLUSH_INTERVAL_S, and once more at exit (waiting at most EXIT_FLUSH_S). A store that fails is one warning and a
retry at the next interval: a miss is a late record, never a slow or failed call.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import re
import stat
import threading
import time
from pathlib import Path

from cute_aot.artifacts import settings, toolchain, urls
from cute_aot.artifacts.atomic import atomic_write
from cute_aot.artifacts.miss_log import MAX_LOG_BYTES, read_misses, rotated_path
from cute_aot.runtime.notices import warn_once

__all__ = ["MISS_LOG_ENV", "miss_log_path", "read_misses", "record_miss"]

MISS_LOG_ENV = settings.MISS_LOG.name
FLUSH_INTERVAL_S = 10.0  # a prefix gets each process's file at most this often
EXIT_FLUSH_S = 5.0  # the last write delays a process's exit at most this long (a dead store)
_recorded: set[tuple[str, str, str, str]] = set()  # (log, family, key id, arch) said already
_lock = threading.Lock()


def _is_prefix(location: str) -> bool:
    return urls.is_url(location) or location.endswith(("/", os.sep)) or os.path.isdir(location)


def miss_log_path() -> Path | str:
    """Where this process records: a log file, a folder (Paths) or a URL prefix (as written)."""
    location = settings.miss_log()
    return location if urls.is_url(location) else Path(location)


def host() -> str:
    """This process's host (CUTE_AOT_HOST, else the host name), safe in a file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", settings.host_name()).lstrip(".")[:64] or "unknown"


def record_miss(key, arch: str, problem: dict) -> None:
    """Record `key` on `arch`, once per process and log. Never raises."""
    location = settings.miss_log()
    subject = (location, key.FAMILY, key.id, arch)
    with _lock:
        if subject in _recorded:
            return
        _recorded.add(subject)
    line = json.dumps(
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": host(),
            "family": key.FAMILY,
            "key_id": key.id,
            "key": key.fields(),
            "arch": arch,
            "problem": problem,
            "toolchain": toolchain.fingerprint(),
        },
        sort_keys=True,
    )
    record = (line + "\n").encode()
    if _is_prefix(location):
        try:
            _writer(location).add(record)
        except RuntimeError as exc:  # no thread to be had (e.g. a miss while the process exits)
            warn_once(("miss-log", location), f"cannot write the miss log {location} ({exc})")
        return
    path = Path(location)
    try:
        _append(path, record)
    except OSError as exc:
        warn_once(
            ("miss-log", str(path)), f"cannot write the miss log {path} ({exc.strerror or exc})"
        )


def _append(path: Path, record: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size > MAX_LOG_BYTES:
            os.replace(path, rotated_path(path))  # this descriptor now writes to the rotated one
            os.close(fd)
            fd = os.open(path, flags, 0o644)
            info = os.fstat(fd)
        if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
            record = b"\n" + record  # the last record was cut short (a full disk): close it
        # One write() of one line with O_APPEND: lines from concurrent processes never interleave.
        written = os.write(fd, record)
        if written != len(record):
            raise OSError(errno.ENOSPC, f"record cut short ({written} of {len(record)} bytes)")
    finally:
        os.close(fd)


class _ProcessFile:
    """This process's own file under a prefix, rewritten whole by a daemon thread."""

    def __init__(self, prefix: str):
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.target = f"{prefix.rstrip('/')}/{host()}-{os.getpid()}-{started}.jsonl"
        self.subject = ("miss-log", prefix)
        self.lines: list[bytes] = []
        self.size = 0
        self.stored = 0  # how many of `lines` the target holds
        self.failures = 0
        self.changed = threading.Condition()
        self.wake = threading.Event()
        threading.Thread(target=self._run, name="cute-aot-miss-log", daemon=True).start()

    def add(self, record: bytes) -> None:
        with self.changed:
            if self.size + len(record) > MAX_LOG_BYTES:  # memory stays bounded, like a log file
                warn_once(("miss-log-full", self.target), f"{self.target}: full, records dropped")
                return
            self.lines.append(record)
            self.size += len(record)

    def _run(self) -> None:
        while True:
            self._write()
            self.wake.wait(FLUSH_INTERVAL_S)
            self.wake.clear()

    def _write(self) -> None:
        with self.changed:
            count = len(self.lines)
            data = b"".join(self.lines)
        if count == self.stored:
            return
        try:
            _replace(self.target, data)
        except Exception as exc:  # a store's errors (botocore's...) are not all OSErrors
            warn_once(
                self.subject,
                f"cannot write the miss log {self.target} ({exc}); "
                f"retrying every {FLUSH_INTERVAL_S:g} s",
            )
            with self.changed:
                self.failures += 1
                self.changed.notify_all()
            return
        with self.changed:
            self.stored = count
            self.changed.notify_all()

    def close(self) -> None:
        """At exit: one last write, waited for at most EXIT_FLUSH_S."""
        with self.changed:
            failures = self.failures
            self.wake.set()
            done = self.changed.wait_for(
                lambda: self.stored == len(self.lines) or self.failures > failures, EXIT_FLUSH_S
            )
        if not done:
            why = f"not written within {EXIT_FLUSH_S:g} s"
            warn_once(self.subject, f"gave up writing the miss log {self.target} at exit ({why})")


def _replace(target: str, data: bytes) -> None:
    local = urls.local_path(target)
    if local is None:
        fs, path = urls.filesystem(target)
        fs.pipe_file(path, data)  # one PUT: readers see the previous version or this one
        return
    local.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(local, data)  # a temporary name the reader skips, then a rename


_writers: dict[str, _ProcessFile] = {}  # prefix -> this process's file there
_exit_hooked = False  # a forked child inherits the hook


def _writer(prefix: str) -> _ProcessFile:
    global _exit_hooked
    with _lock:
        if not _exit_hooked:
            _at_exit(_close_writers)
            _exit_hooked = True
        if prefix not in _writers:
            _writers[prefix] = _ProcessFile(prefix)
        return _writers[prefix]


def _close_writers() -> None:
    for writer in list(_writers.values()):
        writer.close()


def _at_exit(hook) -> None:
    # The last write must run before concurrent.futures refuses new work at shutdown: asyncio
    # resolves host names in its executor, so s3fs could not reach a store by name from atexit.
    # threading's exit hooks run last registered first: import the executor's hook before ours.
    import concurrent.futures.thread  # noqa: F401

    try:
        threading._register_atexit(hook)
    except (AttributeError, RuntimeError):  # not CPython 3.9+, or the process is exiting
        atexit.register(hook)


def _after_fork() -> None:
    # A child is another process: its own files (its pid), and no lock a parent thread held.
    global _lock
    _lock = threading.Lock()
    _writers.clear()


os.register_at_fork(after_in_child=_after_fork)


def forget_recorded() -> None:
    """Tests: record every key again."""
    with _lock:
        _recorded.clear()
