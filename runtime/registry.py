"""The loaded bundles: which bundle holds which (architecture, family, key), which dispatch
table a family uses, and the overlay's entries.

Loading (explicit sources, then what runtime/sources.py finds: CUTE_AOT_BUNDLES and installed
bundle wheels) and staleness live here; which source serves a problem, and whether a bundle that
cannot be loaded raises or falls back, is runtime/policy.py's one decision; the ladder a call
walks is runtime/resolution.py. Every change moves the resolution epoch.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.core.errors import (
    BundleError,
    IncompatibleBundleError,
    KernelNotFoundError,
    KeyFileError,
    OtherArchError,
    StaleBundleError,
    TableError,
)
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.artifacts.manifest import Manifest
from cute_aot.kernels import foreign_facts, installed_family, source_is_current
from cute_aot.kernels.contract import requirements
from cute_aot.kernels.tables import Table
from cute_aot.runtime import epoch, overlay, paths, policy, sources
from cute_aot.runtime.device import current_gpu_arch
from cute_aot.runtime.loader import LoadedBundle, open_bundle

__all__ = ["REGISTRY", "Registry", "StaleBundleError", "load_bundles", "stale_reasons"]


def stale_reasons(manifest: Manifest) -> dict[str, str]:
    """family -> why this bundle's kernels of that family must not serve with the installed
    package: family unknown, not built for this architecture, other version, ABI or sources, or
    another cutlass-dsl compiler."""
    reasons = {}
    installed_dsl = toolchain.cutlass_dsl_versions()
    for name, facts in manifest.families.items():
        kernel_family = installed_family(name)
        if kernel_family is None:
            reasons[name] = "family not installed here"
            continue
        if not kernel_family.supports(manifest.arch):
            reasons[name] = f"{name} is built for {', '.join(kernel_family.archs)} only"
        elif facts.get("version") != kernel_family.version:
            reasons[name] = f"family version {facts.get('version')} != {kernel_family.version}"
        elif facts.get("abi") != kernel_family.abi_record():
            reasons[name] = "exported function ABI differs from the installed family's"
        elif not source_is_current(name, facts):
            reasons[name] = "kernel source hash differs from the installed package"
        elif requirements(kernel_family) and facts.get("foreign") != foreign_facts(name):
            reasons[name] = _foreign_difference(facts.get("foreign") or {}, foreign_facts(name))
        elif not requirements(kernel_family) and facts.get("foreign") is not None:
            reasons[name] = "built against other distributions: " + ", ".join(facts["foreign"])
        elif installed_dsl and not toolchain.same_cutlass_dsl(
            manifest.toolchain.get("cutlass_dsl") or {}, installed_dsl
        ):
            reasons[name] = (
                f"built with {manifest.toolchain.get('cutlass_dsl')}, installed {installed_dsl}"
            )
    return reasons


def _foreign_difference(built: dict, installed: dict) -> str:
    """Why a family's foreign facts differ: the first distribution that does, in words."""
    for distribution, here in installed.items():
        there = built.get(distribution) or {}
        if here.get("version") is None:
            return f"{distribution} is not installed here (built against {there.get('version')})"
        if there.get("version") != here.get("version"):
            return (
                f"built against {distribution} {there.get('version')}, installed {here['version']}"
            )
        if there.get("source_hash") != here.get("source_hash"):
            return (
                f"{distribution} {here['version']}: its kernel sources differ from the "
                "ones built against (a patched or reinstalled copy)"
            )
    return "built against other distributions: " + ", ".join(sorted(built))


class Registry:
    """The loaded bundles, their key index and dispatch tables. Every change moves the
    resolution epoch (runtime/epoch.py): what ops resolved before is resolved again."""

    def __init__(self) -> None:
        self.bundles: list[LoadedBundle] = []
        self.overlay_bundles: dict[tuple[str, str], LoadedBundle] = {}
        self.stale: dict[tuple[str, str], list[str]] = {}  # (arch, family) -> reasons
        self._index: dict[tuple[str, str, str], LoadedBundle] = {}
        self._lock = threading.RLock()
        # CUTE_AOT_BUNDLES sources loaded so far: one that could not be read (a folder not
        # mounted yet, an NFS hiccup) is tried again at the next resolution, not given up on.
        self._env_done: set[str] = set()
        self._env_failed: dict[str, float] = {}  # source -> monotonic time of its next try
        # (arch, family) -> (dispatch table, the bundle it came from): the first loaded bundle
        # that carries one for the family decides; kernels of every bundle still serve any key.
        self._tables: dict[tuple[str, str], tuple[Table, Path]] = {}

    # -- loading ---------------------------------------------------------------------------------
    def add(self, bundle: LoadedBundle) -> None:
        reasons = self._refuse_stale(bundle.path, bundle.manifest)
        with self._lock:
            self.bundles.append(bundle)
            for name, facts in bundle.manifest.families.items():
                if name not in reasons and "table" in facts:
                    self._add_table(bundle, name, facts["table"])
            for entry in bundle.manifest.entries:
                if entry.family not in reasons:
                    # first loaded wins: explicit paths are loaded before CUTE_AOT_BUNDLES
                    self._index.setdefault((bundle.arch, entry.family, entry.key_id), bundle)
            # A shape resolved before (to the overlay, JIT or torch) may now have a prebuilt kernel.
            epoch.advance()

    def _add_table(self, bundle: LoadedBundle, family_name: str, record: dict) -> None:
        try:
            table = Table.from_record(record, str(bundle.path))
        except TableError as exc:
            warn_once(
                ("bad-table", str(bundle.path), family_name),
                f"{exc}; {family_name} dispatches with the installed package's table",
            )
            return
        first, where = self._tables.setdefault((bundle.arch, family_name), (table, bundle.path))
        if first != table:
            warn_once(
                ("table-differs", str(bundle.path), family_name),
                f"{bundle.path}: its {family_name} dispatch table for {bundle.arch} "
                f"({table.describe()}) differs from that of {where}, loaded first "
                f"({first.describe()}); {family_name} dispatches with the first one, and the "
                "kernels of both bundles serve whatever key it asks for",
            )

    def table(self, family_name: str, arch: str) -> Table | None:
        """The dispatch table `family_name` uses on `arch`: the one recorded by the first loaded
        bundle that carries one for it (None: the installed package's own)."""
        self.load_from_env()
        found = self._tables.get((arch, family_name))
        return found[0] if found else None

    def load(self, *sources: str | os.PathLike, gpu_arch: str | None = None) -> list[LoadedBundle]:
        """Load bundle files, and the bundles of `gpu_arch` found in folders.

        An explicit file that does not fit this GPU raises; a folder's bundles for other
        architectures are skipped (one folder usually ships every architecture). A bad bundle
        (corrupt, untrusted, incompatible) named explicitly raises; one found in a folder is
        skipped with one warning in mode auto (see _open).
        """
        return self._load(sources, gpu_arch, skip_bad_files=False)

    def _load(self, given, gpu_arch: str | None, skip_bad_files: bool) -> list[LoadedBundle]:
        gpu_arch = gpu_arch or current_gpu_arch()
        loaded = []
        local = [path for source in given for path in sources.local_paths(os.fspath(source))]
        for source in local:
            if source.is_dir():
                for path in paths.expand_bundle_paths([source]):
                    loaded.append(self._open(path, gpu_arch, in_folder=True, skip_bad=True))
            else:
                loaded.append(self._open(source, gpu_arch, False, skip_bad_files))
        loaded = [bundle for bundle in loaded if bundle is not None]
        for bundle in loaded:
            self.add(bundle)
        return loaded

    def _refuse_stale(self, path: Path, manifest: Manifest) -> dict[str, str]:
        """Staleness, decided on the manifest alone (before any dlopen): mode aot refuses a
        bundle stale for any family; mode auto uses it for its other families, with one warning
        per stale family, and refuses it when every family it holds is stale (nothing to load
        it for). Returns the stale families' reasons."""
        reasons = stale_reasons(manifest)
        if not reasons:
            return reasons
        with self._lock:
            for name, reason in reasons.items():
                said = self.stale.setdefault((manifest.arch, name), [])
                if f"{path}: {reason}" not in said:
                    said.append(f"{path}: {reason}")
        summary = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
        if policy.on_load_failure(policy.STALE) == policy.RAISE:
            raise StaleBundleError(path, f"stale ({summary})")
        for name, reason in reasons.items():
            warn_once(
                ("stale", str(path), name), f"{path}: not used for {name} ({reason}); falling back"
            )
        if set(reasons) >= set(manifest.families):
            raise StaleBundleError(path, f"stale for every family it holds ({summary})")
        return reasons

    def _open(self, path: Path, gpu_arch, in_folder: bool, skip_bad: bool) -> LoadedBundle | None:
        """Open one bundle. In mode auto a bad one that may be skipped is, with one warning, so
        that a server falls back (overlay, JIT) instead of failing; mode aot always raises. A
        bundle stale for every family it holds is never dlopened, and never fails mode auto."""
        try:
            return open_bundle(path, gpu_arch, accept=self._refuse_stale)
        except StaleBundleError:
            if policy.on_load_failure(policy.STALE) == policy.RAISE:
                raise
            return None  # warned once per family by _refuse_stale; its kernels fall back
        except (BundleError, KeyFileError) as exc:
            kind = policy.OTHER_ARCH if isinstance(exc, OtherArchError) else policy.DAMAGED
            action = policy.on_load_failure(kind, named=not skip_bad, in_folder=in_folder)
            if action == policy.RAISE:
                raise
            if action == policy.IGNORE:
                return None
            warn_once(
                ("bad-bundle", str(path)),
                f"skipping bundle {path}: {exc}; its kernels fall back to the overlay cache or JIT",
            )
            return None

    def load_from_env(self) -> None:
        """Load what the environment names (runtime/sources.py: CUTE_AOT_BUNDLES, installed
        bundle wheels) and was not loaded yet. The first attempt holds the lock: no thread sees
        an empty registry while the first one loads. A source that cannot be read now (a folder
        not mounted, a store that does not answer) is skipped with one warning and tried again
        every ENV_RETRY_SECONDS: a path at the next resolution, a URL in a background thread, so
        that no call waits on the network. A bad bundle is skipped for good (mode auto)."""
        pending = [s for s in sources.environment_sources() if s not in self._env_done]
        if not pending:
            return
        with self._lock:
            for source in pending:
                retry_at = self._env_failed.get(source)
                if source in self._env_done or (retry_at and time.monotonic() < retry_at):
                    continue
                if retry_at is not None and sources.is_url(source):
                    self._retry_in_background(source)
                else:
                    self._load_source(source)

    def _load_source(self, source: str, found: list[Path] | None = None) -> None:
        try:
            found = sources.local_paths(source) if found is None else found
            for path in found:
                if not path.exists():
                    raise FileNotFoundError(errno.ENOENT, "no such file or folder", source)
            self._load(found, None, skip_bad_files=True)
        except OSError as exc:
            kind = policy.ABSENT if isinstance(exc, FileNotFoundError) else policy.UNREACHABLE
            if policy.on_load_failure(kind) == policy.RAISE:
                raise
            warn_once(
                ("bundles-unreadable", source),
                f"bundle source {source} cannot be read now ({exc.strerror or exc}); "
                f"trying again every {ENV_RETRY_SECONDS:g} s while kernels fall back",
            )
            self._env_failed[source] = time.monotonic() + ENV_RETRY_SECONDS
            return
        except (BundleError, KeyFileError) as exc:  # a bad bundle at a URL: not a retry
            if policy.on_load_failure(policy.DAMAGED) == policy.RAISE:
                raise
            warn_once(
                ("bad-bundle", source),
                f"skipping bundle source {source}: {exc}; its kernels fall back",
            )
        self._env_failed.pop(source, None)
        self._env_done.add(source)

    def _retry_in_background(self, source: str) -> None:
        """Fetch `source` again off the calling thread (the network may take its timeouts), then
        load what arrived under the lock."""
        self._env_failed[source] = float("inf")  # one retry at a time

        def retry() -> None:
            try:
                found = sources.local_paths(source)
            except (OSError, BundleError, KeyFileError):
                found = None  # said once already; _load_source says it again if it changed
            with self._lock:
                if found is None:
                    self._env_failed[source] = time.monotonic() + ENV_RETRY_SECONDS
                else:
                    self._load_source(source, found)

        threading.Thread(target=retry, name="cute-aot-bundle-retry", daemon=True).start()

    def env_pending(self) -> bool:
        """Whether a CUTE_AOT_BUNDLES source could not be read yet: resolutions that fell back
        are then not remembered, so that the source is tried again (every ENV_RETRY_SECONDS)."""
        return any(s not in self._env_done for s in sources.environment_sources())

    # -- resolution ------------------------------------------------------------------------------
    def bundle_function(self, family: str, key_id: str, arch: str, key=None) -> Callable | None:
        """The loaded function of `key_id` (None: no bundle holds it); `key`, the caller's key
        of that id where it has one, spares the entry's check deriving it again."""
        bundle = self._index.get((arch, family, key_id))
        if bundle is None:
            self.load_from_env()
            bundle = self._index.get((arch, family, key_id))
        return bundle.function(key_id, key) if bundle else None

    def entry_key(self, family: str, key_id: str, arch: str) -> dict | None:
        """The key fields a loaded bundle's entry was built with (None: no bundle holds it)."""
        bundle = self._index.get((arch, family, key_id))
        entry = bundle.entries.get(key_id) if bundle is not None else None
        return entry.key if entry is not None else None

    def entry_keys(self, family: str, arch: str) -> list[dict]:
        """The key fields of every loaded kernel of `family` for `arch` (bundles of
        CUTE_AOT_BUNDLES loaded first)."""
        self.load_from_env()
        with self._lock:
            found = [
                (bundle, key_id)
                for (a, f, key_id), bundle in self._index.items()
                if a == arch and f == family
            ]
        return [bundle.entries[key_id].key for bundle, key_id in found]

    def overlay_function(self, key, arch: str) -> Callable | None:
        """The overlay's function of `key`, None when it holds none. OSError: the overlay
        folder cannot be used (the policy then compiles)."""
        slot = (arch, key.id)
        bundle = self.overlay_bundles.get(slot)
        if bundle is None:
            path = overlay.overlay_path(key, arch)
            found = overlay.identity(path)
            if found is None:
                return None
            try:
                bundle = open_bundle(path, arch, trust=overlay.check_trust)
            except ENVIRONMENT_REFUSALS as exc:
                # Good for other hosts (a newer driver, other libraries): never set aside here.
                warn_once(("overlay-unfit", str(path)), f"not using overlay entry: {exc}")
                return None
            except BundleError as exc:  # a damaged or untrusted entry is a miss, never a crash
                moved = overlay.set_aside(path, found)  # so that this miss's JIT can replace it
                warn_once(
                    ("overlay-bad", str(path)),
                    f"ignoring overlay entry: {exc}"
                    + ("; set aside for replacement" if moved else ""),
                )
                return None
            self.overlay_bundles[slot] = bundle
        return bundle.function(key.id)

    def not_found(self, key, arch: str) -> KernelNotFoundError:
        """Mode aot's error for a key no loaded bundle holds: what was searched, what was stale."""
        searched = [str(b.path) for b in self.bundles if b.arch == arch]
        stale = "; ".join(self.stale.get((arch, key.FAMILY), []))
        return KernelNotFoundError(
            key.FAMILY,
            key.id,
            arch,
            searched,
            detail=f"{key.describe()}; mode aot" + (f"; stale bundles: {stale}" if stale else ""),
        )

    def clear(self) -> None:
        with self._lock:
            self.bundles.clear()
            self.overlay_bundles.clear()
            self.stale.clear()
            self._index.clear()
            self._tables.clear()
            self._env_done.clear()
            self._env_failed.clear()
            epoch.advance()


ENV_RETRY_SECONDS = 1.0
# An overlay entry refused for what this machine lacks, not for what the entry is (a driver too
# old, a library missing, another tvm-ffi: all IncompatibleBundleErrors).
ENVIRONMENT_REFUSALS = IncompatibleBundleError


REGISTRY = Registry()


def load_bundles(*sources: str | os.PathLike, gpu_arch: str | None = None) -> list[LoadedBundle]:
    """Load bundles (files or folders) into the process-wide registry."""
    return REGISTRY.load(*sources, gpu_arch=gpu_arch)
