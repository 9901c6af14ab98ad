"""Turn compiled objects of one architecture into a bundle: link, describe, encode.

What a bundle says of its families is given (kernels.bundle_facts): the packer knows formats,
not families, so a server's JIT packs a miss without importing the build."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cute_aot.artifacts import PACKAGE_VERSION, toolchain
from cute_aot.artifacts.bundle_writer import encode_bundle
from cute_aot.artifacts.link import link_library
from cute_aot.artifacts.manifest import Entry, Manifest


def pack_bundle(
    name: str,
    arch: str,
    objects: dict,
    families: dict[str, dict],
    bundle_version: str = PACKAGE_VERSION,
    sign: Callable[[Manifest], Manifest] | None = None,
) -> tuple[Manifest, bytes]:
    """objects: key -> {"object": path, "sha256": str, "size": int}; families: family -> the
    facts the manifest records of it (kernels.bundle_facts). Returns (manifest, bytes).
    `sign`: signs the finished manifest (the JIT overlay signs its entries with a local key).

    Keys are linked in symbol order, so the same objects always give the same bytes.
    """
    keys = sorted(objects, key=lambda key: key.symbol)
    library = link_library(
        [Path(objects[key]["object"]) for key in keys],
        c_abi_symbols=[key.symbol for key in keys if key.abi == "c"],
    )
    entries = tuple(
        Entry(
            family=key.FAMILY,
            key=key.fields(),
            key_id=key.id,
            symbol=key.symbol,
            sha256=objects[key]["sha256"],
            size=objects[key]["size"],
            gpu_binary=objects[key].get("gpu_binary"),
            abi=key.abi,
        )
        for key in keys
    )
    missing = {key.FAMILY for key in keys} - set(families)
    if missing:
        raise ValueError(f"bundle {name!r} for {arch}: no facts given for {sorted(missing)}")
    manifest = Manifest(
        name=name,
        arch=arch,
        bundle_version=bundle_version,
        created_by=f"cute-aot {PACKAGE_VERSION}",
        toolchain=toolchain.fingerprint(),
        families={family: families[family] for family in sorted(families)},
        library={},
        payload={},
        entries=entries,
    )
    return encode_bundle(manifest, library, sign)
