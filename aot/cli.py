"""`aot-build`: cross-compile every dispatch key for each architecture into versioned bundles."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.console import Console

from cute_aot.aot.build import BuildPlan, build, default_jobs
from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.errors import CuteAotError
from cute_aot.kernels import FAMILIES, family
from cute_aot.kernels.arch import normalize_arch
from cute_aot.runtime.misses import read_misses

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


def plan_from_misses(path, archs, families) -> dict[str, list]:
    """{arch: keys} of a miss log, optionally narrowed to some architectures and families."""
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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--arch",
    "archs",
    multiple=True,
    help=f"Target GPU architecture, repeatable (default: {' '.join(DEFAULT_ARCHS)}).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bundles"),
    show_default=True,
    help="Output folder for bundles.",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    callback=_parse_shape,
    help="Extra router_gemm weight shape K,N (repeatable), added to the defaults.",
)
@click.option("--no-default-shapes", is_flag=True, help="Build only the --shape shapes.")
@click.option(
    "--family",
    "families",
    multiple=True,
    type=click.Choice(FAMILIES),
    help="Kernel families to build (default: all).",
)
@click.option("--name", default="default", show_default=True, help="Bundle name.")
@click.option("--bundle-version", default=None, help="Version recorded in the manifest.")
@click.option(
    "-j",
    "--jobs",
    type=int,
    default=None,
    help=f"Compile worker processes (default: {default_jobs()}).",
)
@click.option(
    "--from-misses",
    "misses_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Build exactly the keys of a runtime miss log (CUTE_AOT_MISS_LOG).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def main(
    archs,
    out_dir,
    shapes,
    no_default_shapes,
    families,
    name,
    bundle_version,
    jobs,
    misses_file,
    quiet,
):
    """Cross-compile CuTe DSL kernels on this (CPU-only) machine into one bundle per architecture."""
    console = Console(stderr=True, soft_wrap=True)
    started = time.perf_counter()
    try:
        if misses_file:
            plan = plan_from_misses(misses_file, archs, families)
        else:
            plan = BuildPlan(
                archs=list(archs or DEFAULT_ARCHS),
                families=list(families or FAMILIES),
                extra_shapes={"router_gemm": shapes},
                default_shapes=not no_default_shapes,
            )
        kwargs = {"bundle_version": bundle_version} if bundle_version else {}
        paths = build(plan, out_dir, name=name, jobs=jobs, show_progress=not quiet, **kwargs)
    except CuteAotError as exc:
        console.print(f"[red]aot-build failed:[/red] {exc}")
        sys.exit(1)
    for path in paths:
        manifest = read_manifest(path)
        console.print(
            f"wrote {path} ({manifest.arch}, {len(manifest.entries)} kernels, "
            f"{path.stat().st_size / 1024:.0f} KiB)"
        )
    console.print(f"done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
