"""What is installed and shipped, as plain data (JSON-ready): the facts behind `aot-cache`.

Bundle summaries and entries (read from manifests only), differences between two bundles, the
aggregated miss log and this machine's environment. Presentation lives in cli.
"""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path

from cute_aot.aot import binary_info
from cute_aot.aot.tools.aot_cache.facts import check, gc
from cute_aot.artifacts import PACKAGE_VERSION, toolchain
from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.core import cache_layout, settings
from cute_aot.artifacts.core.errors import (
    BundleError,
    BundleIntegrityError,
    CuteAotError,
    EntryNotFoundError,
)
from cute_aot.artifacts.core.urls import is_url
from cute_aot.artifacts.fatbin import find_fatbin, iter_fatbins
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.kernels import families
from cute_aot.runtime import misses as miss_log
from cute_aot.runtime import paths, sources
from cute_aot.runtime.installed_bundles import installed_bundles
from cute_aot.runtime.jit import jit_available
from cute_aot.runtime.mode import current_mode
from cute_aot.runtime.registry import stale_reasons

# (bundle path, whether it came from a folder, its manifest or why it could not be read)
BundleSource = tuple["Path | check.UnreadableSource", bool, "Manifest | str"]

# Every CUTE_AOT_* setting (artifacts/core/settings.py), then the others that change what runs
ENV_VARS = (
    *(setting.name for setting in settings.SETTINGS),
    "CUTE_DSL_ARCH",
    "CUDA_VISIBLE_DEVICES",
    "XDG_CACHE_HOME",
)


def bundle_sources(given: tuple[str, ...]) -> list[tuple[Path | check.UnreadableSource, str, bool]]:
    """(bundle file, where it was named, came from a folder), in the runtime's search order
    (runtime/sources.py): explicit paths, file:// or store URLs (fetched as a server fetches
    them), else what a server loads unasked: CUTE_AOT_BUNDLES, then installed bundle wheels
    (named `wheel <distribution>==<version>`). A URL that cannot be fetched now is an
    UnreadableSource (check.readable raises its reason)."""
    if given:
        named = [(source, "argument") for source in given]
    else:
        explicit = set(settings.bundle_sources())
        wheels = {str(found.folder): found.origin for found in installed_bundles()}
        named = [
            (
                source,
                settings.BUNDLES.name if source in explicit else wheels.get(source, "installed"),
            )
            for source in sources.environment_sources()
        ]
    found = []
    for source, origin in named:
        try:
            roots = sources.local_paths(source)  # the runtime's reader: paths, file://, URLs
        except OSError as exc:  # a URL that cannot be fetched now: listed, with the reason
            found.append((check.UnreadableSource(source, exc.strerror or str(exc)), origin, False))
            continue
        for root in roots:
            if root.is_dir():
                found += [(path, origin, True) for path in paths.expand_bundle_paths([root])]
            else:
                found.append((root, origin, False))
    return found


def no_bundles_found(given: tuple[str, ...], example: str) -> str:
    """One line for when bundle_sources found nothing: where it looked, and how to name the
    folder (`example`, as the command takes it): else a kernel just built reads as a JIT miss."""
    if given:
        where = f"in {', '.join(given)}"
    elif settings.BUNDLES.raw():
        where = f"in {settings.BUNDLES.name} ({settings.BUNDLES.raw()})"
    else:
        where = f"({settings.BUNDLES.name} is unset, no bundle wheel is installed, none was named)"
    return (
        f"no bundles found {where}: name the folder aot-build wrote ({example}) or set "
        f"{settings.BUNDLES.name}=bundles/, as a server would"
    )


def read_manifests(given: tuple[str, ...]) -> list[BundleSource]:
    """Each bundle of bundle_sources with its manifest, or why it cannot be read."""
    found = []
    for path, _, from_folder in bundle_sources(given):
        try:
            found.append((path, from_folder, read_manifest(check.readable(path))))
        except BundleError as exc:
            found.append((path, from_folder, str(exc)))
    return found


def entry_matching(path: Path, manifest: Manifest, wanted: str) -> Entry:
    """An entry by key id, symbol, or an unambiguous key-id prefix (4+ characters)."""
    matches = [e for e in manifest.entries if wanted in (e.key_id, e.symbol)]
    if not matches and len(wanted) >= 4:
        matches = [e for e in manifest.entries if e.key_id.startswith(wanted)]
    if len(matches) != 1:
        raise EntryNotFoundError(path, manifest.arch, wanted, [e.key_id for e in manifest.entries])
    return matches[0]


def key_text(key) -> str:
    """A key in words: its own describe() where the family gives one, else its fields."""
    describe = getattr(key, "describe", None)
    if callable(describe):
        return describe()
    return _fields_text(key.fields())


def _fields_text(fields: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(fields.items()) if k != "family")


def describe_key(family_name: str, fields: dict) -> str:
    """A manifest's or miss log's key fields in words (plain fields for unknown families)."""
    found = families().get(family_name)
    try:
        if found is not None:
            return key_text(found.Key.from_fields(fields))
    except (CuteAotError, ValueError, TypeError):  # fields of another version of the family
        pass
    return _fields_text(fields)


def order_problem(family_name: str, problem: dict) -> dict:
    """A recorded problem ({"k": 7168, "m": 2, ...}) in the order its family names the fields
    (a miss log stores them sorted); as recorded for a family this installation does not have."""
    found = families().get(family_name)
    if found is None:
        return problem
    try:  # describe_problem names the fields of a problem tuple; only their order is used here
        named = list(found.describe_problem(tuple(problem.values())))
    except Exception:  # a plug-in's refusal loses only the ordering, never the listing
        return problem
    order = sorted(problem, key=lambda name: named.index(name) if name in named else len(named))
    return {name: problem[name] for name in order}


def bundle_summary(path: Path, source: str) -> dict:
    row: dict = {"path": str(path), "source": source}
    try:
        manifest = read_manifest(check.readable(path))
    except BundleError as exc:
        return {**row, "status": "error", "error": str(exc)}
    stale = stale_reasons(manifest)
    counts: dict[str, int] = {}
    for entry in manifest.entries:
        counts[entry.family] = counts.get(entry.family, 0) + 1
    return {
        **row,
        "name": manifest.name,
        "arch": manifest.arch,
        "bundle_version": manifest.bundle_version,
        "created_by": manifest.created_by,
        "toolchain": manifest.toolchain,
        "families": {
            name: {**facts, "keys": counts.get(name, 0), "stale": stale.get(name)}
            for name, facts in manifest.families.items()
        },
        "keys": len(manifest.entries),
        "file_size": path.stat().st_size,
        "library_size": manifest.library.get("size"),
        "status": "stale" if stale else "ok",
    }


def entry_facts(entry: Entry) -> dict:
    """An entry as JSON: key described, fatbin facts, per-kernel resources and SASS classes."""
    binary = entry.gpu_binary or {}
    kernels = binary.get("kernels")
    if not binary_info.well_formed_kernels(kernels):
        kernels = None  # shown as not recorded rather than failing on a hand-edited manifest
    if kernels is not None:
        kernels = [
            {**k, "instruction_classes": binary_info.classify_opcodes(k["opcodes"])}
            if "opcodes" in k
            else dict(k)
            for k in kernels
        ]
    return {
        "family": entry.family,
        "key_id": entry.key_id,
        "symbol": entry.symbol,
        "describe": describe_key(entry.family, entry.key),
        "key": entry.key,
        "sha256": entry.sha256,
        "size": entry.size,
        "fatbin_sha256": binary.get("fatbin_sha256"),
        "fatbin_size": binary.get("fatbin_size"),
        "sm": binary.get("sm"),
        "kernels": kernels,  # None: not recorded (no cuobjdump at build time)
    }


def _binary_facts(entry: Entry) -> dict:
    binary = entry.gpu_binary or {}
    kernels = binary.get("kernels") or []
    return {
        "object sha256": entry.sha256,
        "object size": entry.size,
        "fatbin sha256": binary.get("fatbin_sha256"),
        "registers": [k.get("registers") for k in kernels] or None,
        "shared": [k.get("shared") for k in kernels] or None,
    }


def diff_manifests(a: Manifest, b: Manifest) -> dict:
    """Entries added, removed, changed (same key, other binary) from a to b; bundle facts."""
    left = {(e.family, e.key_id): e for e in a.entries}
    right = {(e.family, e.key_id): e for e in b.entries}

    def brief(entry: Entry) -> dict:
        return {
            "family": entry.family,
            "key_id": entry.key_id,
            "describe": describe_key(entry.family, entry.key),
        }

    changed = []
    for slot in sorted(left.keys() & right.keys()):
        before, after = _binary_facts(left[slot]), _binary_facts(right[slot])
        changes = {
            name: [before[name], after[name]]
            for name in before
            # a fact one side does not record (older build, no cuobjdump) is no change
            if None not in (before[name], after[name]) and before[name] != after[name]
        }
        if changes:
            changed.append({**brief(right[slot]), "changes": changes})
    facts = ("name", "arch", "bundle_version", "created_by", "toolchain")
    bundle = {f: [getattr(a, f), getattr(b, f)] for f in facts if getattr(a, f) != getattr(b, f)}
    without_tables = [
        {name: {k: v for k, v in f.items() if k != "table"} for name, f in m.families.items()}
        for m in (a, b)
    ]
    if without_tables[0] != without_tables[1]:
        bundle["families"] = without_tables
    return {
        "bundle": bundle,
        "tables": diff_tables(a, b),
        "added": [brief(right[s]) for s in sorted(right.keys() - left.keys())],
        "removed": [brief(left[s]) for s in sorted(left.keys() - right.keys())],
        "changed": changed,
        "unchanged": len(left.keys() & right.keys()) - len(changed),
    }


def diff_tables(a: Manifest, b: Manifest) -> dict:
    """family -> how its dispatch table differs from a to b (families whose tables differ):
    digests, provenance, and the rows of each list of rows that only one side has."""
    result = {}
    for name in sorted(set(a.families) | set(b.families)):
        left = a.families.get(name, {}).get("table")
        right = b.families.get(name, {}).get("table")
        if left == right or (left or {}).get("digest") == (right or {}).get("digest") is not None:
            continue
        rows: dict[str, dict] = {}
        left_data, right_data = (left or {}).get("data", {}), (right or {}).get("data", {})
        for field in sorted(set(left_data) | set(right_data)):
            old, new = left_data.get(field), right_data.get(field)
            if old == new:
                continue
            if isinstance(old, list) or isinstance(new, list):
                old_rows = [json.dumps(r, sort_keys=True) for r in old or []]
                new_rows = [json.dumps(r, sort_keys=True) for r in new or []]
                rows[field] = {
                    "added": [json.loads(r) for r in new_rows if r not in old_rows],
                    "removed": [json.loads(r) for r in old_rows if r not in new_rows],
                }
            else:
                rows[field] = {"a": old, "b": new}
        result[name] = {
            "digest": [(left or {}).get("digest"), (right or {}).get("digest")],
            "provenance": [(left or {}).get("provenance"), (right or {}).get("provenance")],
            "fields": rows,
        }
    return result


def aggregate_misses(records: list[dict]) -> list[dict]:
    """One row per (arch, family, key): count, the hosts, first/last seen, the problems that hit
    it. A record's host is its own field (records written before there was one have none)."""
    rows: dict[tuple, dict] = {}
    for record in records:
        slot = (record["arch"], record["family"], json.dumps(record["key"], sort_keys=True))
        seen = str(record.get("time") or "")
        row = rows.setdefault(
            slot,
            {
                "family": record["family"],
                "arch": record["arch"],
                "key_id": record.get("key_id"),
                "key": record["key"],
                "count": 0,
                "hosts": [],
                "first_seen": seen,
                "last_seen": seen,
                "problems": [],
            },
        )
        row["count"] += 1
        if record.get("host") and record["host"] not in row["hosts"]:
            row["hosts"].append(record["host"])
        row["first_seen"] = min(row["first_seen"], seen)
        row["last_seen"] = max(row["last_seen"], seen)
        problem = record.get("problem")
        if problem and problem not in row["problems"]:
            row["problems"].append(problem)
    for row in rows.values():
        row["hosts"].sort()
    return sorted(
        rows.values(), key=lambda r: (-r["count"], r["arch"], r["family"], str(r["key_id"]))
    )


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _folder_usage(folder: Path, pattern: str) -> dict:
    files = [p for p in folder.rglob(pattern) if p.is_file()] if folder.is_dir() else []
    return {"path": str(folder), "files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def environment() -> dict:
    tools = {}
    for name in binary_info.TOOL_DISTRIBUTIONS:
        found = binary_info.find_tool(name)
        tools[name] = {"path": found, "version": binary_info.tool_version(found) if found else None}
    driver = check.driver_cuda_version()
    log = miss_log.miss_log_path()
    return {
        "versions": {
            "cute-aot": PACKAGE_VERSION,
            "python": platform.python_version(),
            **toolchain.cutlass_dsl_versions(),
            toolchain.TVM_FFI_DIST: toolchain.tvm_ffi_version(),
            "torch": _dist_version("torch"),
            toolchain.CUDA_RUNTIME_DIST: _dist_version(toolchain.CUDA_RUNTIME_DIST),
        },
        "tools": tools,
        "paths": {
            "cache_dir": str(settings.cache_dir()),
            **{
                area.name: _folder_usage(settings.cache_dir() / area.folder, area.listed)
                for area in cache_layout.AREAS
                if area.label
            },
            # A URL prefix is not looked at: `env` never waits on a store (None: not known).
            "miss_log": {"path": str(log), "exists": None if is_url(log) else log.exists()},
            "bundles": [str(path) for path, _, _ in bundle_sources(())],
        },
        "env": {name: settings.environment([name]).get(name) for name in ENV_VARS},
        "gpu": check.local_gpu(),
        "driver_cuda": ".".join(map(str, driver)) if driver else None,
        "mode": current_mode().value,
        "mode_source": settings.MODE.name if settings.MODE.raw() else "default",
        "jit_available": jit_available(),
        "overlay_fingerprints": gc.current_fingerprints(),
        "startup_hook": _startup_hook(),
    }


def _startup_hook() -> dict:
    """Whether processes started in this environment get the cute.compile hook, and why."""
    from cute_aot.runtime.capture import activation

    active, why = activation.state()
    return {"installed_at": activation.startup_file(), "active": active, "why": why}


def entry_fatbin(path: Path, manifest: Manifest, library: bytes, entry: Entry) -> bytes:
    """One entry's fatbin: found by its recorded sha256, else the only one of a one-kernel
    bundle (overlay entries record no hash)."""
    recorded = (entry.gpu_binary or {}).get("fatbin_sha256")
    if recorded:
        fatbin = find_fatbin(library, recorded)
        if fatbin is None:
            raise BundleIntegrityError(
                path,
                f"{manifest.arch} key {entry.key_id}: fatbin {recorded[:16]} is not in the library",
            )
        return fatbin
    fatbins = [fatbin for _, fatbin in iter_fatbins(library)]
    if len(fatbins) == 1 and len(manifest.entries) == 1:
        return fatbins[0]
    raise BundleError(
        path,
        f"{manifest.arch} key {entry.key_id}: no fatbin sha256 recorded and the library holds "
        f"{len(fatbins)} fatbins; rebuild the bundle with this cute-aot to read its SASS",
    )


def _resources_note(entries: list[dict]) -> str | None:
    without = [e for e in entries if e["kernels"] is None]
    if not without:
        return None
    return (
        f"{len(without)} of {len(entries)} entries record no resources: cuobjdump "
        f"({binary_info.TOOL_DISTRIBUTIONS['cuobjdump']}) was not available when they were built "
        "(JIT results in the overlay never record them)."
    )


def bundle_report(bundle: Path, family_name: str | None = None, key: str | None = None) -> dict:
    """A bundle's facts and its entries (all, one family's, or the one matching `key`)."""
    manifest = read_manifest(check.readable(bundle))
    entries = list(manifest.entries)
    if family_name:
        entries = [e for e in entries if e.family == family_name]
        if not entries:
            families = sorted(manifest.families)
            raise EntryNotFoundError(bundle, manifest.arch, f"family {family_name}", families)
    if key:
        entries = [entry_matching(bundle, manifest, key)]
    facts = sorted((entry_facts(e) for e in entries), key=lambda e: (e["family"], e["describe"]))
    return {
        "path": str(bundle),
        "name": manifest.name,
        "arch": manifest.arch,
        "bundle_version": manifest.bundle_version,
        "created_by": manifest.created_by,
        "format_version": manifest.format_version,
        "toolchain": manifest.toolchain,
        "families": manifest.families,
        "stale": stale_reasons(manifest),
        "library": manifest.library,
        "payload": manifest.payload,
        "file_size": bundle.stat().st_size,
        "entries": facts,
        "note": _resources_note(facts),
    }
