"""`aot-build`: cross-compile every dispatch key for each architecture into versioned bundles.

aot-build [OPTIONS]                  build (all of it, or one --shard i/n of it)
aot-build merge SHARD_DIR... --out   link the shards' objects into the bundles
aot-build wheel BUNDLE... --out      one pip-installable wheel per architecture of built bundles
aot-build models [CONFIG...]         list model presets (and what local configs map to)

Generic over kernel families (the `cute_aot.families` entry points): every family, shape syntax
and model mapping comes from the installed families' contracts, never from a list kept here.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cute_aot.aot import models as model_shapes
from cute_aot.aot import reproducible
from cute_aot.aot.build import (
    BuildOutcome,
    BuildPlan,
    WrittenBundle,
    buildable_families,
    describe_failures,
    keys_by_arch,
    merge,
    run_build,
)
from cute_aot.aot.build_cache import BuildCache, default_cache_root
from cute_aot.aot.compile_pool import default_jobs
from cute_aot.aot.report import print_summary, report_path, write_report
from cute_aot.aot.shard import Shard
from cute_aot.aot.wheel import write_wheels
from cute_aot.artifacts import settings, signing, terminal
from cute_aot.artifacts.errors import CuteAotError, KeyFileError, TableError
from cute_aot.kernels import KernelFamily, families, family
from cute_aot.kernels.arch import SUPPORTED_ARCHS, normalize_arch
from cute_aot.kernels.contract import Shape
from cute_aot.kernels.tables import read_tables

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

DEFAULT_ARCHS = ("sm_90a", "sm_100a")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    from cute_aot.artifacts.urls import local_path

    local = local_path(value) if value else None
    if local is not None and not local.exists():  # a URL is read (and its errors told) later
        raise click.BadParameter(f"{value} does not exist")
    return value


def plan_from_misses(
    path, archs, named_families, console: Console | None = None
) -> dict[str, list]:
    """{arch: keys} of a miss log (a file, a folder or a URL prefix: every server's), each key
    once per arch, optionally narrowed to some architectures and families.

    Misses this machine cannot build (a family not installed here, an architecture the family
    is not built for, a key of another family version) are skipped, and said so per family.
    """
    from cute_aot.artifacts.miss_log import read_misses

    wanted_archs = {normalize_arch(arch) for arch in archs}
    installed = families()
    plan: dict[str, set] = {}
    skipped: Counter[tuple[str, str]] = Counter()  # (family, why) -> misses
    for record in read_misses(path):
        name = record["family"]
        if named_families and name not in named_families:
            continue
        arch = normalize_arch(record["arch"])
        if wanted_archs and arch not in wanted_archs:
            continue
        if name not in installed:
            skipped[(name, "not installed here")] += 1
            continue
        if not installed[name].supports(arch):
            skipped[(name, f"not built for {arch}")] += 1
            continue
        try:
            key = installed[name].Key.from_fields(record["key"])
        except (TypeError, ValueError):
            skipped[(name, f"keys of another version than v{installed[name].version}")] += 1
            continue
        plan.setdefault(arch, set()).add(key)
    console = console or _console()
    for (name, why), count in sorted(skipped.items()):
        console.print(f"[yellow]skipping {count} misses of family {name!r}:[/yellow] {why}")
    if not plan:
        raise CuteAotError(f"{path}: no misses to build (for the requested archs/families)")
    return {arch: sorted(keys, key=lambda key: key.symbol) for arch, keys in sorted(plan.items())}


def plan_from_record(source, archs, console: Console) -> tuple[dict[str, list], list[tuple]]:
    """({arch: keys}, [(call site, target, arch, why not)]) of records (runtime/record.py: a
    file, a folder or a URL prefix), each distinct kernel once, keys in record order (keys_by_arch
    orders them): each replayable call for every architecture asked (default: the one it was
    recorded on). A call recorded with hardware answers is replayed only for the architecture
    that gave them; recorded on GPUs that answer otherwise, it is one kernel per answer (the
    answers are part of the key id), built side by side."""
    from cute_aot.kernels.recorded import RecordedCallKey, read_records

    wanted = [normalize_arch(arch) for arch in archs]
    plan: dict[str, dict] = {}
    left_out: list[tuple] = []
    distinct: set[str] = set()
    records = read_records(source)
    files = len({where for where, _ in records})
    console.print(f"records: {len(records)} from {files} file(s) in {source}")
    for _, record in records:
        site, target = record.get("site", "?"), record.get("target", "?")
        if not record.get("recreatable") or record.get("servable") is False:
            left_out.append((site, target, record.get("arch") or "-", record.get("reason")))
            continue
        key = RecordedCallKey.from_fields(record["key"])
        distinct.add(key.id)
        recorded_arch = normalize_arch(record["arch"]) if record.get("arch") else None
        for arch in wanted or [recorded_arch]:
            if arch is None:
                left_out.append(
                    (site, target, "-", "recorded without an architecture: name one with --arch")
                )
            elif key.hardware and arch != recorded_arch:
                left_out.append(
                    (
                        site,
                        target,
                        arch,
                        f"its trace asked the {recorded_arch} GPU "
                        f"for {', '.join(sorted(key.hardware))}: replayable there only",
                    )
                )
            else:
                plan.setdefault(arch, {}).setdefault(key.id, key)
    if left_out:
        table = Table(title=f"{len(left_out)} recorded call(s) not built", show_lines=False)
        for column in ("call site", "target", "arch", "why"):
            table.add_column(column, overflow="fold")
        for row in left_out:
            table.add_row(*map(str, row))
        console.print(table)
    plan = {arch: keys for arch, keys in plan.items() if keys}
    if not plan:
        raise CuteAotError(f"{source}: no recorded call to build")
    console.print(f"records: {len(distinct)} distinct kernel(s)")
    return {arch: list(keys.values()) for arch, keys in plan.items()}, left_out


# -- options shared by every command that writes bundles (add new ones here: build and merge
#    both get them through `Output`) ----------------------------------------------------------


@dataclass(frozen=True)
class Output:
    out_dir: Path
    allow_failures: bool
    cache_dir: Path | None
    no_cache: bool
    quiet: bool
    sign_key: Path | None  # signs the bundles written
    cache_sign_key: Path | None  # signs the build cache records published
    cache_trusted_keys: str | None  # cache entries used only when signed by one of these

    def cache(self) -> BuildCache | None:
        """The build cache with this command's trust settings; keys are read here, before any
        compile, so a bad key file fails the command at once (KeyFileError)."""
        if self.no_cache:
            if self.cache_sign_key or self.cache_trusted_keys:
                raise click.UsageError(
                    "--cache-sign-key and --cache-trusted-keys need the build cache: "
                    "leave out --no-cache"
                )
            return None
        sign_key = signing.load_private_key(self.cache_sign_key) if self.cache_sign_key else None
        return BuildCache(
            self.cache_dir or default_cache_root(),
            sign_key=sign_key,
            trusted_keys=_cache_trusted_keys(self.cache_trusted_keys),
        )

    def bundle_signer(self) -> Ed25519PrivateKey | None:
        return signing.load_private_key(self.sign_key) if self.sign_key else None


def _cache_trusted_keys(spec: str | None) -> dict[str, signing.TrustedKey] | None:
    """The keys of --cache-trusted-keys (None: not given, every intact entry is used)."""
    if spec is None:
        return None
    keys = signing.trusted_keys(spec)  # a name that is not there or not a key raises
    if not keys:
        # Trusting no key would refuse every entry: surely a wrong folder, not a wish.
        raise KeyFileError(spec, "--cache-trusted-keys names no public key (*.pem, *.pub)")
    return keys


def sign_bundles(
    console: Console, bundles: list[WrittenBundle], private_key: Ed25519PrivateKey
) -> None:
    """Sign written bundles in place: the one signing step of `aot-build` and `merge`. A file
    another build has replaced since is not this build's to vouch for."""
    for bundle in bundles:
        if bundle.replaced():
            console.print(f"[yellow]not signed:[/yellow] {bundle.path} (another build's bytes)")
            continue
        signed = signing.sign_bundle(bundle.path, private_key)
        key_id = signed.signature["key_id"]
        console.print(f"signed {bundle.path} ({signing.ALGORITHM} key {key_id})")


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
        )
        return command(*args, output=output, **kwargs)

    for option in reversed(OUTPUT_OPTIONS):
        with_output = option(with_output)
    return with_output


def _console() -> Console:
    return terminal.console(stderr=True)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived: the command unwinds (its compile workers are killed, scratch
    removed, no bundle half-written). A KeyboardInterrupt, so no `except Exception` keeps going."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _stop_on_signals(ctx: click.Context) -> None:
    """Raise Stopped on SIGTERM and SIGINT until the command ends; a second one ends the process
    at once (the default), e.g. if cleaning up hangs."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers belong to the main thread; left as they are

    def stop(signum, frame):
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        raise Stopped(signum)

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    ctx.call_on_close(lambda: [signal.signal(n, handler) for n, handler in previous.items()])


def _fail(console: Console, command: str, exc: BaseException) -> None:
    """One line for a failed command, then its exit status (128 + signal if stopped)."""
    if isinstance(exc, Stopped):
        console.print(f"[red]{command} stopped[/red] by {exc}: nothing half-written is left")
        sys.exit(128 + exc.signum)
    message = str(exc)
    if isinstance(exc, OSError) and exc.filename:  # a full disk, a read-only folder...
        message = f"{exc.filename}: {exc.strerror or exc}"
    console.print(f"[red]{command} failed:[/red] {escape(message)}")
    sys.exit(1)


def _describe_cache_use(cache: BuildCache) -> str:
    """`build cache: 3 objects reused, 2 not found, 1 entry refused as untrusted`"""
    line = f"build cache: {cache.hits} objects reused, {cache.misses} not found"
    if cache.trusted_keys is None:
        return line
    refused = f"{cache.untrusted} {'entry' if cache.untrusted == 1 else 'entries'}"
    refused += " refused as untrusted"
    return f"{line}, [yellow]{refused}[/yellow]" if cache.untrusted else f"{line}, {refused}"


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
    if cache:
        console.print(_describe_cache_use(cache))
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


# -- wheels: bundles as pip installs them (aot/wheel.py) -------------------------------------------
WHEEL_OPTION = click.option(
    "--wheel",
    "write_wheel",
    is_flag=True,
    help="Also write one pip-installable wheel per architecture of the bundles written, into "
    "--out beside them (as `aot-build wheel` does).",
)


def _write_wheels(console: Console, bundles, out_dir: Path, **naming) -> None:
    for wheel in write_wheels(bundles, out_dir, **naming):
        console.print(f"wrote {wheel.path} (holds {', '.join(wheel.bundles)})")


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
    if misses_file and (shapes or models or model_configs):
        raise click.UsageError("--from-misses builds exactly the logged keys: no --shape/--model")
    if record_file and (shapes or models or model_configs or misses_file):
        raise click.UsageError(
            "--from-record builds exactly the recorded calls: no --shape/--model/--from-misses"
        )
    console = _console()
    _stop_on_signals(ctx)
    try:
        bundle_signer = output.bundle_signer()  # read first: a bad key fails before compiling
        cache = output.cache()
        # The tables keys were enumerated with, recorded in the bundles; keys from a miss log
        # were asked for with whatever table those servers had, so such bundles record none
        # (and never decide a server's dispatch table).
        tables: dict | None = None
        left_out: list = []
        if record_file:
            plan, left_out = plan_from_record(record_file, archs, console)
            plan = keys_by_arch(plan)
        elif misses_file:
            plan = keys_by_arch(plan_from_misses(misses_file, archs, families, console))
        else:
            build_plan = _plan(
                console, archs, shapes, no_default_shapes, models, model_configs, families
            )
            build_plan.all_tactics = all_tactics
            build_plan.tuning_caches = list(tuning_caches)
            if tables_file:
                build_plan.tables = _read_build_tables(console, tables_file, build_plan)
            tables = build_plan.tables
            plan = keys_by_arch(build_plan)
            _say_archs_without_keys(console, build_plan.archs, plan)
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
                tables=tables,
                record_tables=not (misses_file or record_file),
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
        if bundle_signer:  # last: the reproducibility check compares unsigned builds
            sign_bundles(console, outcome.written, bundle_signer)
        if write_wheel and outcome.written:  # after signing: wheels hold bundles as shipped
            _write_wheels(console, [bundle.path for bundle in outcome.written], output.out_dir)
        if left_out:
            raise CuteAotError(
                f"{len(left_out)} recorded call(s) of {record_file} not built (listed above)"
            )
    except (CuteAotError, OSError, Stopped) as exc:
        _fail(console, "aot-build", exc)


def _read_build_tables(console: Console, path: str, plan: BuildPlan) -> dict:
    """(family, arch) -> Table from a tables file; a table the build has no use for is said."""
    chosen = {}
    for table in read_tables(path):
        arch = normalize_arch(table.arch)
        if table.family not in plan.families or arch not in map(normalize_arch, plan.archs):
            console.print(f"{path}: {table.family} table for {arch} not used (not in this build)")
            continue
        if family(table.family).default_table(arch) is None:
            raise TableError(path, f"{table.family} reads no dispatch table")
        chosen[(table.family, arch)] = table
        console.print(f"{table.family} on {arch}: {table.describe()}")
    return chosen


def _plan(
    console: Console,
    archs: list[str],
    shapes: dict[str, list[Shape]],
    no_default_shapes: bool,
    models: list[str],
    model_configs: list[Path],
    named_families: list[str],
) -> BuildPlan:
    archs = list(dict.fromkeys(normalize_arch(arch) for arch in archs or DEFAULT_ARCHS))
    selected = _select_families(console, archs, named_families, shapes)
    chosen = [model_shapes.preset(name) for name in models]
    chosen += [model_shapes.model_from_config(path) for path in model_configs]
    extra: dict[str, list[Shape]] = {}
    for model in chosen:
        found = model_shapes.shapes_for_models([model], [family(name) for name in selected])
        console.print(f"model {model.name}: {_describe_shapes(found)}")
        _add_shapes(extra, found)
    _add_shapes(extra, shapes)
    return BuildPlan(
        archs=archs,
        families=selected,
        extra_shapes=extra,
        # A model build is that model's shapes; the defaults are themselves model shapes.
        default_shapes=not (no_default_shapes or chosen),
    )


def _select_families(
    console: Console, archs: list[str], named: list[str], shapes: dict[str, list[Shape]]
) -> list[str]:
    """The families to build: the named ones (default: every installed one), each for the
    requested architectures it supports. A family asked for by name (--families, or a --shape
    of its own) that supports none of them is an error; any other is skipped, and said so."""
    outside = [name for name in shapes if named and name not in named]
    if outside:
        raise click.UsageError(
            f"--shape for {', '.join(outside)}, which --families leaves out "
            f"(--families {','.join(named)})"
        )
    explicit = set(named) | set(shapes)
    for name in explicit:
        why = family(name).missing_requirements()
        if why:
            raise click.UsageError(why)
    if not named:
        for name, found in families().items():
            if found.missing_requirements():
                console.print(f"family {name}: skipped ({found.missing_requirements()})")
    named = named or buildable_families()
    skips = BuildPlan(archs, named).skipped_archs()
    selected = []
    for name in named:
        supports, skipped = family(name).archs, skips.get(name, [])
        if len(skipped) < len(archs):
            selected.append(name)
            if skipped:
                console.print(
                    f"family {name}: skipping {', '.join(skipped)} "
                    f"(built for {', '.join(supports)} only)"
                )
        elif name in explicit:
            raise click.UsageError(
                f"family {name} is built for {', '.join(supports)}, none of the requested "
                f"architectures ({', '.join(archs)})"
            )
        else:
            console.print(
                f"family {name}: skipped (built for {', '.join(supports)}, none requested)"
            )
    if not selected:
        raise CuteAotError(f"nothing to build: no kernel family supports {', '.join(archs)}")
    return selected


def _add_shapes(into: dict[str, list[Shape]], shapes: dict[str, list[Shape]]) -> None:
    for name, new in shapes.items():
        found = into.setdefault(name, [])
        found += [shape for shape in new if shape not in found]


def _describe_shapes(shapes: dict[str, list[Shape]]) -> str:
    """`fam 7168,256 4096,256; other (none)`"""
    return "; ".join(
        f"{name} {' '.join(','.join(map(str, shape)) for shape in found) or '(none)'}"
        for name, found in shapes.items()
    )


def _say_archs_without_keys(console: Console, archs: list[str], plan: dict[str, list]) -> None:
    """An architecture can end up with no keys (its families were skipped, or none has shapes
    for it): it gets no bundle, and the operator is told rather than left to wonder."""
    for arch in archs:
        if arch not in plan:
            console.print(f"{arch}: no keys for this architecture, no bundle")
    if not plan:
        raise CuteAotError("nothing to build: the plan has no keys (shapes, families, archs?)")


def _announce(console: Console, plan: dict[str, list], shard: Shard | None, cache) -> None:
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
    _stop_on_signals(ctx)
    try:
        bundle_signer = output.bundle_signer()
        cache = output.cache()
        outcome = merge(
            list(shards), output.out_dir, cache=cache, allow_failures=output.allow_failures
        )
        _finish(console, outcome, output, cache)
        if bundle_signer:
            sign_bundles(console, outcome.written, bundle_signer)
        if write_wheel and outcome.written:
            _write_wheels(console, [bundle.path for bundle in outcome.written], output.out_dir)
    except (CuteAotError, OSError, Stopped) as exc:
        _fail(console, "aot-build merge", exc)


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
        _write_wheels(console, bundles, out_dir, name=name, version=version)
    except (CuteAotError, OSError) as exc:
        _fail(console, "aot-build wheel", exc)


@main.command("models")
@click.argument("configs", nargs=-1, type=click.Path(exists=True, path_type=Path))
def models_command(configs):
    """List the model presets (`--model NAME`) and what local config.json files map to: per
    installed kernel family, the shapes it builds for the model and how many keys they make."""
    console = terminal.console()
    try:
        chosen = list(model_shapes.PRESETS.values())
        chosen += [model_shapes.model_from_config(path) for path in configs]
        installed = list(families().values())
        archs = [arch for arch in SUPPORTED_ARCHS if any(f.supports(arch) for f in installed)]
        table = Table(title="shapes per model and kernel family", title_justify="left")
        for column in ("model", "family", "shapes", *archs, "source"):
            table.add_column(column)
        for model in chosen:
            rows = [(found, model_shapes.family_shapes(model, found)) for found in installed]
            rows = [(found, shapes) for found, shapes in rows if shapes]
            if not rows:
                none = "[dim]none of the installed families serves it[/dim]"
                table.add_row(model.name, "-", none, *["-"] * len(archs), model.source)
            for found, shapes in rows:
                counts = [
                    str(len(found.enumerate_keys(arch, shapes))) if found.supports(arch) else "-"
                    for arch in archs
                ]
                table.add_row(
                    model.name,
                    found.name,
                    f"{found.shape_syntax}: {' '.join(','.join(map(str, s)) for s in shapes)}",
                    *counts,
                    model.source,
                )
        console.print(table)
        console.print(f"columns {', '.join(archs)}: keys per architecture (-: not built for it)")
    except CuteAotError as exc:
        console.print(f"[red]aot-build models:[/red] {escape(str(exc))}")
        sys.exit(1)


if __name__ == "__main__":
    main()
