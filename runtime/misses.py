"""The miss log: one JSON line per kernel a server had to compile, ready for the next build.

`aot-build --from-misses LOG` builds exactly these keys; `CUTE_AOT_MISS_LOG` chooses where
(default: misses.jsonl in the cache dir). Each process records a key once (not once per shape
or per resolution).

A file is appended to with the one JSON-lines appender (artifacts/core/json_lines.py): past
MAX_LOG_BYTES it is rotated to `<log>.1` (one generation kept; the reader reads both); it is
opened without following links and never blocks on a FIFO; a record that a full disk cut short
is closed with a newline before the next one, so that only the torn record is lost.

A folder (a path ending in '/', or an existing folder) or a URL prefix (any fsspec protocol:
s3://bucket/misses/) gets one file per process (runtime/process_files.py): the op path only
adds a line to memory, and the file reaches the store in the background and at exit or SIGTERM;
a store that fails is a late record, never a slow or failed call.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.core import settings, urls
from cute_aot.artifacts.core.json_lines import append_line
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.artifacts.miss_log import read_misses
from cute_aot.runtime.process_files import host, is_prefix, process_file

__all__ = ["miss_log_path", "read_misses", "record_miss"]

_recorded: set[tuple[str, str, str, str]] = set()  # (log, family, key id, arch) said already
_lock = threading.Lock()


def miss_log_path() -> Path | str:
    """Where this process records: a log file, a folder (Paths) or a URL prefix (as written)."""
    location = settings.miss_log()
    return location if urls.is_url(location) else Path(location)


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
    if is_prefix(location):
        try:
            process_file(location, "miss log").add(record)
        except RuntimeError as exc:  # no thread to be had (e.g. a miss while the process exits)
            warn_once(("miss-log", location), f"cannot write the miss log {location} ({exc})")
        return
    path = Path(location)
    try:
        append_line(path, record)
    except OSError as exc:
        warn_once(
            ("miss-log", str(path)), f"cannot write the miss log {path} ({exc.strerror or exc})"
        )


def forget_recorded() -> None:
    """Tests: record every key again."""
    with _lock:
        _recorded.clear()


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a parent thread may have held it


os.register_at_fork(after_in_child=_after_fork)
