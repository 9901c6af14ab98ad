"""Open a bundle: verify it, check it fits this machine, load its library through TVM-FFI.

Never imports cutlass. The library is written once into the cache dir under its sha256 (atomic,
so concurrent servers never see a partial file); where the cache dir is not writable it is
loaded from a private temporary file that is removed as soon as it is mapped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.atomic import atomic_write
from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.errors import IncompatibleBundleError, KernelNotFoundError
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.runtime import paths
from cute_aot.runtime.notices import warn_once


@dataclass
class LoadedBundle:
    path: Path
    manifest: Manifest
    library_path: str
    module: Any  # tvm_ffi.Module
    entries: dict[str, Entry]  # key id -> entry
    _functions: dict[str, Callable] = field(default_factory=dict)

    @property
    def arch(self) -> str:
        return self.manifest.arch

    def function(self, key_id: str) -> Callable:
        """The TVM-FFI function of a key (looked up by symbol on first use, then cached)."""
        function = self._functions.get(key_id)
        if function is None:
            entry = self.entries.get(key_id)
            if entry is None:
                raise KernelNotFoundError("?", key_id, self.arch, [str(self.path)])
            function = self._functions[key_id] = self.module[entry.symbol]
        return function


def check_compatible(path: Path, manifest: Manifest, gpu_arch: str | None) -> None:
    """Refuse a bundle that cannot run here. gpu_arch None: no GPU to check against."""
    if gpu_arch is not None and manifest.arch != gpu_arch:
        raise IncompatibleBundleError(path, f"built for {manifest.arch}, this GPU needs {gpu_arch}")
    built, installed = manifest.toolchain.get("tvm_ffi"), toolchain.tvm_ffi_version()
    if not toolchain.abi_compatible_tvm_ffi(built, installed):
        raise IncompatibleBundleError(
            path, f"built with apache-tvm-ffi {built}, this machine has {installed}"
        )


def _load_library(library: bytes, sha256: str):
    """dlopen the library via TVM-FFI; returns (module, path it was loaded from)."""
    import tvm_ffi

    target = paths.cache_dir() / "libs" / f"{sha256}.so"
    try:
        if not (target.is_file() and target.stat().st_size == len(library)):
            atomic_write(target, library, mode=0o555)
    except OSError as exc:
        warn_once(
            ("cache-unwritable", str(target.parent)),
            f"cache dir {target.parent} is not writable ({exc.strerror}); loading bundle "
            "libraries from private temporary files instead",
        )
        # A private temporary file, removed as soon as it is mapped: nothing is left behind.
        with tempfile.NamedTemporaryFile(prefix="cute-aot-", suffix=".so") as handle:
            handle.write(library)
            handle.flush()
            return tvm_ffi.load_module(handle.name), handle.name
    return tvm_ffi.load_module(str(target)), str(target)


def open_bundle(path: str | os.PathLike, gpu_arch: str | None = None) -> LoadedBundle:
    """Verify, check and load one bundle file. gpu_arch: the architecture it must be built for."""
    path = Path(path)
    manifest, library = read_bundle(path)
    check_compatible(path, manifest, gpu_arch)
    module, library_path = _load_library(library, manifest.library["sha256"])
    return LoadedBundle(path, manifest, library_path, module, manifest.entry_by_id())
