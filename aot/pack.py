"""Turn compiled objects of one architecture into a bundle: link, describe, encode."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from cute_aot.aot.link import link_library
from cute_aot.artifacts import PACKAGE_VERSION, toolchain
from cute_aot.artifacts.bundle import encode_bundle
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.kernels import family_facts


def pack_bundle(
    name: str,
    arch: str,
    objects: dict,
    bundle_version: str = PACKAGE_VERSION,
    sign: Callable[[Manifest], Manifest] | None = None,
) -> tuple[Manifest, bytes]:
    """objects: key -> {"object": path, "sha256": str, "size": int}. Returns (manifest, bytes).
    `sign`: signs the finished manifest (the JIT overlay signs its entries with a local key).

    Keys are linked in symbol order, so the same objects always give the same bytes.
    """
    keys = sorted(objects, key=lambda key: key.symbol)
    with tempfile.TemporaryDirectory(prefix="cute-aot-pack-") as scratch:
        library = link_library(
            [Path(objects[key]["object"]) for key in keys], Path(scratch) / "library.so"
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
        )
        for key in keys
    )
    families = {name_: family_facts(name_) for name_ in sorted({key.FAMILY for key in keys})}
    manifest = Manifest(
        name=name,
        arch=arch,
        bundle_version=bundle_version,
        created_by=f"cute-aot {PACKAGE_VERSION}",
        toolchain=toolchain.fingerprint(),
        families=families,
        library={},
        payload={},
        entries=entries,
    )
    return encode_bundle(manifest, library, sign)
