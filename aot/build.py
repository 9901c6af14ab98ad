"""The build: enumerate keys -> compile in worker processes -> link per architecture -> pack."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cute_aot.aot.compile_worker import compile_to_object
from cute_aot.aot.pack import pack_bundle
from cute_aot.artifacts import PACKAGE_VERSION
from cute_aot.artifacts.atomic import atomic_write
from cute_aot.artifacts.bundle import bundle_filename
from cute_aot.artifacts.errors import BuildError
from cute_aot.kernels import family
from cute_aot.kernels.arch import normalize_arch


@dataclass
class BuildPlan:
    """Which keys of which families to build for which architectures."""

    archs: list[str]
    families: list[str] = field(default_factory=lambda: ["router_gemm"])
    extra_shapes: dict[str, list[tuple]] = field(default_factory=dict)  # family -> shapes
    default_shapes: bool = True

    def keys(self, arch: str) -> list:
        keys = []
        for name in self.families:
            module = family(name)
            shapes = list(module.DEFAULT_SHAPES) if self.default_shapes else []
            shapes += [s for s in self.extra_shapes.get(name, []) if s not in shapes]
            keys += module.enumerate_keys(arch, shapes)
        return keys


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _pool(jobs: int) -> ProcessPoolExecutor:
    # spawn: workers start clean (no forked locks or CUDA state); each imports cutlass once.
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))


def compile_objects(tasks: list[tuple], jobs: int, progress: Progress | None) -> list[dict]:
    """Run compile_to_object over tasks (family, key_fields, arch, out_dir)."""
    rows = []
    bar = progress.add_task("compiling", total=len(tasks)) if progress else None
    if jobs <= 1:
        for task in tasks:
            rows.append(compile_to_object(*task))
            if progress:
                progress.advance(bar)
        return rows
    with _pool(jobs) as pool:
        futures = [pool.submit(compile_to_object, *task) for task in tasks]
        for future in as_completed(futures):
            rows.append(future.result())
            if progress:
                progress.advance(bar)
    return rows


def build(
    plan: BuildPlan | dict[str, list],
    out_dir: Path,
    name: str = "default",
    bundle_version: str = PACKAGE_VERSION,
    jobs: int | None = None,
    show_progress: bool = True,
) -> list[Path]:
    """Build one bundle per architecture into out_dir; returns their paths.

    `plan` is a BuildPlan, or explicitly {arch: [keys]}.

    A bundle is written only when every key of its architecture compiled: a failed key raises
    BuildError naming the key and architecture, and no bundle file is left half-written.
    """
    if isinstance(plan, BuildPlan):
        archs = [normalize_arch(arch) for arch in plan.archs]
        keys_by_arch = {arch: plan.keys(arch) for arch in archs}
    else:
        keys_by_arch = {normalize_arch(arch): list(keys) for arch, keys in plan.items()}
    jobs = jobs or default_jobs()
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="cute-aot-build-") as scratch:
        tasks = []
        for arch, keys in keys_by_arch.items():
            (Path(scratch) / arch).mkdir()
            tasks += [(key.FAMILY, key.fields(), arch, str(Path(scratch) / arch)) for key in keys]
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, disable=not show_progress, transient=False) as progress:
            rows = compile_objects(tasks, jobs, progress)
        failed = [row for row in rows if row["status"] != "ok"]
        if failed:
            lines = [
                f"  {r['family']} key {r['key_id']} on {r['arch']}: {r['error']}" for r in failed
            ]
            raise BuildError(
                f"{len(failed)} of {len(rows)} kernels failed to compile:\n" + "\n".join(lines)
            )
        by_symbol = {(row["arch"], row["symbol"]): row for row in rows}
        paths = []
        for arch, keys in keys_by_arch.items():
            paths.append(_link_and_pack(arch, keys, by_symbol, out_dir, name, bundle_version))
    return paths


def _link_and_pack(arch, keys, rows, out_dir, name, bundle_version) -> Path:
    objects = {key: rows[(arch, key.symbol)] for key in keys}
    _, data = pack_bundle(name, arch, objects, bundle_version)
    path = out_dir / bundle_filename(name, arch)
    atomic_write(path, data)
    return path
