"""The build report: per key its status, compile time and object size, as JSON next to the
bundles and as rich tables on the terminal. Bundles are described as this build wrote them (file,
size, sha256), never by re-reading their files: while the build's claim keeps other aot-builds
out (build_command.py), another writer may still have replaced one since.

Also what a command that writes bundles says around it: what planning noted (ConsoleNotes, the
recorded calls it could not build among them), the plan it is about to build, and when done
(`finish`) the report, the summary, the build cache's use, and the keys that failed; with
--json, the report and the calls not built as one JSON document on stdout. The console is
artifacts/core/terminal.py's: in a pipe or a CI log its tables keep every path and reason whole."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cute_aot.aot.build import BuildOutcome, WrittenBundle, describe_failures
from cute_aot.aot.build_cache import BuildCache
from cute_aot.artifacts.core.atomic import atomic_write

if TYPE_CHECKING:
    from cute_aot.aot.output import Output
    from cute_aot.aot.planning import NotBuilt
    from cute_aot.aot.shard import Shard

REPORT_FORMAT = 1
REPORT_SUFFIX = ".build-report.json"


def key_status(row: dict) -> str:
    if row["status"] != "ok":
        return "failed"
    return "cached" if row.get("cached") else "compiled"


def report_path(out_dir: Path, name: str, shard_folder: Path | None = None) -> Path:
    """`<out>/<name>.build-report.json`; a shard's sits next to its folder."""
    if shard_folder is not None:
        return shard_folder.parent / f"{shard_folder.name}{REPORT_SUFFIX}"
    return Path(out_dir) / f"{name}{REPORT_SUFFIX}"


def _key_record(row: dict) -> dict:
    record = {
        "family": row["family"],
        "key_id": row["key_id"],
        "symbol": row["symbol"],
        "arch": row["arch"],
        "status": key_status(row),
        "seconds": round(row.get("seconds") or 0.0, 3),
        "size": row.get("size"),
        "sha256": row.get("sha256"),
    }
    if row["status"] != "ok":
        record["error"] = row.get("error")
        if row.get("traceback"):
            record["traceback"] = row["traceback"]
    return record


def _bundle_record(bundle: WrittenBundle) -> dict:
    return {
        "file": bundle.path.name,
        "arch": bundle.arch,
        "kernels": bundle.kernels,
        "size": bundle.size,
        "sha256": bundle.sha256,
    }


class ConsoleNotes:
    """Planning's notes (planning.Notes) on the build's console."""

    def __init__(self, console: Console):
        self.console = console

    def note(self, text: str) -> None:
        self.console.print(escape(text))

    def warning(self, text: str) -> None:
        self.console.print(f"[yellow]{escape(text)}[/yellow]")

    def not_built(self, calls: list[NotBuilt]) -> None:
        self.console.print(not_built_table(calls))


def not_built_table(calls: list[NotBuilt]) -> Table:
    table = Table(title=f"{len(calls)} recorded call(s) not built", show_lines=False)
    for column in ("call site", "target", "arch", "why"):
        # fold, never an ellipsis: on a terminal a long site wraps inside its cell, whole
        table.add_column(column, overflow="fold")
    for row in calls:  # Text: a recorded site or reason is data, never rich markup
        table.add_row(*(Text(str(cell)) for cell in row))
    return table


def not_built_json(calls: list[NotBuilt]) -> list[dict]:
    return [dict(zip(("site", "target", "arch", "why"), call, strict=True)) for call in calls]


def write_report(
    path: Path,
    outcome: BuildOutcome,
    *,
    shard: str | None = None,
    cache: BuildCache | None = None,
) -> Path:
    return atomic_write(path, json.dumps(report_document(outcome, shard, cache), indent=1).encode())


def report_document(outcome: BuildOutcome, shard: str | None, cache: BuildCache | None) -> dict:
    statuses = [key_status(row) for row in outcome.rows]
    return {
        "report_format": REPORT_FORMAT,
        "name": outcome.name,
        "shard": shard,
        "jobs": outcome.jobs,
        "seconds": round(outcome.seconds, 3),
        "summary": {
            "keys": len(statuses),
            **{status: statuses.count(status) for status in ("compiled", "cached", "failed")},
        },
        "cache": None
        if cache is None
        else {
            "folder": str(cache.root),
            "hits": cache.hits,
            "misses": cache.misses,
            "write_error": cache.write_error,
        },
        "bundles": [_bundle_record(bundle) for bundle in outcome.written],
        "incomplete": outcome.incomplete,
        "keys": [_key_record(row) for row in outcome.rows],
    }


def print_summary(console: Console, outcome: BuildOutcome) -> None:
    """One line per architecture: keys by status, compile time, the bundle written (or why not)."""
    sizes = {bundle.arch: bundle.size for bundle in outcome.written}
    title = f"{outcome.name}: {outcome.seconds:.1f} s" + (
        f", {outcome.jobs} compile jobs" if outcome.jobs else ""
    )
    table = Table(title=title, title_justify="left")
    table.add_column("arch")
    for column in ("keys", "compiled", "cached", "failed", "compile s", "bundle KiB"):
        table.add_column(column, justify="right")
    for arch in dict.fromkeys(row["arch"] for row in outcome.rows):
        rows = [row for row in outcome.rows if row["arch"] == arch]
        statuses = [key_status(row) for row in rows]
        if arch in sizes:
            bundle = f"{sizes[arch] / 1024:.0f}"
        else:
            bundle = "(shard)" if outcome.shard_folder else "[red]none[/red]"
        table.add_row(
            arch,
            str(len(rows)),
            str(statuses.count("compiled")),
            str(statuses.count("cached")),
            str(statuses.count("failed")),
            f"{sum(row.get('seconds') or 0.0 for row in rows):.1f}",
            bundle,
        )
    console.print(table)


def announce_plan(console: Console, plan: dict[str, list], shard: Shard | None, cache) -> None:
    """The plan's one line: keys per architecture, a shard's share, the build cache's use."""
    counts = ", ".join(f"{arch} {len(keys)}" for arch, keys in plan.items())
    total = sum(len(keys) for keys in plan.values())
    line = f"plan: {total} keys ({counts})"
    if shard:
        line += f"; shard {shard} builds {len(shard.select(list(range(total))))} of them"
    line += f"; build cache {cache.root}" if cache else "; build cache off"
    if cache and cache.trusted_keys is not None:
        line += f" (entries signed by {len(cache.trusted_keys)} trusted key(s) only)"
    if cache and cache.sign_key is not None:
        line += "; signing its records"
    console.print(line)


def print_plan(plan: dict[str, list], as_json: bool) -> None:
    """`aot-build --dry-run`: the keys each architecture would compile, on stdout. One line per
    key (architecture, family, key id, its fields), or with --json one document:
    {"plan": {arch: [{"family", "key_id", "key": its fields}]}}."""
    if as_json:
        document = {
            "plan": {
                arch: [{"family": k.FAMILY, "key_id": k.id, "key": k.fields()} for k in keys]
                for arch, keys in plan.items()
            }
        }
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    else:
        for arch, keys in plan.items():
            for key in keys:
                fields = {name: value for name, value in key.fields().items() if name != "family"}
                sys.stdout.write(f"{arch} {key.FAMILY} {key.id} {json.dumps(fields)}\n")
    sys.stdout.flush()


def describe_cache_use(cache: BuildCache) -> str:
    """`build cache: 3 objects reused, 2 not found, 1 entry refused as untrusted`"""
    line = f"build cache: {cache.hits} objects reused, {cache.misses} not found"
    if cache.trusted_keys is None:
        return line
    refused = f"{cache.untrusted} {'entry' if cache.untrusted == 1 else 'entries'}"
    refused += " refused as untrusted"
    return f"{line}, [yellow]{refused}[/yellow]" if cache.untrusted else f"{line}, {refused}"


def finish(
    console: Console,
    outcome: BuildOutcome,
    output: Output,
    cache,
    shard=None,
    not_built: list[NotBuilt] = (),
):
    """Report, summarise, and fail the command if keys failed (unless allowed)."""
    shard_text = str(shard) if shard else None
    report = write_report(
        report_path(output.out_dir, outcome.name, outcome.shard_folder),
        outcome,
        shard=shard_text,
        cache=cache,
    )
    if output.as_json:  # on stdout, whole; what people read stays on the console (stderr)
        document = report_document(outcome, shard_text, cache)
        document.update(report=str(report), not_built=not_built_json(list(not_built)))
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
        sys.stdout.flush()
    elif not output.quiet:
        print_summary(console, outcome)
    if cache:
        console.print(describe_cache_use(cache))
    if cache and cache.write_error:
        console.print(f"[yellow]build cache off:[/yellow] {escape(cache.write_error)}")
    for bundle in outcome.written:  # as written: another build may have written there since
        console.print(f"wrote {bundle.path} ({bundle.size / 1024:.0f} KiB)")
    if outcome.shard_folder:
        console.print(f"wrote shard {shard}: {outcome.shard_folder} (then `aot-build merge`)")
    console.print(f"report: {report}")
    for bundle in outcome.written:
        if bundle.replaced():
            console.print(
                f"[yellow]warning: {bundle.path} was replaced by another build since this one "
                f"wrote it[/yellow] (this build's: sha256 {bundle.sha256}, {bundle.size} bytes; "
                "the report describes those)"
            )
    if not outcome.failed:
        return
    # Failures are always listed, allowed or not: a key never goes missing silently.
    style = "yellow" if output.allow_failures else "red"
    console.print(f"[{style}]{escape(describe_failures(outcome.failed, len(outcome.rows)))}[/]")
    written = {path.name for path in outcome.bundles}
    for arch, count in outcome.incomplete.items():
        shipped = any(name.endswith(f"-{arch}.cuteaot") for name in written)
        what = "its bundle holds the other keys" if shipped else "no bundle written"
        console.print(f"[{style}]{arch}: {count} keys missing, {what}[/]")
    if not output.allow_failures:
        console.print("[red]aot-build failed[/red] (--allow-failures ships what compiled)")
        sys.exit(1)
