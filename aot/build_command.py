"""What `aot-build` and `aot-build merge` do once their options are parsed: plan the keys
(planning.py), build them or link the shards (build.py), report (report.py), check that the build
reproduces, sign the bundles (build_signing.py) and write their wheels. A failure raises
(CuteAotError, OSError, Stopped); the command line (cli.py) turns it into the exit status.

A build's outputs in `--out` (its bundles, `<name>.build-report.json`, signatures, wheels) are
written as one unit, so that no interleaving of two builds and no kill pairs a bundle with
another build's report:
- one writer: the build claims `<out>/.<name>.build-claim` (build.py) before its first compile
  and keeps it (`claim_kept_by`) until its last file is written; a second build of that name
  into that folder refuses in one line naming the holder (pid, host, since when); a killed
  holder's claim is taken over by the next build;
- no stale pair after a kill: the report describing the bundles in `--out` is removed once the
  first new bundle is on disk, just before it replaces the old one (a failed write, a full disk,
  keeps the old pair whole), and the new one is written after the last; a kill in between leaves
  bundles without a report, which the next build completes.
A shard build writes its folder and its report outside this unit (its folder holds its rows).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from cute_aot.aot import reproducible
from cute_aot.aot.build import BuildOutcome, merge, run_build
from cute_aot.aot.build_cache import BuildCache
from cute_aot.aot.build_signing import sign_bundles
from cute_aot.aot.compile_pool import Worker
from cute_aot.aot.compile_worker import compile_to_object
from cute_aot.aot.output import Output
from cute_aot.aot.planning import PlanRequest, plan_keys
from cute_aot.aot.report import ConsoleNotes, announce_plan, finish, print_plan, report_path
from cute_aot.aot.shard import Shard, load_shards
from cute_aot.aot.wheel import write_wheels
from cute_aot.artifacts.core.errors import CuteAotError


def build(
    console: Console,
    output: Output,
    request: PlanRequest,
    *,
    name: str,
    bundle_version: str | None,
    jobs: int | None,
    shard: Shard | None,
    check_reproducible: bool,
    write_wheel: bool,
    dry_run: bool = False,
    worker: Worker = compile_to_object,
) -> None:
    """`aot-build`: plan the keys, build them into one bundle per architecture (or build one
    --shard of them), report; then, if asked, rebuild to check the bundles reproduce, sign them
    and write their wheels. `dry_run`: print the plan's keys (report.print_plan) and build
    nothing. `worker`: what compiles one key into an object (compile_pool.Worker)."""
    bundle_signer = output.bundle_signer()  # read first: a bad key fails before compiling
    cache = output.cache()
    plan, tables, left_out = plan_keys(ConsoleNotes(console), request)
    announce_plan(console, plan, shard, cache)
    if dry_run:
        print_plan(plan, output.as_json)
        _refuse_left_out(request, left_out)
        return
    kwargs = {"bundle_version": bundle_version} if bundle_version else {}

    def build_into(out_dir: Path, cache: BuildCache | None, **unit) -> BuildOutcome:
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
            record_tables=not request.exact,
            worker=worker,
            **unit,
            **kwargs,
        )

    with ExitStack() as unit:  # one unit (see above); a shard's folder is swapped whole
        report = [] if shard else [report_path(output.out_dir, name)]
        outcome = build_into(output.out_dir, cache, superseded=report, claim_kept_by=unit)
        finish(console, outcome, output, cache, shard, not_built=left_out)
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
            write_wheel_files(console, [bundle.path for bundle in outcome.written], output.out_dir)
    _refuse_left_out(request, left_out)


def _refuse_left_out(request: PlanRequest, left_out: list) -> None:
    if left_out:
        raise CuteAotError(
            f"{len(left_out)} recorded call(s) of {request.record_file} not built (listed above)"
        )


def merge_shards(
    console: Console, shards: Sequence[Path], output: Output, write_wheel: bool
) -> None:
    """`aot-build merge`: link the shards' objects into bundles, report, sign, write wheels."""
    bundle_signer = output.bundle_signer()
    cache = output.cache()
    merged = load_shards(list(shards))  # its name says which report the merge supersedes
    with ExitStack() as unit:  # one unit, as for `aot-build`
        outcome = merge(
            merged,
            output.out_dir,
            cache=cache,
            allow_failures=output.allow_failures,
            superseded=[report_path(output.out_dir, merged.name)],
            claim_kept_by=unit,
        )
        finish(console, outcome, output, cache)
        if bundle_signer:
            sign_bundles(console, outcome.written, bundle_signer)
        if write_wheel and outcome.written:
            write_wheel_files(console, [bundle.path for bundle in outcome.written], output.out_dir)


def write_wheel_files(console: Console, bundles, out_dir: Path, **naming) -> None:
    """One pip-installable wheel per architecture of these bundles (aot/wheel.py), each said."""
    for wheel in write_wheels(bundles, out_dir, **naming):
        console.print(f"wrote {wheel.path} (holds {', '.join(wheel.bundles)})")
