"""Publishing files so that no reader ever sees a partial one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def _complete_temporary(path: Path, data: bytes, mode: int) -> Iterator[str]:
    """A fully written, fsynced file with a unique name beside `path`; removed on exit unless
    the caller has renamed it away."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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

    A failure leaves no temporary file behind and the previous `path` (if any) untouched.
    """
    path = Path(path)
    with _complete_temporary(path, data, mode) as tmp:
        os.replace(tmp, path)
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
