"""The miss log: one JSON line per kernel a server had to compile, ready for the next build.

`aot-build --from-misses FILE` builds exactly these keys; `CUTE_AOT_MISS_LOG` chooses the file
(default: misses.jsonl in the cache dir). Each process records a key once (not once per shape
or per resolution). A log past MAX_LOG_BYTES is rotated to `<log>.1` (one generation kept; the
reader reads both). The log is opened without following links and never blocks on a FIFO; a
record that a full disk cut short is closed with a newline before the next one, so that only
the torn record is lost.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from pathlib import Path

from cute_aot.artifacts import settings, toolchain
from cute_aot.artifacts.miss_log import MAX_LOG_BYTES, read_misses, rotated_path
from cute_aot.runtime.notices import warn_once

__all__ = ["MISS_LOG_ENV", "miss_log_path", "read_misses", "record_miss"]

MISS_LOG_ENV = settings.MISS_LOG.name
_recorded: set[tuple[str, str, str, str]] = set()  # (log, family, key id, arch) said already
_lock = threading.Lock()


def miss_log_path() -> Path:
    return settings.miss_log()


def record_miss(key, arch: str, problem: dict) -> None:
    """Append one record for `key` on `arch`, once per process and log. Never raises."""
    path = miss_log_path()
    subject = (str(path), key.FAMILY, key.id, arch)
    with _lock:
        if subject in _recorded:
            return
        _recorded.add(subject)
    line = json.dumps(
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "family": key.FAMILY,
            "key_id": key.id,
            "key": key.fields(),
            "arch": arch,
            "problem": problem,
            "toolchain": toolchain.fingerprint(),
        },
        sort_keys=True,
    )
    try:
        _append(path, (line + "\n").encode())
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


def forget_recorded() -> None:
    """Tests: record every key again."""
    with _lock:
        _recorded.clear()
