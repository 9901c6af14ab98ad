"""`aot-build`: cross-compile every dispatch key for each architecture into versioned bundles.

aot-build [OPTIONS]                  build (all of it, or one --shard i/n of it)
aot-build merge SHARD_DIR... --out   link the shards' objects into the bundles
aot-build models [CONFIG...]         list model presets (and what local configs map to)
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cute_aot.aot import models as model_shapes
from cute_aot.aot import reproducible
from cute_aot.aot.build import (
    BuildOutcome,
    BuildPlan,
    describe_failures,
    keys_by_arch,
    merge,
    run_build,
)
from cute_aot.aot.build_cache import BuildCache, default_cache_root
from cute_aot.aot.compile_pool import default_jobs
from cute_aot.aot.report import print_summary, report_path, write_report
from cute_aot.aot.shard import Shard
from cute_aot.artifacts import signing
from cute_aot.artifacts.errors import CuteAotError
from cute_aot.kernels import FAMILIES, family
from cute_aot.kernels.arch import normalize_arch

DEFAULT_ARCHS = ("sm_90a", "sm_100a")


def _parse_shape(ctx, param, values):
    shapes = []
    for value in values:
        try:
            k, n = (int(part) for part in value.split(","))
        except ValueError:
            raise click.BadParameter(f"{value!r} is not K,N (two integers)") from None
        shapes.append((k, n))
    return shapes


def _split_commas(ctx, param, values) -> list[str]:
    """Repeatable options also take comma lists (`--arch sm_90a,sm_100a`), handy in CI matrices."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _parse_families(ctx, param, values) -> list[str]:
    names = _split_commas(ctx, param, values)
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    return list(dict.fromkeys(names))


def _parse_models(ctx, param, values) -> list[str]:
    names = [name.lower() for name in _split_commas(ctx, param, values)]
    unknown = [name for name in names if name not in model_shapes.PRESETS]
    if unknown:
        raise click.BadParameter(
            f"unknown {', '.join(unknown)}; presets: {', '.join(model_shapes.PRESETS)}"
        )
    return names


def _parse_shard(ctx, param, value):
    if value is None:
        return None
    try:
        return Shard.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def plan_from_misses(path, archs, families) -> dict[str, list]:
    """{arch: keys} of a miss log, optionally narrowed to some architectures and families."""
    from cute_aot.runtime.misses import read_misses  # imports torch: only when asked for

    wanted_archs = {normalize_arch(arch) for arch in archs}
    plan: dict[str, set] = {}
    for record in read_misses(path):
        if families and record["family"] not in families:
            continue
        arch = normalize_arch(record["arch"])
        if wanted_archs and arch not in wanted_archs:
            continue
        plan.setdefault(arch, set()).add(family(record["family"]).Key.from_fields(record["key"]))
    if not plan:
        raise CuteAotError(f"{path}: no misses to build (for the requested archs/families)")
    return {arch: sorted(keys, key=lambda key: key.symbol) for arch, keys in sorted(plan.items())}


# -- options shared by every command that writes bundles (add new ones here: build and merge
#    both get them through `Output`) ----------------------------------------------------------


@dataclass(frozen=True)
class Output:
    out_dir: Path
    allow_failures: bool
    cache_dir: Path | None
    no_cache: bool
    quiet: bool

    def cache(self) -> BuildCache | None:
        return None if self.no_cache else BuildCache(self.cache_dir or default_cache_root())


OUTPUT_OPTIONS = (
    click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("bundles"),
        show_default=True,
        help="Output folder for bundles (and their build report).",
    ),
    click.option(
        "--allow-failures",
        is_flag=True,
        help="Exit 0 even if keys failed; bundles then hold the keys that compiled.",
    ),
    click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Build cache folder (default: $CUTE_AOT_CACHE_DIR/build or ~/.cache/cute-aot/build).",
    ),
    click.option("--no-cache", is_flag=True, help="Neither read nor fill the build cache."),
    click.option("--quiet", is_flag=True, help="No progress bar or summary table."),
)


def output_options(command):
    """Add OUTPUT_OPTIONS to a command; it receives them as one `output: Output` argument."""

    @functools.wraps(command)
    def with_output(*args, out_dir, allow_failures, cache_dir, no_cache, quiet, **kwargs):
        output = Output(out_dir, allow_failures, cache_dir, no_cache, quiet)
        return command(*args, output=output, **kwargs)

    for option in reversed(OUTPUT_OPTIONS):
        with_output = option(with_output)
    return with_output


def _console() -> Console:
    return Console(stderr=True, soft_wrap=True)


def _finish(console: Console, outcome: BuildOutcome, output: Output, cache, shard=None):
    """Report, summarise, and fail the command if keys failed (unless allowed)."""
    report = write_report(
        report_path(output.out_dir, outcome.name, outcome.shard_folder),
        outcome,
        shard=str(shard) if shard else None,
        cache=cache,
    )
    if not output.quiet:
        print_summary(console, outcome)
    if cache and cache.write_error:
        console.print(f"[yellow]build cache off:[/yellow] {escape(cache.write_error)}")
    for path in outcome.bundles:
        console.print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    if outcome.shard_folder:
        console.print(f"wrote shard {shard}: {outcome.shard_folder} (then `aot-build merge`)")
    console.print(f"report: {report}")
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


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--arch",
    "archs",
    multiple=True,
    callback=_split_commas,
    help=f"Target GPU architecture, repeatable or comma-separated (default: {','.join(DEFAULT_ARCHS)}).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    callback=_parse_shape,
    help="Extra router_gemm weight shape K,N (repeatable).",
)
@click.option("--no-default-shapes", is_flag=True, help="Leave out the default shapes.")
@click.option(
    "--model",
    "models",
    multiple=True,
    callback=_parse_models,
    help="Build a model preset's shapes instead of the defaults (repeatable; `aot-build models`).",
)
@click.option(
    "--model-config",
    "model_configs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Build the shapes of a local Hugging Face config.json (file or folder; repeatable).",
)
@click.option(
    "--family",
    "--families",
    "families",
    multiple=True,
    callback=_parse_families,
    help=f"Kernel families, repeatable or comma-separated (default: all: {','.join(FAMILIES)}).",
)
@click.option("--name", default="default", show_default=True, help="Bundle name.")
@click.option("--bundle-version", default=None, help="Version recorded in the manifest.")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help=f"Compile processes (default: cores, fewer if memory is short, ~300 MB each: {default_jobs()}).",
)
@click.option(
    "--from-misses",
    "misses_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Build exactly the keys of a runtime miss log (CUTE_AOT_MISS_LOG).",
)
@click.option(
    "--shard",
    callback=_parse_shard,
    metavar="I/N",
    help="Build slice I of N (0-based) into <out>/<name>.shard-I-of-N/, for `aot-build merge`.",
)
@click.option(
    "--check-reproducible",
    is_flag=True,
    help="Then build again from scratch (no cache) and require byte-identical bundles.",
)
@click.option(
    "--sign-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Sign the bundles' manifests with this ed25519 private key (PEM).",
)
@output_options
@click.pass_context
def main(
    ctx,
    archs,
    shapes,
    no_default_shapes,
    models,
    model_configs,
    families,
    name,
    bundle_version,
    jobs,
    misses_file,
    shard,
    check_reproducible,
    sign_key,
    output: Output,
):
    """Cross-compile CuTe DSL kernels on this (CPU-only) machine: one bundle per architecture."""
    if ctx.invoked_subcommand:
        _refuse_build_options(ctx)
        return
    if shard and check_reproducible:
        raise click.UsageError("--check-reproducible needs a whole build, not a --shard")
    if misses_file and (shapes or models or model_configs):
        raise click.UsageError("--from-misses builds exactly the logged keys: no --shape/--model")
    console = _console()
    try:
        if misses_file:
            plan = plan_from_misses(misses_file, archs, families)
        else:
            plan = _plan(console, archs, shapes, no_default_shapes, models, model_configs, families)
        plan = keys_by_arch(plan)
        cache = output.cache()
        _announce(console, plan, shard, cache)
        kwargs = {"bundle_version": bundle_version} if bundle_version else {}

        def build_into(out_dir: Path, cache: BuildCache | None) -> BuildOutcome:
            return run_build(
                plan,
                out_dir,
                name=name,
                jobs=jobs,
                cache=cache,
                allow_failures=output.allow_failures,
                shard=shard,
                show_progress=not output.quiet,
                **kwargs,
            )

        outcome = build_into(output.out_dir, cache)
        _finish(console, outcome, output, cache, shard)
        if check_reproducible:
            console.print("checking reproducibility: building again from scratch (no cache)")
            started = time.perf_counter()
            reproducible.check_reproducible(outcome.bundles, lambda f: build_into(f, None))
            console.print(
                f"reproducible: a clean rebuild wrote {len(outcome.bundles)} byte-identical "
                f"bundles ({time.perf_counter() - started:.1f} s)"
            )
        if sign_key:  # last: the reproducibility check compares unsigned builds
            private_key = signing.load_private_key(sign_key)
            for path in outcome.bundles:
                signed = signing.sign_bundle(path, private_key)
                console.print(f"signed {path} (ed25519 key {signed.signature['key_id']})")
    except CuteAotError as exc:
        console.print(f"[red]aot-build failed:[/red] {escape(str(exc))}")
        sys.exit(1)


def _plan(console, archs, shapes, no_default_shapes, models, model_configs, families) -> BuildPlan:
    families = list(families or FAMILIES)
    chosen = [model_shapes.preset(name) for name in models]
    chosen += [model_shapes.model_from_config(path) for path in model_configs]
    extra = model_shapes.shapes_for_models(chosen, families) if chosen else {}
    for model in chosen:
        console.print(
            f"model {model.name}: hidden_size {model.hidden_size}, {model.num_experts} experts"
        )
    if shapes:
        router = extra.setdefault("router_gemm", [])
        router += [shape for shape in shapes if shape not in router]
    return BuildPlan(
        archs=list(archs or DEFAULT_ARCHS),
        families=families,
        extra_shapes=extra,
        # A model build is that model's shapes; the defaults are themselves model shapes.
        default_shapes=not (no_default_shapes or chosen),
    )


def _announce(console: Console, plan: dict[str, list], shard: Shard | None, cache) -> None:
    counts = ", ".join(f"{arch} {len(keys)}" for arch, keys in plan.items())
    total = sum(len(keys) for keys in plan.values())
    line = f"plan: {total} keys ({counts})"
    if shard:
        line += f"; shard {shard} builds {len(shard.select(list(range(total))))} of them"
    line += f"; build cache {cache.root}" if cache else "; build cache off"
    console.print(line)


def _refuse_build_options(ctx: click.Context) -> None:
    given = [
        param.opts[0]
        for param in ctx.command.params
        if ctx.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} belong to the build, not to `{ctx.invoked_subcommand}`"
        )


@main.command("merge")
@click.argument("shards", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@output_options
def merge_command(shards, output: Output):
    """Link the outputs of `aot-build --shard i/n` (folders, searched recursively) into bundles
    byte-identical to an unsharded build."""
    console = _console()
    try:
        cache = output.cache()
        outcome = merge(
            list(shards), output.out_dir, cache=cache, allow_failures=output.allow_failures
        )
        _finish(console, outcome, output, cache)
    except CuteAotError as exc:
        console.print(f"[red]aot-build merge failed:[/red] {escape(str(exc))}")
        sys.exit(1)


@main.command("models")
@click.argument("configs", nargs=-1, type=click.Path(exists=True, path_type=Path))
def models_command(configs):
    """List the model presets (`--model NAME`) and what local config.json files map to."""
    console = Console(soft_wrap=True)
    try:
        chosen = list(model_shapes.PRESETS.values())
        chosen += [model_shapes.model_from_config(path) for path in configs]
        table = Table(title="router_gemm shapes per model", title_justify="left")
        for column in ("model", "K (hidden)", "N (experts)", *DEFAULT_ARCHS, "source"):
            table.add_column(column)
        for model in chosen:
            (shape,) = model_shapes.router_gemm_shapes(model)
            counts = [
                str(len(family("router_gemm").enumerate_keys(a, [shape]))) for a in DEFAULT_ARCHS
            ]
            table.add_row(model.name, str(shape[0]), str(shape[1]), *counts, model.source)
        console.print(table)
        console.print(f"columns {', '.join(DEFAULT_ARCHS)}: keys per architecture")
    except CuteAotError as exc:
        console.print(f"[red]aot-build models:[/red] {escape(str(exc))}")
        sys.exit(1)


if __name__ == "__main__":
    main()
