"""One file per process under a folder or a URL prefix: how miss logs and records travel from
many hosts to one place.

A process's file is `<prefix>/<host>-<pid>-<UTC time of its first line><suffix>` (host:
CUTE_AOT_HOST, else the host name): no two processes ever write one file (NFS appends
interleave, object stores cannot append). `add()` only puts a line in memory; a daemon thread
writes the process's whole file, replacing its last version, at most every FLUSH_INTERVAL_S,
and once more when the process exits or is terminated (artifacts/core/at_exit.py), waiting at most
EXIT_FLUSH_S. A store that fails is one warning and a retry at the next interval: a line is
late, never a slow or failed call.
"""

from __future__ import annotations

import os
import re
import threading
import time

from cute_aot.artifacts.core import settings, urls
from cute_aot.artifacts.core.at_exit import on_exit
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.artifacts.core.json_lines import MAX_LOG_BYTES
from cute_aot.artifacts.core.notices import warn_once

__all__ = ["ProcessFile", "discard", "host", "is_prefix", "process_file"]

FLUSH_INTERVAL_S = 10.0  # a prefix gets each process's file at most this often
EXIT_FLUSH_S = 5.0  # the last write delays a process's exit at most this long (a dead store)


def is_prefix(location: str) -> bool:
    """Whether `location` gets one file per process: a URL, or a folder (an existing one, or a
    path written with a trailing separator); else it is one file that processes append to."""
    return urls.is_url(location) or location.endswith(("/", os.sep)) or os.path.isdir(location)


def host() -> str:
    """This process's host (CUTE_AOT_HOST, else the host name), safe in a file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", settings.host_name()).lstrip(".")[:64] or "unknown"


class ProcessFile:
    """This process's own file under a prefix, rewritten whole by a daemon thread."""

    def __init__(self, prefix: str, what: str, suffix: str = ".jsonl"):
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.target = f"{prefix.rstrip('/')}/{host()}-{os.getpid()}-{started}{suffix}"
        self.what = what
        self.subject = (what, prefix)
        self.lines: list[bytes] = []
        self.size = 0
        self.stored = 0  # how many of `lines` the target holds
        self.failures = 0
        self.changed = threading.Condition()
        self.wake = threading.Event()
        self.ended = False
        threading.Thread(target=self._run, name=f"cute-aot-{what}", daemon=True).start()

    def add(self, record: bytes) -> None:
        with self.changed:
            if self.size + len(record) > MAX_LOG_BYTES:  # memory stays bounded, like a log file
                warn_once((self.what, "full", self.target), f"{self.target}: full, lines dropped")
                return
            self.lines.append(record)
            self.size += len(record)

    def _run(self) -> None:
        while not self.ended:
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
                f"cannot write the {self.what} {self.target} ({exc}); "
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
        """At exit: one last write, waited for at most EXIT_FLUSH_S (none once discarded)."""
        if self.ended:
            return
        with self.changed:
            failures = self.failures
            self.wake.set()
            done = self.changed.wait_for(
                lambda: self.stored == len(self.lines) or self.failures > failures, EXIT_FLUSH_S
            )
        if not done:
            why = f"not written within {EXIT_FLUSH_S:g} s"
            warn_once(
                self.subject, f"gave up writing the {self.what} {self.target} at exit ({why})"
            )


def _replace(target: str, data: bytes) -> None:
    local = urls.local_path(target)
    if local is None:
        fs, path = urls.filesystem(target)
        # One PUT: readers see the previous version or this one.
        urls.store_call(target, fs, "pipe_file", path, data)
        return
    local.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(local, data)  # a temporary name the reader skips, then a rename


_lock = threading.Lock()
_files: dict[tuple[str, str], ProcessFile] = {}  # (prefix, what) -> this process's file there


def process_file(prefix: str, what: str, suffix: str = ".jsonl") -> ProcessFile:
    """This process's file for `what` (a miss log, a record) under `prefix`. RuntimeError when
    no thread can be started (a line added while the process exits)."""
    with _lock:
        found = _files.get((prefix, what))
        if found is None:
            found = _files[prefix, what] = ProcessFile(prefix, what, suffix)
            on_exit(found.close)
        return found


def discard(prefix: str, what: str) -> None:
    """Stop this process's file for `what` under `prefix` without writing it again: what it
    holds is dropped (tests that point a writer at a store that is gone; a server never needs
    it)."""
    with _lock:
        found = _files.pop((prefix, what), None)
    if found is not None:
        found.ended = True
        found.wake.set()


def _after_fork() -> None:
    # A child is another process: its own files (its pid), and no lock a parent thread held.
    global _lock
    _lock = threading.Lock()
    _files.clear()


os.register_at_fork(after_in_child=_after_fork)
