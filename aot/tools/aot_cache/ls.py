"""`aot-cache ls`: the bundles found and where from, and the overlay cache."""

from __future__ import annotations

import sys
import time

import click
from rich.text import Text

from cute_aot.aot.tools.aot_cache.facts import gc
from cute_aot.aot.tools.aot_cache.facts.inventory import (
    bundle_sources,
    bundle_summary,
    no_bundles_found,
)
from cute_aot.aot.tools.aot_cache.output import (
    age_text,
    emit_json,
    json_option,
    make_console,
    make_table,
    size_text,
    toolchain_text,
)
from cute_aot.runtime import overlay


@click.command("ls")
@click.argument("bundle_paths", metavar="[PATHS]...", nargs=-1)
@click.option("--no-overlay", is_flag=True, help="Leave out the overlay cache.")
@json_option
def ls_command(bundle_paths, no_overlay, as_json):
    """Bundles found and where from: architecture, families, key counts, sizes, toolchain.

    PATHS are bundle files or folders (default: every bundle a server would load, in its order:
    CUTE_AOT_BUNDLES, then installed bundle wheels); the overlay cache of JIT results follows.
    Finding no bundle is said in one line; an empty list is an answer (exit status 0), unlike
    `verify`'s check of nothing. Exit status 1 if a bundle cannot be read.
    """
    rows = [bundle_summary(path, source) for path, source, _ in bundle_sources(bundle_paths)]
    if not rows:  # on stderr: --json output stays parseable
        click.echo(
            f"aot-cache: {no_bundles_found(bundle_paths, 'aot-cache ls bundles/')}", err=True
        )
    overlay_rows = [] if no_overlay else gc.overlay_summary()
    if as_json:
        root = str(overlay.overlay_root())
        emit_json({"bundles": rows, "overlay": overlay_rows, "overlay_root": root})
    else:
        _print_ls(rows, overlay_rows)
    failed = [row for row in rows if row["status"] == "error"]
    for row in failed:  # the one-line error every other command gives, on stderr
        click.echo(f"aot-cache: {row['error']}", err=True)
    if failed:
        sys.exit(1)


def _print_ls(rows: list[dict], overlay_rows: list[dict]) -> None:
    console = make_console()
    if not rows and not overlay_rows:  # ls_command said that no bundle was found
        console.print(f"The overlay cache ({overlay.overlay_root()}) is empty.")
        return
    columns = ("bundle", "origin", "arch", "families", "keys", "size", "toolchain", "created by")
    table = make_table("cute-aot bundles", *columns, "status", right=("keys", "size"))
    for row in rows:
        if row["status"] == "error":
            table.add_row(row["path"], row["source"], *[""] * 6, Text(row["error"], style="red"))
            continue
        status = Text("ok", style="green")
        if row["status"] == "stale":
            reasons = [f"{n}: {f['stale']}" for n, f in row["families"].items() if f["stale"]]
            status = Text("stale (" + "; ".join(reasons) + ")", style="yellow")
        table.add_row(
            f"{row['path']}\n{row['name']} {row['bundle_version']}",
            row["source"],
            row["arch"],
            "\n".join(f"{n} v{f.get('version')}" for n, f in row["families"].items()),
            str(row["keys"]),
            size_text(row["file_size"]),
            toolchain_text(row["toolchain"]),
            row["created_by"],
            status,
        )
    for row in overlay_rows:
        newest = age_text(time.time() - row["newest_mtime"])
        table.add_row(
            f"{row['path']}\nnewest {newest} old",
            "overlay (JIT results)",
            row["arch"],
            row["family"] or "? (other toolchain or sources)",
            str(row["keys"]),
            size_text(row["file_size"]),
            "",
            "",
            Text(row["status"], style="green" if row["status"] == "current" else "dim"),
        )
    console.print(table)
