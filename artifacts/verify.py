"""What a bundle must prove about its entries and its library before anything is loaded.

read_bundle already vouches for the bytes (hashes, sizes, field formats). These checks vouch for
the meaning: every entry's key re-derives its id and symbol (so a key can never be served by a
kernel built for another key), every entry's function is exported by the library, and the library
asks the loader for nothing beyond what we allow (no other libraries, no baked-in search paths).

The bundle format sits below the kernel families: which key class a family uses is asked of the
caller (`key_class`), never imported from cute_aot.kernels here.
"""

from __future__ import annotations

import functools
import platform
import typing
from collections.abc import Callable
from pathlib import Path

from cute_aot.artifacts.core.errors import (
    BundleFormatError,
    BundleIntegrityError,
    ElfError,
    IncompatibleBundleError,
)
from cute_aot.artifacts.elf import DynamicInfo, read_dynamic
from cute_aot.artifacts.manifest import Entry, Manifest

# family name -> its key class, or None for a family this installation does not have.
KeyClassLookup = Callable[[str], type | None]

# The exported TVM-FFI entry point of a function named `symbol` (export_to_c's naming).
TVM_FFI_EXPORT_PREFIX = "__tvm_ffi_"
# A C-ABI export (`export_to_c(..., function_prefix=symbol)`) names its functions `<symbol>_...`;
# this one loads the kernels' module, so every such export with a kernel has it.
C_ABI_EXPORT_SUFFIX = "_cuda_load"


def exported_function(entry: Entry) -> str:
    """The function the library must export for `entry` (the entry point, by its ABI)."""
    if entry.abi == "c":
        return entry.symbol + C_ABI_EXPORT_SUFFIX
    return TVM_FFI_EXPORT_PREFIX + entry.symbol


# The only libraries a bundle's library may need: tvm-ffi (the server has loaded it already) and
# the C runtime. The CUDA runtime is linked in statically, so a library that needs a shared one
# (or anything else) was not built by aot-build and is refused.
ALLOWED_NEEDED = frozenset(
    {
        "libtvm_ffi.so",
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
    }
)


def host_machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def check_entries(
    path: Path, manifest: Manifest, key_class: KeyClassLookup, derive_keys: bool = True
) -> None:
    """Every entry's key is a well-formed key of a listed family that re-derives id and symbol.

    key_class(family) gives the installed family's key class (`cute_aot.kernels.family(name).Key`)
    or None when the family is not installed: such entries are checked for form only, since they
    are never served (the registry's staleness check refuses unknown families). Required, so that
    no caller skips the re-derivation by forgetting it. derive_keys=False leaves the
    re-derivation to the caller, entry by entry, before it serves one (check_entry_key): a
    1000-kernel bundle then opens without deriving 1000 ids.
    """
    key_ids = set()
    for index, entry in enumerate(manifest.entries):
        what = f"entry {index} ({entry.family} key {entry.key_id})"
        if entry.key_id in key_ids:
            raise BundleFormatError(path, f"{what}: key id listed twice")
        key_ids.add(entry.key_id)
        if entry.key.get("family") != entry.family:
            raise BundleIntegrityError(path, f"{what}: key says family {entry.key.get('family')!r}")
        # The registry checks each family's version and source hash: an entry of an unlisted
        # family would skip that check.
        if entry.family not in manifest.families:
            raise BundleFormatError(path, f"{what}: family not listed in the manifest's families")
        cls = key_class(entry.family)
        if cls is not None and derive_keys:
            _check_key(path, what, entry, cls)


def check_entry_key(path: Path, entry: Entry, key_class: type, derived=None) -> None:
    """One entry's key re-derives its id and symbol (check_entries with derive_keys=False).
    `derived`: the caller's key for this entry, if it has one: where its fields are the
    entry's, its id (worked out already, for a served call) is what is checked."""
    _check_key(path, f"{entry.family} key {entry.key_id}", entry, key_class, derived)


@functools.cache
def _field_types(key_class) -> dict[str, type]:
    return typing.get_type_hints(key_class)


def _check_key(path: Path, what: str, entry: Entry, key_class, derived=None) -> None:
    hints = _field_types(key_class)
    for name, value in entry.key.items():
        kind = hints.get(name)
        if kind in (str, int, bool) and (
            not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        ):
            raise BundleIntegrityError(path, f"{what}: key field {name!r} must be {kind.__name__}")
    if type(derived) is key_class and derived.fields() == entry.key:
        key = derived
    else:
        key = _key_of(path, what, entry, key_class)
    if key.id != entry.key_id:
        raise BundleIntegrityError(path, f"{what}: the key's canonical JSON gives id {key.id}")
    if key.symbol != entry.symbol:
        raise BundleIntegrityError(
            path, f"{what}: symbol {entry.symbol!r}, the key's symbol is {key.symbol!r}"
        )
    if key.abi != entry.abi:
        raise BundleIntegrityError(path, f"{what}: abi {entry.abi!r}, the key's is {key.abi!r}")


def _key_of(path: Path, what: str, entry: Entry, key_class):
    try:
        return key_class.from_fields(entry.key)
    except (TypeError, ValueError) as exc:
        raise BundleIntegrityError(
            path, f"{what}: not a valid {entry.family} key ({exc})"
        ) from None


def check_library(path: Path, manifest: Manifest, library: bytes) -> DynamicInfo:
    """The library is a shared library for this CPU that exports every entry and needs only
    allowed libraries, found by name (no RPATH/RUNPATH that could point anywhere)."""
    try:
        info = read_dynamic(library)
    except ElfError as exc:
        raise BundleIntegrityError(path, f"library is not a usable shared library: {exc}") from None
    return check_dynamic(path, manifest, info)


def check_dynamic(path: Path, manifest: Manifest, info: DynamicInfo) -> DynamicInfo:
    """check_library on the library's dynamic-linking facts, read earlier (the loader keeps them
    next to a library it verified when it extracted it)."""
    if info.machine != host_machine():
        raise IncompatibleBundleError(
            path, f"library is built for {info.machine} CPUs, this machine is {host_machine()}"
        )
    for tag, value in (("RPATH", info.rpath), ("RUNPATH", info.runpath)):
        if value is not None:
            raise BundleIntegrityError(path, f"library carries a {tag} ({value!r}); not allowed")
    for name in info.needed:
        if name not in ALLOWED_NEEDED:
            raise BundleIntegrityError(
                path,
                f"library needs {name!r}, which a bundle library must not "
                f"(allowed: {', '.join(sorted(ALLOWED_NEEDED))})",
            )
    for entry in manifest.entries:
        if exported_function(entry) not in info.functions:
            raise BundleIntegrityError(
                path,
                f"{entry.family} key {entry.key_id}: the library does not export "
                f"{exported_function(entry)} (missing entry)",
            )
    return info
