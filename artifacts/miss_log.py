"""Reading miss logs: one JSON object per line, each a kernel a server had to compile.

Servers write them (runtime/misses.py); the build (`aot-build --from-misses`) and the operator
(`aot-cache misses`) read them. The reader lives here, below both, so that neither imports the
other: one reader for the format. A source is a log file (streamed line by line, a log may be
large; its rotated generation `<log>.1` first; never blocking on a FIFO), a folder, or a URL
prefix of any fsspec protocol, where each server process writes a file of its own: every
`*.jsonl` under it is read, in name order.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from cute_aot.artifacts import urls
from cute_aot.artifacts.errors import CuteAotError

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


def _objects(lines) -> Iterator[dict]:
    for line in lines:
        if len(line) > MAX_LINE_BYTES:
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            yield record


def _log_objects(path: Path) -> Iterator[tuple[str, dict]]:
    for part in (rotated_path(path), path):
        if part is path or part.exists():
            yield from ((str(part), record) for record in _objects(_lines(part)))


def _remote_objects(url: str) -> Iterator[tuple[str, dict]]:
    fs, root = urls.filesystem(url)
    names = [root] if fs.isfile(root) else sorted(n for n in fs.find(root) if n.endswith(".jsonl"))
    for name in names:
        # One object is one process's lines (one per key or call): small, read whole.
        lines = fs.cat_file(name).splitlines(keepends=True)
        yield from ((f"{url.split('://', 1)[0]}://{name}", record) for record in _objects(lines))


def read_objects(source: str | os.PathLike, what: str = "miss log") -> list[tuple[str, dict]]:
    """(file, object) of every JSON object line of a log file, of every `*.jsonl` under a folder
    or a URL prefix (in name order), in file order: the one reader of the JSON-lines files that
    processes append to or write one per process (miss logs, records). A line that is no JSON
    object (a torn last line of a killed writer) is skipped."""
    local = urls.local_path(source)
    if local is not None and not local.is_dir():
        return list(_log_objects(local))
    if local is not None:
        logs = sorted(path for path in local.rglob("*.jsonl") if path.is_file())
        return [found for path in logs for found in _log_objects(path)]
    try:
        return list(_remote_objects(source))
    except Exception as exc:  # a store's errors (botocore's, aiohttp's) are not all OSErrors
        raise CuteAotError(f"{source}: cannot read the {what} ({exc})") from exc


def read_misses(source: str | os.PathLike) -> list[dict]:
    """Every well-formed miss record of a log file, a folder or a URL prefix, in file order."""
    return [record for _, record in read_objects(source) if REQUIRED_FIELDS <= set(record)]
