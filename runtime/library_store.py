"""Where verified bundle libraries are kept for dlopen: one small interface, two stores.

    FolderStore   <cache dir>/libs/<sha256>.so and <sha256>.verified.json: shared by this
                  user's processes, so a library verified once is trusted by the next process
    MemoryStore   anonymous in-memory files of this process: used when the folder cannot hold
                  them (unwritable, read-only, full, or writable by others)

`store()` answers the folder store of the current cache dir until it fails once in this process,
then the memory store, said once. Both hand out a descriptor of exactly the verified bytes, one
that nobody else can change before it is dlopened: a folder entry is used only when it and every
folder up to the cache dir are this user's and writable by nobody else (runtime/private_files).
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path
from typing import Protocol

from cute_aot.artifacts.bundle import SHA256_RE
from cute_aot.artifacts.core import cache_layout, settings
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.artifacts.core.errors import BundleFormatError
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.runtime.private_files import make_private_folder, open_private, read_private

FACTS_SUFFIX = cache_layout.LIBS.marker
_MAX_FACTS_BYTES = 1 << 24  # a library's facts are kilobytes


class LibraryStore(Protocol):
    def verified_copy(self, sha256: str) -> tuple[int, str, dict] | None:
        """(descriptor, where, facts) of a library verified earlier, None when there is none."""

    def keep(self, sha256: str, library: bytes, facts: dict) -> tuple[int, str]:
        """Keep verified bytes and their facts; (descriptor of exactly them, where). OSError
        when this store cannot."""


def _check_sha(sha256: str) -> None:
    if not SHA256_RE.match(sha256):  # read_bundle checked it; a path is built from it here
        raise BundleFormatError("<manifest>", f"library sha256 {sha256!r} is not 64 hex")


class FolderStore:
    def __init__(self, root: Path):
        self.root = root
        self.libs = root / cache_layout.LIBS.folder

    def _target(self, sha256: str) -> Path:
        _check_sha(sha256)
        return self.libs / f"{sha256}{cache_layout.LIBS.data}"

    def verified_copy(self, sha256: str) -> tuple[int, str, dict] | None:
        if not SHA256_RE.match(sha256):
            return None
        target = self.libs / f"{sha256}{cache_layout.LIBS.data}"
        fd = open_private(target, self.root)
        if fd is None:
            return None
        try:
            facts = self._read_facts(target)
            if (
                facts
                and facts.get("sha256") == sha256
                and facts.get("size") == os.fstat(fd).st_size
            ):
                return fd, str(target), facts
        except (OSError, TypeError, ValueError):
            pass
        os.close(fd)
        return None

    def keep(self, sha256: str, library: bytes, facts: dict) -> tuple[int, str]:
        target = self._target(sha256)
        make_private_folder(self.libs, self.root)
        fd = self._open_same(target, library)
        if fd is None:  # absent, damaged, replaced or not private: (re)write it, then verify
            atomic_write(target, library, mode=0o555)
            fd = self._open_same(target, library)
            if fd is None:
                raise OSError(
                    errno.EPERM,
                    f"{target} is not a private file of this user in private folders up to "
                    f"{self.root} (others could change it before it is loaded)",
                )
        try:
            # What was verified, for later opens (written last: the copy is trusted only with it)
            atomic_write(_facts_path(target), json.dumps(facts).encode(), mode=0o444)
        except BaseException:
            os.close(fd)
            raise
        return fd, str(target)

    # -- the folder's rules (runtime/private_files.py) ---------------------------------------
    def _open_same(self, target: Path, library: bytes) -> int | None:
        fd = open_private(target, self.root)
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size == len(library):
                with os.fdopen(os.dup(fd), "rb") as handle:
                    if handle.read(len(library) + 1) == library:
                        return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _read_facts(self, target: Path) -> dict | None:
        raw = read_private(_facts_path(target), self.root, _MAX_FACTS_BYTES)
        data = json.loads(raw) if raw is not None else None
        return data if isinstance(data, dict) else None


class MemoryStore:
    """Anonymous in-memory files: private to this process by construction."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[int, dict]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def where(sha256: str) -> str:
        return f"memfd:cute-aot-{sha256[:16]}.so"

    def verified_copy(self, sha256: str) -> tuple[int, str, dict] | None:
        with self._lock:
            kept = self._kept.get(sha256)
            return None if kept is None else (os.dup(kept[0]), self.where(sha256), kept[1])

    def keep(self, sha256: str, library: bytes, facts: dict) -> tuple[int, str]:
        _check_sha(sha256)
        fd = os.memfd_create(f"cute-aot-{sha256[:16]}.so", os.MFD_CLOEXEC)
        with os.fdopen(os.dup(fd), "wb") as handle:
            handle.write(library)
        with self._lock:
            if sha256 not in self._kept:
                self._kept[sha256] = (os.dup(fd), facts)
        return fd, self.where(sha256)


def _facts_path(library: Path) -> Path:
    return library.with_name(f"{library.stem}{FACTS_SUFFIX}")


_memory = MemoryStore()
_failed: dict[str, str] = {}  # cache dir -> why its folder store was given up in this process


def store() -> LibraryStore:
    """The folder store of the current cache dir, or the memory store once that one failed."""
    root = settings.cache_dir()
    return _memory if str(root) in _failed else FolderStore(root)


def give_up_folder(error: OSError) -> LibraryStore:
    """The folder store failed (unwritable, full, not private): memory from now on, said once."""
    root = settings.cache_dir()
    _failed[str(root)] = error.strerror or str(error)
    warn_once(
        ("cache-unusable", str(root)),
        f"cache dir {root} cannot hold verified libraries ({error.strerror or error}); loading "
        "bundle libraries from anonymous in-memory files (no temporary files on disk; every "
        "process verifies each bundle in full)",
    )
    return _memory
