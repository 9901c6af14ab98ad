"""The build report: per key its status, compile time and object size, as JSON next to the
bundles and as rich tables on the terminal. Bundles are described as this build wrote them, never
by re-reading their files: another build into the same folder may have replaced one since."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cute_aot.aot.build import BuildOutcome, WrittenBundle
from cute_aot.aot.build_cache import BuildCache
from cute_aot.artifacts.atomic import atomic_write

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


def write_report(
    path: Path,
    outcome: BuildOutcome,
    *,
    shard: str | None = None,
    cache: BuildCache | None = None,
) -> Path:
    statuses = [key_status(row) for row in outcome.rows]
    document = {
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
    return atomic_write(path, json.dumps(document, indent=1).encode())


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
