"""Open a bundle: verify it, check it fits this machine, load its library through TVM-FFI.

Everything is checked before any dlopen, in this order:
  1. the container: header, manifest hash, schema and field formats (artifacts/bundle.py);
  2. trust (signature policy) and compatibility (GPU architecture, tvm-ffi ABI), from the manifest
     alone, before the payload is decompressed;
  3. payload and library hashes, bounded decompression;
  4. every entry's key re-derives its id and symbol; the library's ELF is for this CPU, exports
     every entry, needs only allowed libraries that this process can resolve, and only glibc
     versions this machine has (artifacts/verify.py, here).

Never imports cutlass, except to serve a C-ABI entry (a recorded `cute.compile` made without
TVM-FFI, asked for only by a caller of `cute.compile`: the DSL's own loader makes its function).
The verified library is kept in a library store (runtime/library_store.py):
written once into the cache dir under its sha256 (atomic, so concurrent servers never see a
partial file), opened without following links, used only when nobody else could change it, compared
byte for byte with the verified library and dlopened through that open descriptor: what is loaded
is exactly what was verified. Where the cache dir cannot hold it (unwritable, full, shared with
others) it is loaded from an anonymous in-memory file: nothing is written elsewhere.
"""

from __future__ import annotations

import glob
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cute_aot.artifacts import signing, toolchain
from cute_aot.artifacts.bundle import read_bundle, read_manifest
from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.errors import (
    DriverTooOldError,
    IncompatibleBundleError,
    KernelNotFoundError,
    MissingLibraryError,
    OtherArchError,
    SignatureError,
)
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.artifacts.elf import DynamicInfo, newest_glibc
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.artifacts.verify import (
    check_dynamic,
    check_entries,
    check_entry_key,
    check_library,
    host_machine,
)
from cute_aot.kernels import installed_family
from cute_aot.kernels.arch import SUPPORTED_ARCHS
from cute_aot.runtime import device, library_store, manifest_memo

TVM_FFI_LIBRARY = "libtvm_ffi.so"
ManifestCheck = Callable[[Path, Manifest], None]
TrustCheck = Callable[[Path, Manifest], "signing.TrustedKey | None"]
# (library sha256, cache dir) -> (module, where it was loaded from, its dynamic-linking facts,
# the descriptor it was dlopened through): each library is loaded once per process.
_loaded: dict[tuple[str, str], tuple[Any, str, DynamicInfo, int]] = {}
_loaded_lock = threading.Lock()
# "1": verify every bundle's library in full on every load (audits; the cold-start benchmark's
# "before"), instead of trusting the private copy verified when it was extracted.
# The one exported function of a bundle library besides its kernels: the ops' C hit path.
SHAPE_DISPATCH_FUNCTION = "cute_aot_dispatch_new"


@dataclass
class LoadedBundle:
    path: Path
    manifest: Manifest
    library_path: str
    module: Any  # tvm_ffi.Module
    entries: dict[str, Entry]  # key id -> entry
    signer: signing.TrustedKey | None = None  # the trusted key that signed it, if verified
    # Set when keys were not re-derived at open: each entry is, before its first use.
    key_class: Callable[[str], type | None] | None = None
    library_fd: int = -1  # the open descriptor the library was dlopened through
    _functions: dict[str, Callable] = field(default_factory=dict)
    _c_abi_module: Any = None  # the DSL's module over this library, made for the first C entry

    @property
    def arch(self) -> str:
        return self.manifest.arch

    def shape_dispatcher(self, num_inputs: int) -> Callable | None:
        """A new, empty C table from input shapes to kernels (artifacts/shape_dispatch.c: the ops'
        hit path), or None for a library linked before it existed."""
        try:
            make = self.module[SHAPE_DISPATCH_FUNCTION]
        except (AttributeError, KeyError, RuntimeError, ValueError):
            return None
        return make(num_inputs)

    def function(self, key_id: str, key=None) -> Callable:
        """The function of a key (looked up by symbol on first use, then cached): TVM-FFI's,
        or for a C-ABI entry the DSL's JitCompiledFunction. `key`: the caller's key of that id,
        which the deferred check then uses instead of deriving one from the entry's fields."""
        function = self._functions.get(key_id)
        if function is None:
            entry = self.entries.get(key_id)
            if entry is None:
                raise KernelNotFoundError("?", key_id, self.arch, [str(self.path)])
            key_class = self.key_class(entry.family) if self.key_class else None
            if key_class is not None:
                check_entry_key(self.path, entry, key_class, key)
            if entry.abi == "c":
                if self._c_abi_module is None:
                    self._c_abi_module = _load_c_abi_module(self.path, self.library_fd)
                function = self._c_abi_module[entry.symbol]
            else:
                function = self.module[entry.symbol]
            self._functions[key_id] = function
        return function


@dataclass(frozen=True)
class VerifiedBundle:
    """A bundle that passed every check short of loading it."""

    path: Path
    manifest: Manifest
    library: bytes
    dynamic: DynamicInfo
    signer: signing.TrustedKey | None


# -- checks on the manifest alone ----------------------------------------------------------------
def check_compatible(path: Path, manifest: Manifest, gpu_arch: str | None) -> None:
    """Refuse a bundle that cannot run here. gpu_arch None: no GPU to check against."""
    if manifest.arch not in SUPPORTED_ARCHS:
        raise IncompatibleBundleError(
            path, f"built for {manifest.arch}, an architecture this cute-aot does not know"
        )
    refuse_other_arch(path, manifest, gpu_arch)
    built, installed = manifest.toolchain.get("tvm_ffi"), toolchain.tvm_ffi_version()
    if not toolchain.abi_compatible_tvm_ffi(built, installed):
        raise IncompatibleBundleError(
            path, f"built with apache-tvm-ffi {built}, this machine has {installed}"
        )
    if gpu_arch is not None:
        check_driver(path, manifest)


def refuse_other_arch(path: Path, manifest: Manifest, gpu_arch: str | None) -> None:
    """OtherArchError for a bundle of a known architecture that is not this GPU's (what a
    folder's bundles for other GPUs are skipped by); an unknown one is check_compatible's."""
    if gpu_arch is not None and manifest.arch in SUPPORTED_ARCHS and manifest.arch != gpu_arch:
        raise OtherArchError(path, f"built for {manifest.arch}, this GPU needs {gpu_arch}")


def check_driver(path: Path, manifest: Manifest) -> None:
    """The library links the CUDA runtime statically: a driver older than its major version would
    fail at the first launch, mid-request, so refuse the bundle now."""
    runtime_major = manifest.toolchain.get("cuda_runtime_major")
    driver = device.driver_cuda_version()
    if isinstance(runtime_major, int) and driver is not None and driver[0] < runtime_major:
        raise DriverTooOldError(
            path,
            f"the library links the CUDA {runtime_major} runtime, this driver supports CUDA "
            f"{driver[0]}.{driver[1]}: update the NVIDIA driver or use a bundle built for CUDA "
            f"{driver[0]}",
        )


def check_trust(path: Path, manifest: Manifest) -> signing.TrustedKey | None:
    """The signature policy (CUTE_AOT_TRUSTED_KEYS, CUTE_AOT_REQUIRE_SIGNATURE).

    Required: only bundles signed by a trusted key load. Not required: unsigned bundles load; a
    bundle signed by a trusted key must verify (a tampered signed bundle never loads); one signed
    by an unknown key loads as unsigned, said once.
    """
    required = signing.signature_required()
    if manifest.signature is None and not required:
        return None  # key files are read only when a decision needs them
    trusted = signing.trusted_keys()
    if not required and signing.signer_key_id(manifest) not in trusted:
        warn_once(
            ("untrusted-signer", signing.signer_key_id(manifest)),
            f"{path}: signed by {signing.ALGORITHM} key {signing.signer_key_id(manifest)}, which "
            f"is not in {settings.TRUSTED_KEYS.name}; loading it as an unsigned bundle",
        )
        return None
    if manifest.signature is None:
        raise SignatureError(
            path, f"bundle is not signed and {settings.REQUIRE_SIGNATURE.name} is set"
        )
    return signing.verify_signature(manifest, trusted, path)


# -- checks on the library -----------------------------------------------------------------------
def _loaded_libraries() -> set[str]:
    """File names of the shared libraries mapped into this process (dlopen finds these by name)."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.rsplit("/", 1)[-1].strip() for line in maps if "/" in line}
    except OSError:
        return set()


def _ld_so_conf_dirs(conf: Path, depth: int = 0) -> list[Path]:
    dirs: list[Path] = []
    try:
        lines = conf.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return dirs
    for line in (line.split("#", 1)[0].strip() for line in lines):
        if line.startswith("include ") and depth < 4:
            pattern = line.split(None, 1)[1]
            for included in sorted(glob.glob(str(conf.parent / pattern))):  # absolute stays so
                dirs += _ld_so_conf_dirs(Path(included), depth + 1)
        elif line.startswith("/"):
            dirs.append(Path(line))
    return dirs


def library_search_dirs() -> list[Path]:
    """Where the system loader looks for a library by name: LD_LIBRARY_PATH, ld.so.conf,
    defaults."""
    env = [Path(part) for part in settings.library_path()]
    multiarch = f"{host_machine()}-linux-gnu"
    defaults = [Path(d) for d in ("/lib", "/usr/lib", "/lib64", "/usr/lib64")]
    defaults += [Path("/lib") / multiarch, Path("/usr/lib") / multiarch]
    return env + _ld_so_conf_dirs(Path("/etc/ld.so.conf")) + defaults


def find_library(name: str, loaded: set[str] | None = None) -> str | None:
    """Where the loader would resolve `name` from: already mapped, or a file on its search path."""
    if name in (_loaded_libraries() if loaded is None else loaded):
        return name
    for folder in library_search_dirs():
        if (folder / name).is_file():
            return str(folder / name)
    return None


def _glibc_version() -> tuple[int, int] | None:
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (ValueError, OSError):
        return None
    match = re.match(r"^glibc (\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_dependencies(path: Path, dynamic: DynamicInfo) -> None:
    """Every needed library resolves here, and glibc is new enough: else dlopen would fail."""
    loaded = _loaded_libraries()
    for name in dynamic.needed:
        if find_library(name, loaded) is None:
            hint = " (it comes with apache-tvm-ffi)" if name == TVM_FFI_LIBRARY else ""
            raise MissingLibraryError(
                path, name, f"library needs {name}, which is not found on this machine{hint}"
            )
    have, wanted = _glibc_version(), newest_glibc(dynamic)
    if have is not None and wanted is not None and wanted[:2] > have:
        raise IncompatibleBundleError(
            path, f"library needs {wanted[2]}, this machine has glibc {have[0]}.{have[1]}"
        )


def _import_tvm_ffi(path: Path):
    try:
        import tvm_ffi
    except ImportError as exc:
        raise MissingLibraryError(
            path, TVM_FFI_LIBRARY, f"loading bundles needs apache-tvm-ffi ({exc})"
        ) from None
    return tvm_ffi


def installed_key_class(family_name: str):
    """The installed family's key class, or None when the family is not installed here."""
    found = installed_family(family_name)
    return found.Key if found is not None else None


# -- the pipeline --------------------------------------------------------------------------------
def verify_bundle(
    path: str | os.PathLike,
    gpu_arch: str | None = None,
    accept: ManifestCheck | None = None,
    trust: TrustCheck | None = None,
) -> VerifiedBundle:
    """Every check open_bundle makes, short of loading the library (also for `aot-cache verify`).

    `accept(path, manifest)`: the caller's own refusal (the registry's staleness rule), made on
    the manifest alone, before the payload is decompressed and long before any dlopen.
    `trust`: the signature policy (default: check_trust, for bundles; the overlay has its own).
    Raises a BundleError subclass naming the file and the problem; KeyFileError when
    CUTE_AOT_TRUSTED_KEYS names a file that is not a key.
    """
    path = Path(path)
    signer: list[signing.TrustedKey | None] = [None]

    def before_payload(path: Path, manifest: Manifest) -> None:
        signer[0] = check_manifest(path, manifest, gpu_arch, accept, trust)

    manifest, library = read_bundle(path, check=before_payload)
    check_entries(path, manifest, installed_key_class)
    dynamic = check_library(path, manifest, library)
    _import_tvm_ffi(path)  # maps libtvm_ffi.so into this process, where dlopen will find it
    check_dependencies(path, dynamic)
    return VerifiedBundle(path, manifest, library, dynamic, signer[0])


def open_bundle(
    path: str | os.PathLike,
    gpu_arch: str | None = None,
    accept: ManifestCheck | None = None,
    trust: TrustCheck | None = None,
) -> LoadedBundle:
    """Verify, check and load one bundle file. gpu_arch: the architecture it must be built for.

    A library is verified in full (hashes, ELF) when it is first extracted into the cache dir;
    later opens trust that copy when only this user could have written it (runtime/private_files)
    and read just the manifest, re-deriving each entry's key before its first use.
    """
    path = Path(path)
    if not settings.reverify():
        opened = _open_trusted(path, gpu_arch, accept, trust)
        if opened is not None:
            return opened
    bundle = verify_bundle(path, gpu_arch, accept, trust)
    manifest = bundle.manifest
    module, library_path, _, fd = _load_library(
        bundle.path, bundle.library, manifest.library["sha256"], bundle.dynamic
    )
    entries = manifest.entry_by_id()
    return LoadedBundle(
        bundle.path, manifest, library_path, module, entries, bundle.signer, None, fd
    )


def check_manifest(
    path: Path, manifest: Manifest, gpu_arch, accept: ManifestCheck | None, trust: TrustCheck | None
) -> signing.TrustedKey | None:
    """What both ways of opening decide from the manifest alone: the architecture (a folder's
    bundles for other GPUs are skipped before anything else is asked), trust, fit, the caller's
    rule."""
    refuse_other_arch(path, manifest, gpu_arch)
    signer = (trust or check_trust)(path, manifest)
    check_compatible(path, manifest, gpu_arch)
    if accept is not None:
        accept(path, manifest)
    return signer


def _open_trusted(path: Path, gpu_arch, accept, trust) -> LoadedBundle | None:
    """open_bundle through the verified private copy of its library; None when there is none."""
    # header, schema and field formats; the values from the memo where an earlier open kept
    # them (the manifest's bytes read and checked against the header's hash otherwise)
    manifest = read_manifest(path, manifest_memo.MEMO)
    signer = check_manifest(path, manifest, gpu_arch, accept, trust)
    check_entries(path, manifest, installed_key_class, derive_keys=False)
    slot = (manifest.library["sha256"], str(settings.cache_dir()))
    with _loaded_lock:
        loaded = _loaded.get(slot)
        if loaded is not None:
            check_dynamic(path, manifest, loaded[2])  # this manifest's entries are all exported
        else:
            copy = library_store.store().verified_copy(slot[0])
            if copy is None:
                return None
            fd, where, facts = copy
            try:
                dynamic = _dynamic_from_json(facts["dynamic"])
                check_dynamic(path, manifest, dynamic)
                _import_tvm_ffi(path)
                check_dependencies(path, dynamic)
                loaded = _loaded[slot] = (_dlopen_descriptor(path, fd), where, dynamic, fd)
            except BaseException:
                os.close(fd)
                raise
    module, where, _, fd = loaded
    return LoadedBundle(
        path, manifest, where, module, manifest.entry_by_id(), signer, installed_key_class, fd
    )


def _dynamic_to_json(info: DynamicInfo) -> dict:
    return {
        "machine": info.machine,
        "needed": list(info.needed),
        "soname": info.soname,
        "rpath": info.rpath,
        "runpath": info.runpath,
        "functions": sorted(info.functions),
        "versions": {name: list(versions) for name, versions in info.versions.items()},
    }


def _dynamic_from_json(data: dict) -> DynamicInfo:
    return DynamicInfo(
        machine=str(data["machine"]),
        needed=tuple(map(str, data["needed"])),
        soname=data["soname"],
        rpath=data["rpath"],
        runpath=data["runpath"],
        functions=frozenset(map(str, data["functions"])),
        versions={str(k): tuple(map(str, v)) for k, v in data["versions"].items()},
    )


# -- loading -------------------------------------------------------------------------------------
def _dlopen_descriptor(path: Path, fd: int):
    """dlopen through /proc/self/fd/N: the file we verified, whatever its name points to now.

    tvm_ffi.load_module picks a loader by file extension, which a descriptor path lacks, so the
    shared-library loader it would pick is called directly, then kept alive as load_module does.
    """
    tvm_ffi = _import_tvm_ffi(path)
    load = tvm_ffi.get_global_func("ffi.Module.load_from_file.so", allow_missing=True)
    if load is None:
        raise IncompatibleBundleError(path, "this apache-tvm-ffi has no shared-library loader")
    try:
        module = load(f"/proc/self/fd/{fd}", "so")
    except RuntimeError as exc:  # the dynamic loader refused it after all: say which bundle
        raise IncompatibleBundleError(path, f"dlopen failed: {exc}") from None
    tvm_ffi.get_global_func("ffi.ModuleGlobalsAdd")(module)
    return module


def _load_library(path: Path, library: bytes, sha256: str, dynamic: DynamicInfo):
    """Load the verified library once per process and cache dir; returns its _loaded row."""
    slot = (sha256, str(settings.cache_dir()))
    with _loaded_lock:
        if slot not in _loaded:
            _loaded[slot] = _load_new_library(path, library, sha256, dynamic)
        return _loaded[slot]


def _load_new_library(path: Path, library: bytes, sha256: str, dynamic: DynamicInfo):
    """On success the descriptor stays open for the life of the process: glibc recognises an
    already-loaded library by the name it was opened with, and a reused /proc/self/fd/N would
    hand back another library. One descriptor per distinct library (see _loaded)."""
    facts = {"sha256": sha256, "size": len(library), "dynamic": _dynamic_to_json(dynamic)}
    try:
        fd, where = library_store.store().keep(sha256, library, facts)
    except OSError as exc:  # unwritable, read-only, full, or others could write there
        fd, where = library_store.give_up_folder(exc).keep(sha256, library, facts)
    try:
        return _dlopen_descriptor(path, fd), where, dynamic, fd
    except BaseException:
        os.close(fd)
        raise


def _load_c_abi_module(path: Path, fd: int):
    """The DSL's module (cute.runtime.load_module) over the library already dlopened through
    descriptor `fd`: its C-ABI entries come back as the DSL's own JitCompiledFunction.

    The DSL's loader takes a file name ending in .so, so a private link to /proc/self/fd/N
    names the verified library; the dynamic loader recognises the file as loaded already and
    hands back that copy, so nothing is read from the cache dir again."""
    from cute_aot.artifacts.core.atomic import scratch_folder

    try:
        from cutlass.cute.runtime import load_module
    except ImportError as exc:
        raise IncompatibleBundleError(
            path, f"a C-ABI entry needs nvidia-cutlass-dsl: {exc}"
        ) from None
    if fd < 0:
        raise IncompatibleBundleError(path, "its library was not loaded through a descriptor")
    with scratch_folder("cute-aot-c-abi") as folder:
        name = os.path.join(folder, "library.so")
        os.symlink(f"/proc/self/fd/{fd}", name)
        return load_module(name)
