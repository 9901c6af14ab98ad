"""The miss log: one JSON line per kernel a server had to compile, ready for the next build.

`aot-build --from-misses FILE` builds exactly these keys; `CUTE_AOT_MISS_LOG` chooses the file
(default: misses.jsonl in the cache dir).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cute_aot.artifacts import settings, toolchain
from cute_aot.artifacts.miss_log import read_misses  # noqa: F401  (one reader of the log)
from cute_aot.runtime.notices import warn_once

MISS_LOG_ENV = settings.MISS_LOG.name


def miss_log_path() -> Path:
    return settings.miss_log()


def record_miss(key, arch: str, problem: dict) -> None:
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
    path = miss_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # One write() of one line with O_APPEND: lines from concurrent processes never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        warn_once(("miss-log", str(path)), f"cannot write the miss log {path} ({exc.strerror})")
