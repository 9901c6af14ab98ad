"""Publishing files so that no reader ever sees a partial one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write `data` to `path` via a unique temporary name in the same folder, fsync, rename.

    A failure leaves no temporary file behind and the previous `path` (if any) untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def publish_once(path: str | os.PathLike, data: bytes, mode: int = 0o444) -> bool:
    """Publish `data` at `path` unless someone already did; True if this call published it.

    Written to a unique temporary name, fsynced, then hard-linked into place: link() fails if the
    name exists, so the first publisher wins and readers only ever see complete files. No file
    lock is involved (flock is unreliable on NFS, where shared caches live).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
