"""Whether only this user could have written a file: the basis for trusting what we wrote earlier.

A file is private when it is a regular file (not a link) owned by this process's effective user,
with no write permission for group or others, and every folder from it up to a given root is the
same. Then nobody but this user (and root) can have changed it or swapped it for another, so a
library verified when it was extracted, or an overlay entry this user published, can be trusted
later without verifying it again.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

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
