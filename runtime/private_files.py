"""Whether only this user could have written a file: the basis for trusting what we wrote earlier.

A file is private when it is a regular file (not a link) owned by this process's effective user,
with no write permission for group or others, and every folder from it up to a given root is the
same. Then nobody but this user (and root) can have changed it or swapped it for another, so a
library verified when it was extracted, or an overlay entry this user published, can be trusted
later without verifying it again.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cute_aot.artifacts.core.notices import warn_once

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _private(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid() and not info.st_mode & _OTHERS_WRITE


def private_descriptor(fd: int) -> bool:
    """The open file is a regular file only this user can write."""
    info = os.fstat(fd)
    return stat.S_ISREG(info.st_mode) and _private(info)


def private_folders(path: Path, root: Path) -> bool:
    """Every folder from `path`'s own up to and including `root` is owned by this user and not
    writable by others (a folder others can write lets them rename files in and out)."""
    folder, root = Path(path).parent, Path(root)
    while True:
        try:
            info = os.lstat(folder)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or not _private(info):
            return False
        if folder == root:
            return True
        if folder == folder.parent or root not in folder.parents:
            return False
        folder = folder.parent


def private_file(path: Path, root: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and _private(info) and private_folders(path, root)


def open_private(path: Path, root: Path) -> int | None:
    """A descriptor of `path` if it is a private regular file (not a link, not a FIFO) in
    private folders up to `root`: then nobody else can change its bytes. None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if private_descriptor(fd) and private_folders(path, root):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_private(path: Path, root: Path, limit: int) -> bytes | None:
    """The bytes of `path` if it is a private file (open_private's rule) of at most `limit`
    bytes; None otherwise. Read at its size: a read of `limit` bytes allocates that much first.
    OSError: it could not be read."""
    fd = open_private(path, root)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        return handle.read(size) if size <= limit else None


def make_private_folder(folder: Path, root: Path) -> None:
    """`folder` made 0700 whatever the umask, inside `root` (the cache dir); group and other
    write taken away from folders of ours that have it (made under umask 002 by an older
    cute-aot, or by hand): with it, nothing there could ever be trusted. OSError: it cannot be."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not folder.resolve().is_relative_to(root.resolve()):
        raise OSError(errno.EXDEV, f"{folder} is a link leading outside the cache dir")
    for each in (root, folder):
        info = os.lstat(each)
        if info.st_uid == os.geteuid() and info.st_mode & _OTHERS_WRITE:
            os.chmod(each, stat.S_IMODE(info.st_mode) & ~_OTHERS_WRITE)
            warn_once(
                ("cache-made-private", str(each)),
                f"{each} was writable by group or others; made it private",
            )
