"""`aot-cache gc`: prune the caches, safely while servers and builds use them."""

from __future__ import annotations

from pathlib import Path

import click

from cute_aot.aot.tools.aot_cache.facts import gc
from cute_aot.aot.tools.aot_cache.output import (
    age_text,
    emit_json,
    json_option,
    make_console,
    make_table,
    size_text,
)
from cute_aot.aot.tools.aot_cache.params import (
    age_param,
    size_param,
)
from cute_aot.artifacts.core import settings


@click.command("gc")
@click.option(
    "--older-than",
    callback=age_param,
    help="Remove units not used for longer than this (e.g. 7d, 12h, 30m). Last use: the newest "
    "atime or mtime of a unit's files.",
)
@click.option(
    "--max-size",
    callback=size_param,
    help="Then remove the least recently used units until the chosen caches hold at most this "
    "(e.g. 500M, 2G).",
)
@click.option(
    "--cache",
    "caches",
    type=click.Choice(gc.CACHES),
    multiple=True,
    help="Only this cache (repeatable; default: all five, and temporaries elsewhere in the "
    "cache dir).",
)
@click.option(
    "--build-cache",
    "build_root",
    type=click.Path(file_okay=False, path_type=Path),
    help="The build cache's root, if builds use aot-build --cache-dir "
    "(default: build/ in the cache dir).",
)
@click.option(
    "--stale",
    is_flag=True,
    help="Also remove overlay entries this installation cannot use (other toolchain or kernel "
    "sources); mind hosts with another toolchain that share the cache.",
)
@click.option(
    "--grace",
    type=float,
    default=gc.GRACE_S,
    show_default=True,
    help="Never remove units used less than this many seconds ago.",
)
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("-v", "--verbose", is_flag=True, help="List every unit removed.")
@json_option
def gc_command(older_than, max_size, caches, build_root, stale, grace, dry_run, verbose, as_json):
    """Prune the overlay, the unpacked libraries, the build cache and the downloads of bundles
    at URLs (remote/), safely while servers and builds use them.

    A unit (an overlay entry; a library and its verified facts; a build object or bundle and its
    record; a download; a URL's index) goes whole, its commit marker first, so readers see an
    entry or a miss. Last use is the newest atime or mtime of its files: with relatime, atime is
    updated at least daily, which is enough for ages in days. Links are never followed; nothing
    used within --grace goes. Refused overlay entries always go; temporaries, downloads no index
    names and indexes whose downloads are gone go once an hour unused: without options, nothing
    else does.
    """
    caches = caches or gc.CACHES
    remove, keep = gc.plan(max_size, older_than, stale, grace, caches=caches, build_root=build_root)
    removed = remove if dry_run else gc.remove_files(remove)
    # Planned but not removed: used or replaced since, or removed by someone else first.
    skipped = [unit for unit in remove if unit not in removed]
    roots = gc.cache_roots(caches, build_root)
    result = {
        "cache_dir": str(settings.cache_dir()),
        "dry_run": dry_run,
        "caches": gc.summary(removed, keep, roots),
        "removed": [_unit_json(unit) for unit in removed],
        "skipped": len(skipped),
        "kept": len(keep),
        "bytes_removed": sum(unit.size for unit in removed),
        "bytes_kept": sum(unit.size for unit in keep),
    }
    if as_json:
        emit_json(result)
    else:
        _print_gc(result, removed, list_units=dry_run or verbose)


def _unit_json(unit: gc.CacheUnit) -> dict:
    return {
        "cache": unit.cache,
        "kind": unit.kind,
        "path": str(unit.path),
        "files": [str(path) for path in unit.paths],
        "size": unit.size,
        "age_s": unit.age_s,
        "reason": unit.reason,
    }


def _print_gc(result: dict, removed: list[gc.CacheUnit], list_units: bool) -> None:
    console = make_console()
    verb = "would remove" if result["dry_run"] else "removed"
    if list_units and removed:
        units = make_table(
            f"{verb}, least recently used first",
            *("cache", "unit", "size", "last use", "reason"),
            right=("size", "last use"),
        )
        for unit in removed:
            files = "\n".join(str(path) for path in unit.paths)
            units.add_row(
                unit.cache,
                f"{unit.kind}: {files}",
                size_text(unit.size),
                f"{age_text(unit.age_s)} ago",
                unit.reason,
            )
        console.print(units)
    table = make_table(
        f"aot-cache gc{' (dry run)' if result['dry_run'] else ''} in {result['cache_dir']}",
        *("cache", "root", verb, "freed", "kept", "size kept"),
        right=(verb, "freed", "kept", "size kept"),
    )
    for name, row in result["caches"].items():
        table.add_row(
            name,
            row["root"],
            str(row["removed"]),
            size_text(row["bytes_removed"]),
            str(row["kept"]),
            size_text(row["bytes_kept"]),
        )
    console.print(table)
    console.print(
        f"{verb} {len(removed)} unit(s), {size_text(result['bytes_removed'])}; kept "
        f"{result['kept']}, {size_text(result['bytes_kept'])}"
        + (
            f"; left {result['skipped']} alone (used, replaced or removed by another process "
            "since planned)"
            if result["skipped"]
            else ""
        )
    )
