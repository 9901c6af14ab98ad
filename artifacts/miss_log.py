"""Reading the miss log: one JSON object per line, each a kernel a server had to compile.

Servers write it (runtime/misses.py); the build (`aot-build --from-misses`) and the operator
(`aot-cache misses`) read it. The reader lives here, below both, so that neither imports the
other: one reader for the format. It streams line by line (a log may be large), reads the
rotated generation `<log>.1` first, and never blocks on a FIFO.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

# What a line must hold to be a miss; anything else (a torn line of a killed writer, a foreign
# line in a shared log) is skipped.
REQUIRED_FIELDS = frozenset({"family", "key", "arch"})
MAX_LOG_BYTES = 16 << 20  # writers rotate past this (about 16,000 records)
MAX_LINE_BYTES = 1 << 20  # a longer line is not a record


def rotated_path(path: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(path)}.1")


def _lines(path: Path) -> Iterator[bytes]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        while line := handle.readline(MAX_LINE_BYTES + 1):
            if len(line) <= MAX_LINE_BYTES:
                yield line


def read_misses(path: str | os.PathLike) -> list[dict]:
    """Every well-formed miss record of a log (its rotated generation first), in file order."""
    path = Path(path)
    records = []
    for part in (rotated_path(path), path):
        if part is not path and not part.exists():
            continue
        for line in _lines(part):
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict) and REQUIRED_FIELDS <= set(record):
                records.append(record)
    return records
