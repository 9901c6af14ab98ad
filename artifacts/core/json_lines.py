"""JSON-lines files: the one reader and the one appender, with one policy for damaged lines.

Every JSON-lines file cute-aot keeps goes through here: miss logs (runtime/misses.py), records
of `cute.compile` calls (runtime/capture/record.py), aot-tune's results (aot/tools/aot_tune/cli.py),
and the one-file-per-process copies of the first two (runtime/process_files.py writes those whole).

The policy, for every such file:
- A line is kept when it parses as a JSON object. Anything else (a last line cut short by a
  killed writer or a full disk, a foreign line in a shared log, a list or a string) is skipped,
  never an error, and a warning names the file and how many lines it lost. Blank lines are no
  record and are skipped silently.
- The appender writes each line with one write() to a file opened O_APPEND, so lines of
  concurrent processes never interleave; a file whose last line was cut short gets a newline
  first, so the torn line stays alone and the new one is whole.
- A log past MAX_LOG_BYTES is rotated to `<file>.1` (one generation kept); the reader reads
  `<file>.1` before `<file>`.
- A line of a format with a schema (LineSchema: records, miss logs) that is an object of the
  wrong shape (a field missing, or of another JSON type) is skipped with one warning naming its
  file, its line number and the field; `read_lines` checks it, for every reader of that format.
The bytes of each line are the caller's: this module never re-encodes a record.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cute_aot.artifacts.core import urls
from cute_aot.artifacts.core.errors import CuteAotError, LineFormatError

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_LOG_BYTES",
    "Field",
    "LineSchema",
    "append_line",
    "exactly",
    "objects_after",
    "read_lines",
    "read_objects",
    "rotated_path",
]

MAX_LOG_BYTES = 16 << 20  # writers rotate past this (about 16,000 miss records)
MAX_LINE_BYTES = 1 << 20  # a longer line is not a record
SUFFIX = ".jsonl"  # what a folder or a URL prefix holds: every `*.jsonl` under it is read


def rotated_path(path: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(path)}.1")


# -- reading ---------------------------------------------------------------------------------------
def _open_regular(path: Path):
    """A binary handle of `path`; never blocks on a FIFO someone left there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return handle


def _chunks(handle) -> Iterator[bytes]:
    """Lines of at most MAX_LINE_BYTES + 1 bytes: a longer line comes in pieces, none of which
    parses, so memory stays bounded whatever a file holds."""
    while line := handle.readline(MAX_LINE_BYTES + 1):
        yield line


def _object(line: bytes) -> dict | None:
    """The line's object, or None for a line that is no object."""
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        found = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def _skipped(where: str, count: int) -> None:
    warnings.warn(
        f"cute-aot: {where}: skipped {count} line(s) that are not JSON objects (a line cut "
        "short by a killed writer or a full disk, or another program's)",
        RuntimeWarning,
        stacklevel=2,
    )


def _objects(lines: Iterable[bytes], where: str) -> Iterator[tuple[str, int, dict]]:
    """(file, line number, object) of each line that is a JSON object."""
    skipped = 0
    number = 0
    whole = True  # the previous piece ended its line
    for line in lines:
        continued, whole = not whole, line.endswith(b"\n")
        number += not continued
        if continued or not line.strip():
            continue  # the rest of a line too long (counted once), or a blank line
        found = _object(line)
        if found is None:
            skipped += 1
        else:
            yield where, number, found
    if skipped:
        _skipped(where, skipped)


def _file_objects(path: Path) -> Iterator[tuple[str, int, dict]]:
    for part in (rotated_path(path), path):
        if part is path or part.exists():
            with _open_regular(part) as handle:
                yield from _objects(_chunks(handle), str(part))


def _remote_objects(url: str) -> Iterator[tuple[str, int, dict]]:
    fs, root = urls.filesystem(url)
    if urls.store_call(url, fs, "isfile", root):
        names = [root]
    else:
        names = sorted(n for n in urls.store_call(url, fs, "find", root) if n.endswith(SUFFIX))
    protocol = url.split("://", 1)[0]
    for name in names:
        # One object is one process's lines (one per key or call): small, read whole.
        lines = urls.store_call(url, fs, "cat_file", name).splitlines(keepends=True)
        yield from _objects(lines, f"{protocol}://{name}")


def _numbered_objects(source: str | os.PathLike, what: str) -> list[tuple[str, int, dict]]:
    local = urls.local_path(source)
    if local is not None and not local.is_dir():
        return list(_file_objects(local))
    if local is not None:
        files = sorted(path for path in local.rglob(f"*{SUFFIX}") if path.is_file())
        return [found for path in files for found in _file_objects(path)]
    try:
        return list(_remote_objects(source))
    except Exception as exc:  # a store's errors (botocore's, aiohttp's) are not all OSErrors
        raise CuteAotError(f"{source}: cannot read the {what} ({exc})") from exc


def read_objects(source: str | os.PathLike, what: str = "miss log") -> list[tuple[str, dict]]:
    """(file, object) of every JSON object line of a file (its rotated generation first), of
    every `*.jsonl` under a folder or a URL prefix (in name order), in file order. Lines that
    are no object are skipped with a warning naming their file; a store that cannot be read
    raises CuteAotError naming `source` and `what` it was to hold."""
    return [(where, found) for where, _, found in _numbered_objects(source, what)]


# -- schemas ---------------------------------------------------------------------------------------
_JSON_KINDS = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


@dataclass(frozen=True)
class Field:
    """One field of a JSON line: the JSON types it takes (Python's: str, int, bool...; an int
    where float is taken), whether a line must hold it (always, or when `required` says so of
    the line), and a deeper `check` of its value, which raises TypeError or ValueError saying
    what is wrong."""

    types: tuple[type, ...]
    required: bool | Callable[[dict], bool] = True
    check: Callable[[Any], object] | None = None

    def problem(self, line: dict, name: str) -> str | None:
        """What is wrong with this field of `line`, or None."""
        if name not in line:
            needed = self.required(line) if callable(self.required) else self.required
            return "is missing" if needed else None
        value = line[name]
        taken = type(value) in self.types or (type(value) is int and float in self.types)
        if not taken:
            wanted = " or ".join(_JSON_KINDS[kind] for kind in self.types)
            return f"is {_kind(value)}, not {wanted}"
        if self.check is not None:
            try:
                self.check(value)
            except (TypeError, ValueError) as exc:
                return f"cannot be read: {exc}"
        return None


def exactly(expected: Any) -> Callable[[Any], None]:
    """A Field check: the one value this release reads (a format version, a family name)."""

    def check(value: Any) -> None:
        if value != expected:
            raise ValueError(f"{value!r} is not {expected!r}, the one this release reads")

    return check


@dataclass(frozen=True)
class LineSchema:
    """What a line of one JSON-lines format holds, field by field; fields it does not name are
    not read, and any value passes there. Declared once per format, beside its reader."""

    what: str  # the format's name in messages: "record", "miss log"
    fields: Mapping[str, Field]

    def problem(self, line: dict) -> tuple[str, str] | None:
        """(field, what is wrong with it) of the first wrong field of `line`, or None."""
        for name, field in self.fields.items():
            why = field.problem(line, name)
            if why is not None:
                return name, why
        return None


def read_lines(source: str | os.PathLike, schema: LineSchema) -> list[tuple[str, dict]]:
    """read_objects of `schema`'s format: (file, line) of every line of the right shape; a
    line of another is skipped with one warning naming its file, line number and field. A
    source whose every object line is refused raises LineFormatError: nothing of it is usable."""
    kept, refused = [], 0
    for where, number, found in _numbered_objects(source, schema.what):
        problem = schema.problem(found)
        if problem is None:
            kept.append((where, found))
        else:
            refused += 1
            _refused(f"{where}:{number}", schema.what, *problem)
    if refused and not kept:
        raise LineFormatError(
            source, f"none of its {refused} line(s) is a {schema.what} line (each said above)"
        )
    return kept


def _refused(where: str, what: str, field: str, why: str) -> None:
    warnings.warn(
        f"cute-aot: {where}: skipped a {what} line: field {field!r} {why}",
        RuntimeWarning,
        stacklevel=3,
    )


def objects_after(path: Path, offset: int) -> tuple[list[dict], int]:
    """The objects of the whole lines of a local file from byte `offset` on, and the offset
    after the last of them: a reader that follows a file it shares with other writers. A last
    line without its newline is left for the next call (the appender closes it first)."""
    found: list[dict] = []
    try:
        handle = _open_regular(path)
    except FileNotFoundError:
        return found, offset
    with handle:
        handle.seek(offset)
        whole = []
        for line in _chunks(handle):
            if not line.endswith(b"\n") and len(line) <= MAX_LINE_BYTES:
                break
            whole.append(line)
            offset += len(line)
    found = [record for _, _, record in _objects(whole, str(path))]
    return found, offset


# -- appending -------------------------------------------------------------------------------------
def append_line(path: Path, record: bytes, rotate: bool = True) -> None:
    """Append one line (`record`: one JSON object and its newline) to a local file: on disk
    when this returns. Past MAX_LOG_BYTES the file is rotated to `<file>.1` unless `rotate` is
    False (a file whose every line is needed); it is opened without following links and never
    blocks on a FIFO; a last line cut short is closed with a newline before this one."""
    if not record.endswith(b"\n") or b"\n" in record[:-1]:
        raise ValueError(f"{path}: a JSON line is one line ending in a newline")
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if rotate and info.st_size > MAX_LOG_BYTES:
            os.replace(path, rotated_path(path))  # this descriptor now writes to the rotated one
            os.close(fd)
            fd = os.open(path, flags, 0o644)
            info = os.fstat(fd)
        if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
            record = b"\n" + record  # the last line was cut short: it stays alone, skipped
        # One write() of one line with O_APPEND: lines from concurrent processes never interleave.
        written = os.write(fd, record)
        if written != len(record):
            raise OSError(errno.ENOSPC, f"line cut short ({written} of {len(record)} bytes)")
    finally:
        os.close(fd)
