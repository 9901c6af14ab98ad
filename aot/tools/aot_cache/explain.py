"""`aot-cache explain`: where a problem's kernel would come from, and why."""

from __future__ import annotations

import click
from rich.text import Text

from cute_aot.aot.tools.aot_cache.facts import explain
from cute_aot.aot.tools.aot_cache.facts.inventory import (
    no_bundles_found,
    read_manifests,
)
from cute_aot.aot.tools.aot_cache.output import (
    SOURCE_STYLES,
    emit_json,
    json_option,
    make_console,
    make_table,
    problem_words,
)
from cute_aot.aot.tools.aot_cache.params import (
    arch_param,
    family_dtypes,
)
from cute_aot.artifacts.core import settings
from cute_aot.kernels import KernelFamily, families
from cute_aot.runtime import policy
from cute_aot.runtime.mode import Mode


def _family_param(ctx, param, value: str) -> KernelFamily:
    """FAMILY: any installed family, looked up when the command runs (plug-ins come and go, so
    no list of names is fixed when this module is imported)."""
    found = families().get(value)
    if found is None:
        installed = ", ".join(sorted(families())) or "none"
        raise click.BadParameter(f"{value!r} is not an installed kernel family ({installed})")
    return found


@click.command("explain")
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
    mode = policy.decided_mode(mode_name)  # the one named, else this environment's
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
