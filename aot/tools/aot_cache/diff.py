"""`aot-cache diff`: keys and dispatch tables added, removed and changed from A to B."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click
from rich.text import Text

from cute_aot.aot.tools.aot_cache.facts.inventory import (
    diff_manifests,
)
from cute_aot.aot.tools.aot_cache.output import (
    emit_json,
    json_option,
    make_console,
    make_table,
)
from cute_aot.artifacts.bundle import read_manifest


@click.command("diff")
@click.argument("bundle_a", metavar="A", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("bundle_b", metavar="B", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--exit-code", is_flag=True, help="Exit status 1 when A and B differ (as git diff).")
@json_option
def diff_command(bundle_a, bundle_b, exit_code, as_json):
    """Keys added, removed and changed (same key, other binary) from bundle A to bundle B, and
    how their dispatch tables differ."""
    result = {"a": str(bundle_a), "b": str(bundle_b)}
    result.update(diff_manifests(read_manifest(bundle_a), read_manifest(bundle_b)))
    if as_json:
        emit_json(result)
    else:
        _print_diff(result)
    parts = ("bundle", "tables", "added", "removed", "changed")
    if exit_code and any(result[part] for part in parts):
        sys.exit(1)


def _short(value) -> str:
    """sha256 digests shortened for tables (JSON keeps them whole)."""
    text = str(value)
    return text[:16] if re.fullmatch(r"[0-9a-f]{64}", text) else text


def _print_diff(result: dict) -> None:
    console = make_console()
    console.print(f"a: {result['a']}\nb: {result['b']}")
    if result["bundle"]:
        facts = make_table("bundle", "field", "a", "b")
        for name, (old, new) in result["bundle"].items():
            facts.add_row(name, json.dumps(old, sort_keys=True), json.dumps(new, sort_keys=True))
        console.print(facts)
    for name, change in result["tables"].items():
        old, new = change["digest"]
        sources = [(p or {}).get("source") for p in change["provenance"]]
        console.print(f"{name} dispatch table: {old} ({sources[0]}) -> {new} ({sources[1]})")
        for field, rows in change["fields"].items():
            if "a" in rows:
                console.print(f"  {field}: {json.dumps(rows['a'])} -> {json.dumps(rows['b'])}")
                continue
            for sign, listed in (("+", rows["added"]), ("-", rows["removed"])):
                for row in listed:
                    console.print(f"  {sign} {field}: {json.dumps(row, sort_keys=True)}")
    table = make_table("entries", "", "key id", "key", "what changed")
    for sign, rows, style in (("+", result["added"], "green"), ("-", result["removed"], "red")):
        for row in rows:
            key = f"{row['family']}: {row['describe']}"
            table.add_row(Text(sign, style=style), row["key_id"], key, "")
    for row in result["changed"]:
        what = "; ".join(
            f"{name}: {_short(old)} -> {_short(new)}" for name, (old, new) in row["changes"].items()
        )
        key = f"{row['family']}: {row['describe']}"
        table.add_row(Text("~", style="yellow"), row["key_id"], key, what)
    if table.row_count:
        console.print(table)
    console.print(
        f"{len(result['added'])} added, {len(result['removed'])} removed, "
        f"{len(result['changed'])} changed, {result['unchanged']} unchanged"
    )
