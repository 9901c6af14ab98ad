"""Real faults for tests: a read-only folder and a full disk, as small tmpfs mounts.

Root ignores file modes, so a read-only folder is a read-only mount; a full disk is a tmpfs of a
few pages. Where mounting is not permitted (no CAP_SYS_ADMIN) the tests that need them skip and
say so.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(target: Path, options: str) -> None:
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"needs a tmpfs mount (mount -t tmpfs: {result.stderr.strip() or 'refused'})")


@contextlib.contextmanager
def small_tmpfs(target: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of `size` at `target` (a full disk once filled)."""
    target.mkdir(parents=True, exist_ok=True)
    _mount(target, f"size={size},mode=0700")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


@contextlib.contextmanager
def read_only_folder(target: Path) -> Iterator[Path]:
    """An empty folder at `target` that nobody, root included, can write."""
    target.mkdir(parents=True, exist_ok=True)
    _mount(target, "size=64k,mode=0700")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def fill(folder: Path) -> None:
    """Fill the filesystem of `folder` to the last byte."""
    with open(folder / "filler", "wb", buffering=0) as handle:
        for size in (1 << 16, 4096, 1):
            with contextlib.suppress(OSError):
                while handle.write(b"\0" * size):
                    pass
