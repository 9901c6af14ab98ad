"""`aot-cache show`: a bundle's entries, resources and SASS mix, or its dispatch tables."""

from __future__ import annotations

import json
from collections.abc import Callable

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cute_aot.aot import binary_info
from cute_aot.aot.tools.aot_cache.facts.inventory import (
    bundle_report,
    bundle_sources,
)
from cute_aot.aot.tools.aot_cache.output import (
    emit_json,
    json_option,
    make_console,
    make_table,
    size_text,
    toolchain_text,
)
from cute_aot.artifacts.core.errors import CuteAotError


@click.command("show")
@click.argument("bundle", metavar="BUNDLE")
@click.option("--family", "family_name", help="Only entries of this family.")
@click.option("--key", "key_id", help="One entry in detail: key id, unique id prefix, or symbol.")
@click.option("--tables", "show_tables", is_flag=True, help="The dispatch tables it carries.")
@json_option
def show_command(bundle, family_name, key_id, show_tables, as_json):
    """Entries: key, symbol, size, sha256, registers, shared memory, SASS instruction classes.

    Resources and instruction counts were read from each kernel's cubin with cuobjdump/nvdisasm
    when the bundle was built. Shared memory is the static part: CuTe DSL kernels set their
    dynamic shared memory at launch. BUNDLE is a bundle file, a folder holding one, or a URL
    (file://, s3://, http(s)://), fetched as a server fetches it.
    """
    report = bundle_report(_one_bundle(bundle), family_name, key_id)
    facts = report["entries"]
    if as_json:
        emit_json(report)
        return
    console = make_console()
    console.print(_bundle_header(report))
    if show_tables:
        _print_tables(console, report["families"], family_name)
        return
    if key_id:
        _print_entry_detail(console, facts[0])
    else:
        console.print(_entries_table(facts))
    if report["note"]:
        console.print(Text(report["note"], style="yellow"))


def _one_bundle(source: str):
    """The one bundle `source` names: a file, a folder or a URL, read as a server reads it."""
    found = bundle_sources((source,))
    if len(found) != 1:
        raise CuteAotError(
            f"{source}: holds {len(found)} bundles, show takes one (aot-cache ls {source} lists "
            "them)"
        )
    return found[0][0]


def _bundle_header(report: dict) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    family_lines = []
    for name, facts in report["families"].items():
        state = report["stale"].get(name)
        state = f"STALE: {state}" if state else "matches the installed sources"
        source = str(facts.get("source_hash"))[:12]
        line = f"{name} v{facts.get('version')} · source {source} · {state}"
        if isinstance(facts.get("table"), dict):
            table = facts["table"]
            line += f" · table {table.get('digest')} ({table.get('provenance', {}).get('source')})"
        family_lines.append(line)
    library, payload = report["library"], report["payload"]
    rows = {
        "bundle": report["path"],
        "name": f"{report['name']} {report['bundle_version']} (format {report['format_version']})",
        "arch": report["arch"],
        "created by": report["created_by"],
        "toolchain": toolchain_text(report["toolchain"]).replace("\n", " · "),
        "families": "\n".join(family_lines) or "-",
        "library": f"{size_text(library.get('size'))} · sha256 {str(library.get('sha256'))[:16]}",
        "file": f"{size_text(report['file_size'])} ({payload.get('codec')} payload)",
    }
    for label, value in rows.items():
        grid.add_row(label, value)
    return grid


def _print_tables(console: Console, families: dict, only: str | None) -> None:
    """Each family's dispatch table: provenance, settings, then every list of rows as a table."""
    for name, facts in families.items():
        record = facts.get("table")
        if only and name != only:
            continue
        if not isinstance(record, dict):
            console.print(f"{name}: no dispatch table recorded (it reads none, or an older build)")
            continue
        console.print(
            Text(f"{name} on {record.get('arch')}: table {record.get('digest')}", style="bold")
        )
        for label, value in (record.get("provenance") or {}).items():
            console.print(f"  {label}: {value}")
        data = record.get("data") or {}
        for label, value in data.items():
            if not isinstance(value, list):
                console.print(f"  {label}: {json.dumps(value, sort_keys=True)}")
        for label, rows in data.items():
            if isinstance(rows, list) and rows:
                columns = list(dict.fromkeys(c for row in rows for c in row))
                view = make_table(f"{name}: {label}", *columns)
                for row in rows:
                    view.add_row(*(json.dumps(row.get(c)) if c in row else "" for c in columns))
                console.print(view)
            elif isinstance(rows, list):
                console.print(f"  {label}: none")


def _per_kernel(kernels: list[dict] | None, render: Callable[[dict], str]) -> str:
    return "not recorded" if kernels is None else "\n".join(render(k) for k in kernels) or "-"


def _classes_text(kernel: dict) -> str:
    classes = kernel.get("instruction_classes")
    if classes is None:
        return "no nvdisasm at build"
    return " ".join(f"{name}×{count}" for name, count in classes.items() if name != "total")


def _entries_table(entries: list[dict]) -> Table:
    table = make_table(
        f"{len(entries)} entries",
        *("key id", "key", "object", "fatbin sha256", "regs", "smem", "stack", "SASS classes"),
        right=("object", "regs", "smem", "stack"),
        show_lines=True,
    )
    for e in entries:
        kernels = e["kernels"]
        table.add_row(
            e["key_id"],
            f"{e['family']}: {e['describe']}",
            size_text(e["size"]),
            (e["fatbin_sha256"] or "not recorded")[:16],
            _per_kernel(kernels, lambda k: str(k.get("registers", "-"))),
            _per_kernel(kernels, lambda k: str(k.get("shared", "-"))),
            _per_kernel(kernels, lambda k: str(k.get("stack", "-"))),
            _per_kernel(kernels, _classes_text) if kernels is not None else "",
        )
    return table


def _print_entry_detail(console: Console, e: dict) -> None:
    fields = make_table(f"key {e['key_id']} · {e['family']}: {e['describe']}", "field", "value")
    for name, value in sorted(e["key"].items()):
        fields.add_row(name, str(value))
    for name in ("symbol", "sha256", "size", "fatbin_sha256", "fatbin_size", "sm"):
        fields.add_row(name, "not recorded" if e[name] is None else str(e[name]))
    console.print(fields)
    for kernel in e["kernels"] or []:
        names = ("registers", "shared", "stack", "local", "constant0")
        usage = make_table("resources", "kernel", *names, right=names)
        usage.add_row(kernel["name"], *(str(kernel.get(name, "-")) for name in names))
        console.print(usage)
        classes = kernel.get("instruction_classes")
        if not classes:
            continue
        mix = make_table("SASS instruction classes", "class", "count", "what", right=("count",))
        for name, count in classes.items():
            if name != "total":
                mix.add_row(name, str(count), binary_info.CLASS_DESCRIPTIONS[name])
        mix.add_row("total", str(classes["total"]), "every SASS instruction")
        console.print(mix)
        top = sorted(kernel["opcodes"].items(), key=lambda item: (-item[1], item[0]))[:12]
        console.print("most frequent opcodes: " + ", ".join(f"{o} {c}" for o, c in top))
