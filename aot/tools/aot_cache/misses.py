"""`aot-cache misses`: the miss log aggregated per key, ready for aot-build."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.text import Text

from cute_aot.aot.tools.aot_cache.facts.inventory import (
    aggregate_misses,
    describe_key,
    order_problem,
    read_manifests,
)
from cute_aot.aot.tools.aot_cache.output import (
    emit_json,
    json_option,
    make_console,
    make_table,
    problem_words,
)
from cute_aot.aot.tools.aot_cache.params import (
    arch_param,
)
from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.artifacts.core.urls import local_path
from cute_aot.artifacts.miss_log import read_misses
from cute_aot.runtime import misses as miss_log


@click.command("misses")
@click.option(
    "--log",
    "log_path",
    metavar="LOG",
    help="Miss log: a file, a folder or a URL prefix (s3://bucket/misses/) of every server's "
    f"(default: {settings.MISS_LOG.name}, else <cache dir>/misses.jsonl).",
)
@click.option("--family", "family_name", help="Only this family.")
@click.option("--arch", callback=arch_param, help="Only this architecture.")
@click.option(
    "--bundle",
    "bundle_paths",
    multiple=True,
    help=f"Say which keys these bundles now hold (default: {settings.BUNDLES.name}).",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write one JSON line per key: input for aot-build --from-misses.",
)
@click.option("--not-in-bundles", is_flag=True, help="Leave out keys the bundles already hold.")
@json_option
def misses_command(log_path, family_name, arch, bundle_paths, out_path, not_in_bundles, as_json):
    """Aggregated miss log: count and hosts per key, first and last seen, ready for aot-build
    --from-misses."""
    log_path = log_path or miss_log.miss_log_path()
    local = local_path(log_path)
    records = read_misses(log_path) if local is None or local.exists() else []
    records = [
        r
        for r in records
        if (not family_name or r["family"] == family_name) and (not arch or r["arch"] == arch)
    ]
    rows = aggregate_misses(records)
    held = {
        (manifest.arch, entry.family, entry.key_id)
        for _, _, manifest in read_manifests(bundle_paths)
        if not isinstance(manifest, str)
        for entry in manifest.entries
    }
    for row in rows:
        row["in_bundles"] = (row["arch"], row["family"], row["key_id"]) in held
    if not_in_bundles:
        rows = [row for row in rows if not row["in_bundles"]]
    if out_path:
        atomic_write(out_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())
    hosts = sorted({host for row in rows for host in row["hosts"]})
    if as_json:
        out = str(out_path) if out_path else None
        counts = {"records": len(records), "hosts": hosts}
        emit_json({"log": str(log_path), **counts, "keys": rows, "out": out})
        return
    console = make_console()
    if not rows:
        console.print(f"No misses recorded in {log_path}.")
        return
    table = make_table(
        f"{log_path}: {len(records)} misses of {len(rows)} keys on {len(hosts)} hosts",
        *("count", "hosts", "arch", "key id", "key"),
        *("first seen", "last seen", "problems", "in bundles"),
        right=("count", "hosts"),
    )
    for row in rows:
        problems = [problem_words(order_problem(row["family"], p)) for p in row["problems"]]
        shown = "\n".join(problems[:4]) + ("\n..." if len(problems) > 4 else "")
        held_text = Text("yes", style="green") if row["in_bundles"] else Text("no", style="yellow")
        key = f"{row['family']}: {describe_key(row['family'], row['key'])}"
        table.add_row(
            str(row["count"]),
            str(len(row["hosts"])),
            row["arch"],
            str(row["key_id"]),
            key,
            row["first_seen"],
            row["last_seen"],
            shown,
            held_text,
        )
    console.print(table)
    console.print(f"build them: aot-build --from-misses {out_path or log_path}")
