"""Turn compiled objects of one architecture into a bundle: link, describe, encode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cute_aot.aot.link import link_library
from cute_aot.artifacts import PACKAGE_VERSION, toolchain
from cute_aot.artifacts.bundle_writer import encode_bundle
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.kernels import family, family_facts
from cute_aot.kernels.tables import Table

BuildTables = dict[tuple[str, str], Table]  # (family, arch) -> the table keys were enumerated with


def table_records(names, arch: str, tables: BuildTables | None) -> dict[str, dict]:
    """family -> the record of the table its keys for `arch` were enumerated with."""
    records = {}
    for name in sorted(names):
        table = (tables or {}).get((name, arch)) or family(name).default_table(arch)
        if table is not None:
            records[name] = table.record()
    return records


def pack_bundle(
    name: str,
    arch: str,
    objects: dict,
    bundle_version: str = PACKAGE_VERSION,
    sign: Callable[[Manifest], Manifest] | None = None,
    tables: dict[str, dict] | None = None,
) -> tuple[Manifest, bytes]:
    """objects: key -> {"object": path, "sha256": str, "size": int}. Returns (manifest, bytes).
    `sign`: signs the finished manifest (the JIT overlay signs its entries with a local key).
    `tables`: family -> record of the dispatch table the keys were enumerated with (see
    table_records), recorded next to the family's facts; None: the packages' own.

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
    families = {name_: family_facts(name_) for name_ in sorted({key.FAMILY for key in keys})}
    records = table_records(families, arch, None) if tables is None else tables
    for name_, record in records.items():
        families[name_]["table"] = record
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
