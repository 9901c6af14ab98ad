"""`aot-cache`: see, explain and verify what is shipped, without reading code.

    aot-cache ls | show | verify | explain | diff | misses | gc | env | sass | push | pull

Every command prints rich tables, or JSON with --json. Nothing here imports cutlass or loads a
bundle's library: manifests are read as data, libraries as bytes (verify, sass), GPU code with
NVIDIA's cuobjdump/nvdisasm. Generic over kernel families: each is asked, through its contract,
how it reads a problem and why it dispatches as it does. This module parses and presents; the
facts come from inventory, check, explain and gc.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cute_aot.aot import binary_info
from cute_aot.artifacts import PACKAGE_VERSION, settings
from cute_aot.artifacts.atomic import atomic_write
from cute_aot.artifacts.bundle import read_bundle, read_manifest
from cute_aot.artifacts.errors import CuteAotError
from cute_aot.artifacts.miss_log import read_misses
from cute_aot.artifacts.urls import local_path
from cute_aot.kernels import KernelFamily, families
from cute_aot.runtime import misses as miss_log
from cute_aot.runtime import overlay
from cute_aot.runtime.aot_cache import check, explain, gc
from cute_aot.runtime.aot_cache.inventory import (
    aggregate_misses,
    bundle_report,
    bundle_sources,
    bundle_summary,
    describe_key,
    diff_manifests,
    entry_fatbin,
    entry_matching,
    environment,
    no_bundles_found,
    order_problem,
    read_manifests,
)
from cute_aot.runtime.aot_cache.output import (
    SOURCE_STYLES,
    STATUS_STYLES,
    age_text,
    emit_json,
    json_option,
    make_console,
    make_table,
    problem_words,
    size_text,
    toolchain_text,
)
from cute_aot.runtime.aot_cache.params import (
    age_param,
    arch_param,
    family_dtypes,
    parse_age,
    parse_size,
    size_param,
)
from cute_aot.runtime.mode import Mode, current_mode, parse_mode

# parse_size and parse_age are part of this module's interface (scripts and tests use them here).
__all__ = ["main", "parse_age", "parse_size"]


class _Failure(click.ClickException):
    def show(self, file=None) -> None:
        click.echo(f"aot-cache: {self.message}", err=True)


class _Group(click.Group):
    """Every CuteAotError becomes one precise line on stderr and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CuteAotError as exc:
            raise _Failure(str(exc)) from None


# -- the group ---------------------------------------------------------------------------------
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(PACKAGE_VERSION, prog_name="aot-cache")
def main():
    """See, explain and verify cute-aot bundles, the overlay cache and the miss log.

    Commands that take bundle PATHS (files or folders) fall back to CUTE_AOT_BUNDLES.
    """


# -- ls ----------------------------------------------------------------------------------------
@main.command("ls")
@click.argument("bundle_paths", metavar="[PATHS]...", nargs=-1)
@click.option("--no-overlay", is_flag=True, help="Leave out the overlay cache.")
@json_option
def ls_command(bundle_paths, no_overlay, as_json):
    """Bundles found and where from: architecture, families, key counts, sizes, toolchain.

    PATHS are bundle files or folders (default: every bundle a server would load, in its order:
    CUTE_AOT_BUNDLES, then installed bundle wheels); the overlay cache of JIT results follows.
    Exit status 1 if a bundle cannot be read.
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


# -- show --------------------------------------------------------------------------------------
@main.command("show")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--family", "family_name", help="Only entries of this family.")
@click.option("--key", "key_id", help="One entry in detail: key id, unique id prefix, or symbol.")
@click.option("--tables", "show_tables", is_flag=True, help="The dispatch tables it carries.")
@json_option
def show_command(bundle, family_name, key_id, show_tables, as_json):
    """Entries: key, symbol, size, sha256, registers, shared memory, SASS instruction classes.

    Resources and instruction counts were read from each kernel's cubin with cuobjdump/nvdisasm
    when the bundle was built. Shared memory is the static part: CuTe DSL kernels set their
    dynamic shared memory at launch.
    """
    report = bundle_report(bundle, family_name, key_id)
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


# -- verify ------------------------------------------------------------------------------------
@main.command("verify")
@click.argument("bundle_paths", metavar="[PATHS]...", nargs=-1)
@click.option(
    "--gpu-arch",
    callback=arch_param,
    help="Check against this GPU architecture instead of the local GPU (e.g. sm_90a).",
)
@json_option
def verify_command(bundle_paths, gpu_arch, as_json):
    """Every hash, the manifest schema, keys, exports, and fit with this machine.

    Per bundle: container and every sha256 (manifest, payload, library); key ids and symbols;
    exported functions; each kernel's fatbin by sha256 and SM; GPU architecture; tvm-ffi ABI; CUDA
    driver against the linked runtime; kernel sources against the installed cute-aot. Exit status
    1 on any failure, or when a GPU is present and no bundle fits it.
    """
    sources = bundle_sources(bundle_paths)
    if not sources:
        raise CuteAotError(
            f"nothing to verify: pass bundle files or folders, or set {settings.BUNDLES.name}"
        )
    gpu = None if gpu_arch else check.local_gpu()
    target = gpu_arch or (gpu or {}).get("arch")
    driver = check.driver_cuda_version()
    reports = [
        check.verify_bundle(path, from_folder, target, gpu, driver)
        for path, _, from_folder in sources
    ]
    failures = [
        f"{r['path']}: {c['check']}: {c['detail']}"
        for r in reports
        for c in r["checks"]
        if c["status"] == "fail"
    ]
    if target and not failures and not any(r["usable"] for r in reports):
        failures.append(f"no bundle for this GPU's architecture {target} ({len(reports)} checked)")
    result = {
        "ok": not failures,
        "gpu_arch": target,
        "gpu": gpu,
        "driver_cuda": ".".join(map(str, driver)) if driver else None,
        "bundles": reports,
        "failures": failures,
    }
    if as_json:
        emit_json(result)
    else:
        table = make_table("aot-cache verify", "bundle", "check", "result", "detail")
        for report in reports:
            for index, item in enumerate(report["checks"]):
                status = Text(item["status"], style=STATUS_STYLES[item["status"]])
                first = report["path"] if index == 0 else ""
                table.add_row(first, item["check"], status, item["detail"])
        make_console().print(table)
    for line in failures:
        click.echo(f"aot-cache verify: FAILED {line}", err=True)
    if failures:
        sys.exit(1)
    if not as_json:
        make_console().print(Text(f"{len(reports)} bundle(s) verified", style="green"))


# -- explain -----------------------------------------------------------------------------------
def _family_param(ctx, param, value: str) -> KernelFamily:
    """FAMILY: any installed family, looked up when the command runs (plug-ins come and go, so
    no list of names is fixed when this module is imported)."""
    found = families().get(value)
    if found is None:
        installed = ", ".join(sorted(families())) or "none"
        raise click.BadParameter(f"{value!r} is not an installed kernel family ({installed})")
    return found


@main.command("explain")
@click.argument("family", metavar="FAMILY", callback=_family_param)
@click.option(
    "--shape",
    required=True,
    help="The problem, as the family reads it: its dims in order (a GEMM's M,N,K: x [M, K], "
    "w [N, K]) or named in any order (M=12,N=256,K=7168); the family's error says its form.",
)
@click.option(
    "--dtype",
    "dtype_text",
    help="DTYPE for every input, or one per input, comma-separated (default: the family's).",
)
@click.option(
    "--arch",
    "archs",
    multiple=True,
    callback=arch_param,
    help="GPU architecture, repeatable (default: every one the family is built for).",
)
@click.option(
    "--bundle",
    "bundle_paths",
    multiple=True,
    help="Bundle file or folder as a server would load them, repeatable "
    f"(default: {settings.BUNDLES.name}).",
)
@click.option(
    "--mode",
    "mode_name",
    type=click.Choice([m.value for m in Mode]),
    help=f"Serving mode (default: {settings.MODE.name}, else auto).",
)
@json_option
def explain_command(family, shape, dtype_text, archs, bundle_paths, mode_name, as_json):
    """Dispatch decision -> key -> where its kernel would come from (bundle, overlay, JIT), why.

    FAMILY is any installed kernel family. Reads manifests only: never imports cutlass, never
    loads a library, needs no GPU.
    """
    dtypes = family_dtypes(family, dtype_text)
    try:
        problem = family.parse_problem(shape, dtypes)
    except ValueError as exc:  # UnsupportedProblemError: the family's own words on its syntax
        hint = "--shape" if dtype_text is None else "--shape/--dtype"
        raise click.BadParameter(str(exc), param_hint=hint) from None
    mode = parse_mode(mode_name) if mode_name else current_mode()
    bundles = read_manifests(bundle_paths)  # the runtime's search order (inventory.bundle_sources)
    if not bundles:  # else every decision reads as a miss, even for a kernel just built
        click.echo(f"aot-cache: {no_bundles_found(bundle_paths, '--bundle bundles/')}", err=True)
    decisions = [
        explain.explain(family, problem, arch, mode, bundles) for arch in archs or family.archs
    ]
    described = family.describe_problem(problem)
    report = {
        "family": family.name,
        "family_version": family.version,
        "problem": described,
        "mode": mode.value,
        "bundles": [str(path) for path, _, _ in bundles],
        "decisions": decisions,
    }
    if as_json:
        emit_json(report)
        return
    console = make_console()
    console.print(
        f"{family.name} {problem_words(described)} · mode {mode.value} · "
        f"{len(bundles)} bundle file(s) considered"
    )
    for d in decisions:
        title = f"{d['arch']}: key {d['key_id']}" if d["key_id"] else f"{d['arch']}: no key"
        table = make_table(title, "", "", show_header=False)
        if d["key_id"]:
            table.add_row("key", f"{d['describe']} (symbol {d['symbol']})")
        table.add_row("dispatch", d["dispatch"])
        where = d["source"] + (f": {d['path']}" if d["path"] else "")
        table.add_row("from", Text(where, style=SOURCE_STYLES[d["source"]]))
        table.add_row("why", d["why"])
        for note in d["notes"]:
            table.add_row("note", note)
        console.print(table)


# -- diff --------------------------------------------------------------------------------------
@main.command("diff")
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


# -- misses ------------------------------------------------------------------------------------
@main.command("misses")
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


# -- gc ----------------------------------------------------------------------------------------
@main.command("gc")
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
    help="Only this cache (repeatable; default: all four, and temporaries elsewhere in the "
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


# -- env ---------------------------------------------------------------------------------------
@main.command("env")
@json_option
def env_command(as_json):
    """Versions, tools, paths, environment variables, GPU and serving mode."""
    report = environment()
    if as_json:
        emit_json(report)
        return
    table = make_table("cute-aot environment", "", "", "", show_header=False)
    for name, version in report["versions"].items():
        table.add_row("version", name, str(version))
    for name, tool in report["tools"].items():
        missing = f"not found: pip install {binary_info.TOOL_DISTRIBUTIONS[name]}"
        table.add_row(
            "tool", name, f"{tool['path']} ({tool['version']})" if tool["path"] else missing
        )
    where = report["paths"]
    usage = {key: where[key] for key in ("overlay", "libs")}
    table.add_row("path", "cache dir", where["cache_dir"])
    for label, key in (("overlay", "overlay"), ("unpacked libraries", "libs")):
        table.add_row(
            "path",
            label,
            f"{usage[key]['path']} ({usage[key]['files']} files, {size_text(usage[key]['bytes'])})",
        )
    log = where["miss_log"]
    state = {True: "", False: " (none yet)", None: " (a URL: not checked)"}[log["exists"]]
    table.add_row("path", "miss log", log["path"] + state)
    table.add_row(
        "path", "bundles", "\n".join(where["bundles"]) or f"none ({settings.BUNDLES.name} unset)"
    )
    defaults = {setting.name: setting.unset_text for setting in settings.SETTINGS}
    for name, value in report["env"].items():
        unset = f"(unset: {defaults[name]})" if name in defaults else "(unset)"
        table.add_row("env", name, unset if value is None else value)
    gpu = report["gpu"]
    if gpu:
        device = (
            f"{gpu['name']} (compute {gpu['capability']}, bundles {gpu['arch'] or 'none built'})"
        )
    table.add_row("gpu", "device", device if gpu else "none")
    driver = report["driver_cuda"]
    table.add_row("gpu", "driver", f"supports CUDA {driver}" if driver else "no CUDA driver")
    table.add_row("mode", "serving mode", f"{report['mode']} ({report['mode_source']})")
    jit = (
        "available (nvidia-cutlass-dsl installed)"
        if report["jit_available"]
        else "unavailable: auto falls back to torch"
    )
    table.add_row("mode", "JIT fallback", jit)
    hook = report["startup_hook"]
    table.add_row(
        "hook",
        "startup hook",
        hook["installed_at"] or "not in a site directory (see the README: Activation)",
    )
    state = "active" if hook["active"] else "inactive"
    table.add_row("hook", "cute.compile hook", f"{state} in processes started here: {hook['why']}")
    make_console().print(table)


# -- sass --------------------------------------------------------------------------------------
@main.command("sass")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("key_id", metavar="KEY")
@click.option("--hex", "show_encoding", is_flag=True, help="Show instruction encodings too.")
@json_option
def sass_command(bundle, key_id, show_encoding, as_json):
    """One kernel's SASS (KEY: key id, unique prefix, or symbol), via cuobjdump and nvdisasm."""
    manifest, library = read_bundle(bundle)  # verified: the SASS shown is what would run
    entry = entry_matching(bundle, manifest, key_id)
    text = binary_info.disassemble(entry_fatbin(bundle, manifest, library, entry), show_encoding)
    describe = describe_key(entry.family, entry.key)
    if as_json:
        facts = {"path": str(bundle), "arch": manifest.arch, "key_id": entry.key_id}
        emit_json({**facts, "symbol": entry.symbol, "describe": describe, "sass": text})
        return
    click.echo(f"// {bundle} · {manifest.arch} · key {entry.key_id} · {entry.family}: {describe}")
    click.echo(text, nl=False)


# -- push / pull -------------------------------------------------------------------------------
@main.command("push")
@click.argument("bundle_paths", metavar="BUNDLES...", nargs=-1, required=True)
@click.argument("url")
@json_option
def push_command(bundle_paths, url, as_json):
    """Upload bundle files or folders to a folder or prefix URL (s3://bucket/bundles/, any
    fsspec protocol), each verified first. Servers load them with CUTE_AOT_BUNDLES=URL."""
    from cute_aot.runtime import remote

    try:
        pushed = remote.push(list(bundle_paths), url)
    except OSError as exc:
        raise _Failure(f"{exc.filename or url}: {exc.strerror or exc}") from None
    if as_json:
        emit_json({"url": url, "pushed": [vars(item) for item in pushed]})
        return
    table = make_table(f"pushed to {url}", "bundle", "size", "sha256", "signed", right=("size",))
    for item in pushed:
        signed = Text("yes", style="green") if item.signed else Text("no", style="yellow")
        table.add_row(item.url, size_text(item.size), item.sha256, signed)
    make_console().print(table)
    if not all(item.signed for item in pushed):
        click.echo(
            "aot-cache push: unsigned bundles are refused from URLs unless servers set "
            f"{settings.REMOTE_UNSIGNED.name}=1 (sign with aot-build --sign-key)",
            err=True,
        )


@main.command("pull")
@click.argument("url")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also copy the verified bundles into this folder, under their own names.",
)
@json_option
def pull_command(url, out_dir, as_json):
    """Download and verify the bundles at URL (a bundle, or a folder or prefix of them) into the
    download cache, as a server would; any refusal or an unreachable store is exit status 1."""
    from cute_aot.runtime import remote

    try:
        pulled = remote.pull(url, out_dir)
    except OSError as exc:
        raise _Failure(f"{exc.filename or url}: {exc.strerror or exc}") from None
    rows = [{**vars(item), "path": str(item.path)} for item in pulled]
    if as_json:
        emit_json({"url": url, "pulled": rows})
        return
    table = make_table(f"pulled from {url}", "bundle", "size", "sha256", "path", right=("size",))
    for row in rows:
        table.add_row(row["url"], size_text(row["size"]), row["sha256"], row["path"])
    make_console().print(table)


if __name__ == "__main__":
    main()
