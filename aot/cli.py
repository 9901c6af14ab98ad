"""`aot-build`: cross-compile every dispatch key for each architecture into versioned bundles.

aot-build [OPTIONS]                  build (all of it, or one --shard i/n of it)
aot-build merge SHARD_DIR... --out   link the shards' objects into the bundles
aot-build wheel BUNDLE... --out      one pip-installable wheel per architecture of built bundles
aot-build models [CONFIG...]         list model presets (and what local configs map to)
aot-build record --arch A --out DIR  record a workload on a virtual GPU of each architecture

Generic over kernel families (the `cute_aot.families` entry points): every family, shape syntax
and model mapping comes from the installed families' contracts, never from a list kept here.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cute_aot.aot import build_command, record_command
from cute_aot.aot import models as model_shapes
from cute_aot.aot.build import buildable_families
from cute_aot.aot.compile_pool import Worker, default_jobs
from cute_aot.aot.compile_worker import compile_to_object
from cute_aot.aot.output import Output
from cute_aot.aot.planning import DEFAULT_ARCHS, PlanRequest, RequestError
from cute_aot.aot.shard import Shard
from cute_aot.aot.signals import Stopped, stop_on_signals
from cute_aot.aot.workloads import WORKLOADS, configs_of, models_of
from cute_aot.artifacts.core import settings, terminal
from cute_aot.artifacts.core.errors import CuteAotError
from cute_aot.kernels import KernelFamily, families
from cute_aot.kernels.arch import SUPPORTED_ARCHS, normalize_arch
from cute_aot.kernels.contract import Shape

# -- kernel families on the command line --------------------------------------------------------


class FamiliesHelpOption(click.Option):
    """An option whose help names the installed families. Computed when help is shown: the CLI
    module imports without discovering plug-ins, and a family installed later shows up."""

    def __init__(self, *args, help_text: Callable[[], str], **kwargs):
        super().__init__(*args, **kwargs)
        self.help_text = help_text

    def get_help_record(self, ctx):
        self.help = self.help_text()
        return super().get_help_record(ctx)


def shape_syntaxes() -> str:
    """How each installed family's shapes are written, e.g. `fam:N,K (or plain N,K)`."""
    parts = []
    for name, found in families().items():
        text = f"{name}:{found.shape_syntax}"
        if found.unprefixed_shapes:
            text += f" (or plain {found.shape_syntax})"
        parts.append(text)
    return ", ".join(parts) or "none (no kernel family is installed)"


def _unprefixed_family() -> KernelFamily | None:
    return next((found for found in families().values() if found.unprefixed_shapes), None)


def parse_shape_option(text: str) -> tuple[str, Shape]:
    """`FAMILY:DIMS`, or plain `DIMS` for the family whose `unprefixed_shapes` is set (the
    command lines written before families were plug-ins) -> (family name, shape)."""
    prefix, colon, dims = text.partition(":")
    if colon:
        found = families().get(prefix.strip())
        if found is None:
            raise click.BadParameter(
                f"{text!r}: unknown kernel family {prefix.strip()!r}; "
                f"installed families and their shapes: {shape_syntaxes()}"
            )
    else:
        found, dims = _unprefixed_family(), text
        if found is None:
            raise click.BadParameter(
                f"{text!r} names no family: write FAMILY:DIMS, one of {shape_syntaxes()}"
            )
    try:
        return found.name, tuple(found.parse_shape(dims.strip()))
    except ValueError as exc:  # UnsupportedProblemError, or a plug-in's own ValueError
        raise click.BadParameter(
            f"{text!r} is not a {found.name} shape, expected "
            f"{found.name}:{found.shape_syntax} ({exc})"
        ) from None


def _parse_shapes(ctx, param, values) -> dict[str, list[Shape]]:
    """{family: shapes} of every --shape, each shape once, in command-line order."""
    shapes: dict[str, list[Shape]] = {}
    for value in values:
        name, shape = parse_shape_option(value)
        found = shapes.setdefault(name, [])
        if shape not in found:
            found.append(shape)
    return shapes


def _split_commas(ctx, param, values) -> list[str]:
    """Repeatable options also take comma lists (`--arch sm_90a,sm_100a`), handy in CI matrices."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _parse_families(ctx, param, values) -> list[str]:
    names = _split_commas(ctx, param, values)
    unknown = [name for name in names if name not in families()]
    if unknown:
        raise click.BadParameter(
            f"unknown {', '.join(unknown)}; installed: {', '.join(families()) or 'none'}"
        )
    missing = [families()[name].missing_requirements() for name in names]
    if any(missing):
        raise click.BadParameter("; ".join(why for why in missing if why))
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


def _existing_source(ctx, param, value):
    from cute_aot.artifacts.core.urls import local_path

    local = local_path(value) if value else None
    if local is not None and not local.exists():  # a URL is read (and its errors told) later
        raise click.BadParameter(f"{value} does not exist")
    return value


# -- options shared by every command that writes bundles (add new ones here: build and merge
#    both get them through `Output`) ----------------------------------------------------------

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
    click.option(
        "--cache-sign-key",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="Sign every record this build publishes to the build cache with this ed25519 "
        "private key (PEM), for builds that pass --cache-trusted-keys.",
    ),
    click.option(
        "--cache-trusted-keys",
        metavar="PATH",
        default=None,
        help="Use build cache entries only when signed by one of these ed25519 public keys "
        "(PEM files or folders, ':'-separated, as CUTE_AOT_TRUSTED_KEYS); others are "
        "built afresh. For release builds from a shared cache.",
    ),
    click.option(
        "--sign-key",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="Sign the bundles' manifests with this ed25519 private key (PEM).",
    ),
    click.option("--quiet", is_flag=True, help="No progress bar or summary table."),
    click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print the build report (and the recorded calls not built) as JSON on stdout "
        "instead of the summary table.",
    ),
)


def output_options(command):
    """Add OUTPUT_OPTIONS to a command; it receives them as one `output: Output` argument."""

    @functools.wraps(command)
    def with_output(
        *args,
        out_dir,
        allow_failures,
        cache_dir,
        no_cache,
        cache_sign_key,
        cache_trusted_keys,
        sign_key,
        quiet,
        as_json,
        **kwargs,
    ):
        output = Output(
            out_dir,
            allow_failures,
            cache_dir,
            no_cache,
            quiet,
            sign_key=sign_key,
            cache_sign_key=cache_sign_key,
            cache_trusted_keys=cache_trusted_keys,
            as_json=as_json,
        )
        return command(*args, output=output, **kwargs)

    for option in reversed(OUTPUT_OPTIONS):
        with_output = option(with_output)
    return with_output


def _console() -> Console:
    return terminal.console(stderr=True)


def _fail(console: Console, command: str, exc: BaseException, as_json: bool = False) -> None:
    """One line for a failed command, then its exit status (128 + signal if stopped). Under
    --json, stdout also gets the failure as JSON: a pipeline reading it never gets nothing."""
    if isinstance(exc, Stopped):
        message, status = f"stopped by {exc}: nothing half-written is left", 128 + exc.signum
        console.print(f"[red]{command} stopped[/red] by {exc}: nothing half-written is left")
    else:
        message, status = str(exc), 1
        if isinstance(exc, OSError) and exc.filename:  # a full disk, a read-only folder...
            message = f"{exc.filename}: {exc.strerror or exc}"
        console.print(f"[red]{command} failed:[/red] {escape(message)}")
    if as_json:
        sys.stdout.write(json.dumps({"command": command, "ok": False, "error": message}) + "\n")
        sys.stdout.flush()
    sys.exit(status)


# -- wheels: bundles as pip installs them (aot/wheel.py) -------------------------------------------
WHEEL_OPTION = click.option(
    "--wheel",
    "write_wheel",
    is_flag=True,
    help="Also write one pip-installable wheel per architecture of the bundles written, into "
    "--out beside them (as `aot-build wheel` does).",
)


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--arch",
    "archs",
    multiple=True,
    callback=_split_commas,
    help="Target GPU architecture, repeatable or comma-separated "
    f"(default: {','.join(DEFAULT_ARCHS)}).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    callback=_parse_shapes,
    metavar="[FAMILY:]DIMS",
    cls=FamiliesHelpOption,
    help_text=lambda: (
        f"Extra shape to build, repeatable: {shape_syntaxes()}. DIMS in that order (a GEMM's "
        "are N,K, the shape of w in out = x @ w.T) or named in any order (FAMILY:N=256,K=7168); "
        "a positional form a family could misread is refused with the fix."
    ),
)
@click.option("--no-default-shapes", is_flag=True, help="Leave out the default shapes.")
@click.option(
    "--tables",
    "tables_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Dispatch tables (from aot-tune) to enumerate keys with; each bundle records the table "
    "it was built with, and servers dispatch with it. Default: the packages' own tables.",
)
@click.option(
    "--all-tactics",
    is_flag=True,
    help="Also build every candidate tactic `aot-tune` would time for these shapes.",
)
@click.option(
    "--flashinfer-tuned",
    "tuning_caches",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Also build the tactics FlashInfer's autotuner chose, from its saved results "
    "(`flashinfer.autotune(cache=FILE)`), for the families serving FlashInfer (repeatable).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    callback=_parse_models,
    help="Build a model preset's shapes, for every family, instead of the defaults "
    "(repeatable; `aot-build models`).",
)
@click.option(
    "--model-config",
    "model_configs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Build the shapes every family reads from a local Hugging Face config.json "
    "(file or folder; repeatable).",
)
@click.option(
    "--family",
    "--families",
    "families",
    multiple=True,
    callback=_parse_families,
    cls=FamiliesHelpOption,
    help_text=lambda: (
        "Kernel families, repeatable or comma-separated "
        f"(default: every installed one that can be built here: "
        f"{','.join(buildable_families()) or 'none'})."
    ),
)
@click.option("--name", default="default", show_default=True, help="Bundle name.")
@click.option("--bundle-version", default=None, help="Version recorded in the manifest.")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Compile processes (default: cores, fewer if memory is short, ~300 MB each: "
    f"{default_jobs()}).",
)
@click.option(
    "--from-misses",
    "misses_file",
    callback=_existing_source,
    metavar="LOG",
    help="Build exactly the keys servers missed (CUTE_AOT_MISS_LOG), once per arch: a log file, "
    "a folder of them, or a URL prefix (s3://bucket/misses/, any fsspec protocol).",
)
@click.option(
    "--from-record",
    "record_file",
    callback=_existing_source,
    metavar="RECORD",
    help="Build the cute.compile calls recorded (CUTE_AOT_RECORD) in a file, a folder of them or "
    "a URL prefix, each distinct call once, for each --arch (default: the architecture each was "
    "recorded on); exit status 1 if any was not built.",
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
    "--dry-run",
    is_flag=True,
    help="Plan only: print the keys each architecture would compile (one line each, or with "
    "--json one document) and compile nothing.",
)
@WHEEL_OPTION
@output_options
@click.pass_context
def main(
    ctx,
    archs,
    shapes,
    no_default_shapes,
    tables_file,
    all_tactics,
    tuning_caches,
    models,
    model_configs,
    families,
    name,
    bundle_version,
    jobs,
    misses_file,
    record_file,
    shard,
    check_reproducible,
    dry_run,
    write_wheel,
    output: Output,
):
    """Cross-compile CuTe DSL kernels on this (CPU-only) machine: one bundle per architecture."""
    ctx.with_resource(settings.tool_process())  # never recorded nor served, workers included
    if ctx.invoked_subcommand:
        _refuse_build_options(ctx)
        return
    if shard and check_reproducible:
        raise click.UsageError("--check-reproducible needs a whole build, not a --shard")
    if shard and write_wheel:
        raise click.UsageError("--wheel needs whole bundles: pass it to `aot-build merge`")
    if dry_run and (shard or check_reproducible or write_wheel):
        raise click.UsageError("--dry-run builds nothing: no --shard/--check-reproducible/--wheel")
    if misses_file and (shapes or models or model_configs):
        raise click.UsageError("--from-misses builds exactly the logged keys: no --shape/--model")
    if record_file and (shapes or models or model_configs or misses_file):
        raise click.UsageError(
            "--from-record builds exactly the recorded calls: no --shape/--model/--from-misses"
        )
    console = _console()
    stop_on_signals(ctx)
    try:
        request = PlanRequest(
            archs=archs,
            shapes=shapes,
            no_default_shapes=no_default_shapes,
            tables_file=tables_file,
            all_tactics=all_tactics,
            tuning_caches=tuning_caches,
            models=models,
            model_configs=model_configs,
            named_families=families,
            misses_file=misses_file,
            record_file=record_file,
        )
        build_command.build(
            console,
            output,
            request,
            name=name,
            bundle_version=bundle_version,
            jobs=jobs,
            shard=shard,
            check_reproducible=check_reproducible,
            write_wheel=write_wheel,
            dry_run=dry_run,
            worker=compile_worker(ctx),
        )
    except RequestError as exc:  # options that contradict each other: a usage error
        raise click.UsageError(str(exc)) from None
    except (CuteAotError, OSError, Stopped) as exc:
        _fail(console, "aot-build", exc, output.as_json)


def compile_worker(ctx: click.Context) -> Worker:
    """What compiles each key: compile_to_object, unless the program that runs aot-build in
    its own process gives another as click's context object, `main.main(args, obj={"worker":
    worker})` (a compile_pool.Worker: compile_to_object's arguments and row; importable by name
    where -j > 1 runs it in worker processes). Tests build with stub compilers so."""
    given = ctx.find_root().obj
    return given.get("worker", compile_to_object) if isinstance(given, dict) else compile_to_object


def _refuse_build_options(ctx: click.Context) -> None:
    given = [
        param
        for param in ctx.command.params
        if ctx.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT
    ]
    if not given:
        return
    sub = ctx.invoked_subcommand
    sub_command = ctx.command.get_command(ctx, sub) if sub else None
    sub_names = {param.name for param in sub_command.params} if sub_command else set()
    misplaced = [param.opts[0] for param in given if param.name in sub_names]
    if misplaced:  # e.g. `aot-build --sign-key K merge ...`: merge takes it, after its name
        raise click.UsageError(f"{', '.join(misplaced)}: write them after `{sub}`")
    raise click.UsageError(
        f"{', '.join(param.opts[0] for param in given)} belong to the build, not to `{sub}`"
    )


@main.command("merge")
@click.argument("shards", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@WHEEL_OPTION
@output_options
@click.pass_context
def merge_command(ctx, shards, write_wheel, output: Output):
    """Link the outputs of `aot-build --shard i/n` (folders, searched recursively) into bundles
    byte-identical to an unsharded build."""
    console = _console()
    stop_on_signals(ctx)
    try:
        build_command.merge_shards(console, shards, output, write_wheel)
    except (CuteAotError, OSError, Stopped) as exc:
        _fail(console, "aot-build merge", exc, output.as_json)


@main.command("wheel")
@click.argument(
    "bundles",
    metavar="BUNDLE_OR_FOLDER...",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, path_type=Path),
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the wheels.",
)
@click.option("--name", default=None, help="Bundle name in the wheels' names (default: theirs).")
@click.option(
    "--version", default=None, help="Version of the wheels (default: the bundles' version)."
)
def wheel_command(bundles, out_dir, name, version):
    """One pip-installable wheel per architecture of built bundles (files or folders): the
    bundle files byte for byte (signed ones stay signed), found by servers once installed."""
    console = _console()
    try:
        build_command.write_wheel_files(console, bundles, out_dir, name=name, version=version)
    except (CuteAotError, OSError) as exc:
        _fail(console, "aot-build wheel", exc)


@main.command(
    "record", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option(
    "--arch",
    "archs",
    multiple=True,
    callback=_split_commas,
    help="Architecture to record for, on its reference GPU profile (repeatable or "
    "comma-separated).",
)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    callback=_split_commas,
    help="A GPU profile to record on as well (kernels/gpu_profiles.json: h100-sxm, h200, b200, "
    "b300, or a JSON override file), for kernels whose code follows the GPU's answers (its SM "
    "count, its cluster occupancy) and fleets of several GPUs of one architecture.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Records go to OUT/<arch or gpu>/, for `aot-build --from-record OUT`.",
)
@click.option(
    "--workload",
    type=click.Choice(sorted(WORKLOADS)),
    help="A named workload (`aot-build models` lists them with their models) instead of COMMAND.",
)
@click.option(
    "--model", "workload_models", multiple=True, help="The workload's model (repeatable)."
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record_workload(archs, gpus, out, workload, workload_models, command):
    """Run a workload on a virtual GPU of each --arch and record its cute.compile calls, on this
    CPU-only machine: a named --workload, or the COMMAND given after `--` (a server's warm-up,
    a test suite). Exit status 1 if a run failed (what it recorded is kept)."""
    console = _console()
    if bool(workload) == bool(command):
        raise click.UsageError("give either --workload NAME or a COMMAND after `--`")
    if workload_models and not workload:
        raise click.UsageError("--model chooses a --workload's model")
    if workload:
        known = models_of(workload)
        unknown = [name for name in workload_models if name not in known]
        if unknown:
            raise click.UsageError(
                f"workload {workload} has no model {', '.join(unknown)}; known: {', '.join(known)}"
            )
        command = record_command.workload_command(WORKLOADS[workload].module, workload_models)
    if not archs and not gpus:
        raise click.UsageError("name what to record for: --arch and/or --gpu")
    try:
        on = record_command.targets([normalize_arch(arch) for arch in archs], list(gpus))
    except (CuteAotError, ValueError) as exc:  # an unknown architecture or GPU profile
        raise click.UsageError(str(exc)) from None
    try:
        done = record_command.record(console, list(command), on, out)
    except (CuteAotError, OSError) as exc:
        _fail(console, "aot-build record", exc)
    # each record is built for the architecture it was recorded on: no --arch
    console.print(f"next: aot-build --from-record {escape(str(out))}")
    if any(run.returncode != 0 for run in done):
        sys.exit(1)


@main.command("models")
@click.argument("configs", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def models_command(configs, as_json):
    """List the model presets (`--model NAME`) and what local config.json files map to: per
    installed kernel family, the shapes it builds for the model and how many keys they make."""
    console = terminal.console()
    try:
        chosen = list(model_shapes.PRESETS.values())
        chosen += [model_shapes.model_from_config(path) for path in configs]
        installed = list(families().values())
        archs = [arch for arch in SUPPORTED_ARCHS if any(f.supports(arch) for f in installed)]
        rows = []  # one per (model, family that serves it); family None: none serves it
        for model in chosen:
            served = [(found, model_shapes.family_shapes(model, found)) for found in installed]
            served = [(found, shapes) for found, shapes in served if shapes]
            if not served:
                rows.append({"model": model.name, "family": None, "source": model.source})
            for found, shapes in served:
                keys = {
                    arch: len(found.enumerate_keys(arch, shapes)) if found.supports(arch) else None
                    for arch in archs
                }
                rows.append(
                    {
                        "model": model.name,
                        "family": found.name,
                        "shape_syntax": found.shape_syntax,
                        "shapes": [list(shape) for shape in shapes],
                        "keys": keys,
                        "source": model.source,
                    }
                )
    except CuteAotError as exc:
        console.print(f"[red]aot-build models:[/red] {escape(str(exc))}")
        sys.exit(1)
    if as_json:
        workloads = {
            name: {"models": list(models_of(name)), "configs": list(configs_of(name))}
            for name in sorted(WORKLOADS)
        }
        click.echo(json.dumps({"archs": archs, "models": rows, "workloads": workloads}, indent=2))
        return
    table = Table(title="shapes per model and kernel family", title_justify="left")
    for column in ("model", "family", "shapes", *archs, "source"):
        table.add_column(column)
    for row in rows:
        if row["family"] is None:
            none = "[dim]none of the installed families serves it[/dim]"
            table.add_row(row["model"], "-", none, *["-"] * len(archs), row["source"])
            continue
        shapes = " ".join(",".join(map(str, shape)) for shape in row["shapes"])
        counts = ["-" if n is None else str(n) for n in row["keys"].values()]
        table.add_row(
            row["model"], row["family"], f"{row['shape_syntax']}: {shapes}", *counts, row["source"]
        )
    console.print(table)
    console.print(f"columns {', '.join(archs)}: keys per architecture (-: not built for it)")
    console.print(_workloads_table())


def _workloads_table() -> Table:
    """The workloads `aot-build record --workload` runs: their models and configurations."""
    table = Table(title="recorded workloads (aot-build record --workload)", title_justify="left")
    for column in ("workload", "calls", "models", "configurations", "install"):
        table.add_column(column)
    for name, workload in sorted(WORKLOADS.items()):
        table.add_row(
            name,
            workload.library,
            " ".join(models_of(name)),
            " ".join(configs_of(name)),
            escape(f"cute-aot[{workload.extra}]"),
        )
    return table


if __name__ == "__main__":
    main()
