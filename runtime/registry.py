"""Which loaded bundle serves which (architecture, family, key)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.errors import KernelNotFoundError
from cute_aot.runtime import paths
from cute_aot.runtime.device import current_gpu_arch
from cute_aot.runtime.loader import LoadedBundle, open_bundle


class Registry:
    def __init__(self) -> None:
        self.bundles: list[LoadedBundle] = []
        self._index: dict[tuple[str, str, str], LoadedBundle] = {}
        self._lock = threading.Lock()
        self._env_loaded = False

    def add(self, bundle: LoadedBundle) -> None:
        with self._lock:
            self.bundles.append(bundle)
            for entry in bundle.manifest.entries:
                # first loaded wins: explicit paths are loaded before CUTE_AOT_BUNDLES
                self._index.setdefault((bundle.arch, entry.family, entry.key_id), bundle)

    def load(self, *sources: str | os.PathLike, gpu_arch: str | None = None) -> list[LoadedBundle]:
        """Load bundle files, and the bundles of `gpu_arch` found in folders.

        An explicit file that does not fit this GPU raises; a folder's bundles for other
        architectures are skipped (one folder usually ships every architecture).
        """
        gpu_arch = gpu_arch or current_gpu_arch()
        loaded = []
        for source in map(Path, sources):
            if source.is_dir():
                for path in paths.expand_bundle_paths([source]):
                    if gpu_arch is None or read_manifest(path).arch == gpu_arch:
                        loaded.append(open_bundle(path, gpu_arch))
            else:
                loaded.append(open_bundle(source, gpu_arch))
        for bundle in loaded:
            self.add(bundle)
        return loaded

    def load_from_env(self) -> None:
        """Load CUTE_AOT_BUNDLES once per process."""
        if not self._env_loaded:
            self._env_loaded = True
            self.load(*paths.bundle_search_paths())

    def function(self, family: str, key_id: str, arch: str) -> Callable:
        bundle = self._index.get((arch, family, key_id))
        if bundle is None:
            self.load_from_env()
            bundle = self._index.get((arch, family, key_id))
        if bundle is None:
            searched = [str(b.path) for b in self.bundles if b.arch == arch]
            raise KernelNotFoundError(family, key_id, arch, searched)
        return bundle.function(key_id)

    def clear(self) -> None:
        with self._lock:
            self.bundles.clear()
            self._index.clear()
            self._env_loaded = False


REGISTRY = Registry()


def load_bundles(*sources: str | os.PathLike, gpu_arch: str | None = None) -> list[LoadedBundle]:
    """Load bundles (files or folders) into the process-wide registry."""
    return REGISTRY.load(*sources, gpu_arch=gpu_arch)
