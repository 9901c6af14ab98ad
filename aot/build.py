"""The build: plan keys -> objects (build cache or compile pool) -> link per architecture -> pack.

Everything is ordered canonically (architectures as in SUPPORTED_ARCHS, keys by symbol), so a
plain build, a cached rebuild and a merge of shards link the same objects in the same order and
write byte-identical bundles.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from cute_aot.aot.build_cache import BuildCache
from cute_aot.aot.compile_pool import CompileCall, Worker, default_jobs, run_compiles
from cute_aot.aot.compile_worker import compile_to_object
from cute_aot.aot.shard import MergeInput, Shard, load_shards, write_shard_file
from cute_aot.artifacts import PACKAGE_VERSION
from cute_aot.artifacts.bundle import bundle_filename, read_manifest, sha256_file
from cute_aot.artifacts.core.atomic import (
    Claimed,
    atomic_write,
    claimed,
    remove_dead_leftovers,
    scratch_folder,
    temporary_name,
)
from cute_aot.artifacts.core.errors import BuildError, BundleError
from cute_aot.artifacts.pack import pack_bundle
from cute_aot.kernels import (
    Tuner,
    TuningCache,
    bundle_facts,
    capability,
    families,
    family,
    table_records,
)
from cute_aot.kernels.arch import SUPPORTED_ARCHS, normalize_arch
from cute_aot.kernels.contract import Shape
from cute_aot.kernels.tables import BuildTables

__all__ = [
    "BuildOutcome",
    "BuildPlan",
    "WrittenBundle",
    "build",
    "default_jobs",
    "merge",
    "run_build",
]


def buildable_families() -> list[str]:
    """Installed families whose required distributions are installed (FlashInfer's kernels are
    built where flashinfer-python is)."""
    return [name for name, found in families().items() if found.missing_requirements() is None]


@dataclass
class BuildPlan:
    """Which keys of which families to build for which architectures.

    Each family is built only for the requested architectures it supports (its `archs`); the
    others are skipped for it (`skipped_archs` says which, for the caller to report).
    """

    archs: list[str]
    # default: every installed family that can be built here (its required distributions are)
    families: list[str] = field(default_factory=lambda: buildable_families())
    extra_shapes: dict[str, list[Shape]] = field(default_factory=dict)  # family -> shapes
    default_shapes: bool = True
    all_tactics: bool = False  # also every tuning candidate of the shapes (for aot-tune)
    # Another library's saved autotuning results (aot-build --flashinfer-tuned): their keys too
    tuning_caches: list[Path] = field(default_factory=list)
    tables: BuildTables = field(
        default_factory=dict
    )  # (family, arch) -> table (aot-build --tables)

    def shapes(self, name: str) -> list[Shape]:
        """The family's shapes: its defaults (unless left out), then the extra ones, each once."""
        shapes = list(family(name).default_shapes) if self.default_shapes else []
        for shape in self.extra_shapes.get(name, ()):
            if shape not in shapes:
                shapes.append(shape)
        return shapes

    def families_for(self, arch: str) -> list[str]:
        return [name for name in self.families if family(name).supports(normalize_arch(arch))]

    def skipped_archs(self) -> dict[str, list[str]]:
        """{family: requested architectures it does not support}, for families that skip any."""
        requested = list(dict.fromkeys(normalize_arch(arch) for arch in self.archs))
        skipped = {
            name: [arch for arch in requested if not family(name).supports(arch)]
            for name in self.families
        }
        return {name: archs for name, archs in skipped.items() if archs}

    def keys(self, arch: str) -> list:
        arch = normalize_arch(arch)
        keys = []
        for name in self.families_for(arch):
            found = family(name)
            keys += found.enumerate_keys(arch, self.shapes(name), self.tables.get((name, arch)))
            tuner = capability(found, Tuner)
            if self.all_tactics and tuner:  # every candidate aot-tune would time for these shapes
                keys += [
                    key
                    for shape in self.shapes(name)
                    for problem in tuner.tune_problems(shape)
                    for key in tuner.tune_candidates(problem, arch)
                ]
            if saved := capability(found, TuningCache):
                for path in self.tuning_caches:
                    keys += saved.keys_from_tuning_cache(Path(path), arch)
        return keys


def keys_by_arch(plan: BuildPlan | dict[str, list]) -> dict[str, list]:
    """{arch: keys} in canonical order: archs by SUPPORTED_ARCHS, keys by symbol, each once.

    An architecture with no keys is left out: there is nothing to link into its bundle.
    """
    if isinstance(plan, BuildPlan):
        plan = {normalize_arch(arch): plan.keys(normalize_arch(arch)) for arch in plan.archs}
    resolved: dict[str, dict] = {}
    for arch, keys in plan.items():
        resolved.setdefault(normalize_arch(arch), {}).update({key.symbol: key for key in keys})
    order = list(SUPPORTED_ARCHS)
    return {
        arch: [by_symbol[symbol] for symbol in sorted(by_symbol)]
        for arch, by_symbol in sorted(resolved.items(), key=lambda item: order.index(item[0]))
        if by_symbol
    }


@dataclass(frozen=True)
class WrittenBundle:
    """The bundle file this build wrote, described from its bytes in memory: another build into
    the same folder may have replaced the file since."""

    path: Path
    arch: str
    kernels: int
    size: int
    sha256: str

    def replaced(self) -> bool:
        """Whether the file at `path` is no longer the bytes this build wrote."""
        try:
            return sha256_file(self.path)[0] != self.sha256
        except OSError:
            return True


@dataclass
class BuildOutcome:
    name: str  # of the bundles
    rows: list[dict]  # one per planned key (of this shard), in canonical order
    bundles: list[Path] = field(default_factory=list)
    incomplete: dict[str, int] = field(default_factory=dict)  # arch -> failed keys, no bundle
    shard_folder: Path | None = None
    jobs: int = 0
    seconds: float = 0.0
    written: list[WrittenBundle] = field(default_factory=list)  # the bundles, as written

    @property
    def failed(self) -> list[dict]:
        return [row for row in self.rows if row["status"] != "ok"]


def run_build(
    plan: BuildPlan | dict[str, list],
    out_dir: Path,
    *,
    name: str = "default",
    bundle_version: str = PACKAGE_VERSION,
    jobs: int | None = None,
    cache: BuildCache | None = None,
    allow_failures: bool = False,
    shard: Shard | None = None,
    show_progress: bool = True,
    worker: Worker = compile_to_object,
    tables: BuildTables | None = None,
    record_tables: bool = True,
    superseded: Sequence[Path] = (),
    claim_kept_by: ExitStack | None = None,
) -> BuildOutcome:
    """Build every planned key (or one shard's slice of them) into out_dir.

    `tables`: the dispatch tables the plan's keys were enumerated with (default: those of a
    BuildPlan, else the packages' own); each bundle records them, unless not `record_tables`.

    A failed key never stops the others; its architecture gets no bundle unless allow_failures,
    in which case the bundle holds the keys that compiled. A shard writes its objects and rows
    to `out_dir/<name>.shard-<i>-of-<n>/` for `merge` instead of bundles.

    A bundle file holding families the plan leaves out is never replaced (BuildError, before
    anything compiles); what killed builds left behind is removed first.

    A plain build claims `<out_dir>/<name>-*` while it runs (_one_build_of), or, given
    `claim_kept_by`, until that ExitStack closes: `aot-build` keeps it until its report is
    written. `superseded`: the files that describe the bundles in out_dir (that report), removed
    before the first bundle is replaced.
    """
    started = time.perf_counter()
    if tables is None:
        tables = plan.tables if isinstance(plan, BuildPlan) else {}
    plan_keys = keys_by_arch(plan)
    out_dir = Path(out_dir)
    _remove_dead_leftovers(out_dir)
    todo = [(arch, key) for arch, keys in plan_keys.items() for key in keys]
    if shard:
        todo = shard.select(todo)
    with ExitStack() as held:
        if not shard:  # its bundles and report are replaced as one unit: one build at a time
            (claim_kept_by or held).enter_context(_one_build_of(out_dir, name))
            refuse_to_drop_families(plan_keys, out_dir, name)
        with _work_folder(out_dir, shard.folder_name(name) if shard else None) as folder:
            rows, jobs = _make_objects(todo, folder / "objects", jobs, cache, show_progress, worker)
            outcome = BuildOutcome(
                name, [rows[(arch, key.symbol)] for arch, key in todo], jobs=jobs
            )
            if shard:
                write_shard_file(
                    folder,
                    shard,
                    name,
                    bundle_version,
                    plan_keys,
                    outcome.rows,
                    tables if record_tables else None,
                )
                outcome.shard_folder = out_dir / shard.folder_name(name)
            else:
                outcome.written, outcome.incomplete = write_bundles(
                    plan_keys,
                    rows,
                    out_dir,
                    name,
                    bundle_version,
                    cache,
                    allow_failures,
                    tables if record_tables else None,
                    record_tables,
                    superseded,
                )
                outcome.bundles = [bundle.path for bundle in outcome.written]
    outcome.seconds = time.perf_counter() - started
    return outcome


def merge(
    shards: list[Path] | MergeInput,
    out_dir: Path,
    *,
    cache: BuildCache | None = None,
    allow_failures: bool = False,
    superseded: Sequence[Path] = (),
    claim_kept_by: ExitStack | None = None,
) -> BuildOutcome:
    """Link the objects of every shard of one build (their folders, or them loaded) into its
    bundles, as a plain build would (`superseded` and `claim_kept_by` as for run_build)."""
    started = time.perf_counter()
    merged = shards if isinstance(shards, MergeInput) else load_shards(shards)
    rows = [
        merged.rows[(arch, k.symbol)] for arch, keys in merged.keys_by_arch.items() for k in keys
    ]
    _remove_dead_leftovers(Path(out_dir))
    with ExitStack() as held:
        (claim_kept_by or held).enter_context(_one_build_of(Path(out_dir), merged.name))
        refuse_to_drop_families(merged.keys_by_arch, Path(out_dir), merged.name)
        written, incomplete = write_bundles(
            merged.keys_by_arch,
            merged.rows,
            Path(out_dir),
            merged.name,
            merged.bundle_version,
            cache,
            allow_failures,
            merged.tables,
            merged.record_tables,
            superseded,
        )
    return BuildOutcome(
        merged.name,
        rows,
        [bundle.path for bundle in written],
        incomplete,
        seconds=time.perf_counter() - started,
        written=written,
    )


@contextmanager
def _one_build_of(out_dir: Path, name: str) -> Iterator[None]:
    """This build's claim on `<out_dir>/<name>-*` and their report: a second build of the same
    name into the same folder refuses, naming the one that holds it (a build of another name goes
    on beside it). The claim is a lock file that names its holder (atomic.claimed: link(), no
    flock, which NFS does not keep); a killed holder's is taken over by the next build."""
    try:
        with claimed(out_dir / f".{name}.build-claim"):
            yield
    except Claimed as held:
        who = {field: held.holder.get(field, "?") for field in ("pid", "host", "since")}
        if held.holder:
            writer = f"pid {who['pid']} on {who['host']}, since {who['since']}"
        else:  # lost the takeover of a dead build's claim to a build not yet named there
            writer = "one taking over a dead build's claim; which one is not known yet"
        raise BuildError(
            f"{out_dir}: another aot-build of '{name}' is writing there ({writer}); wait for "
            "it, or build into another --out"
        ) from None


def build(
    plan: BuildPlan | dict[str, list],
    out_dir: Path,
    name: str = "default",
    bundle_version: str = PACKAGE_VERSION,
    jobs: int | None = None,
    show_progress: bool = True,
    cache: BuildCache | None = None,
    worker: Worker = compile_to_object,
) -> list[Path]:
    """Build one bundle per architecture into out_dir; returns their paths.

    `plan` is a BuildPlan, or explicitly {arch: [keys]}. A failed key raises BuildError naming
    every failed key and architecture, after the architectures that compiled completely have
    been written; no bundle file is ever left half-written. `worker` compiles one key (as
    run_build's).
    """
    outcome = run_build(
        plan,
        out_dir,
        name=name,
        bundle_version=bundle_version,
        jobs=jobs,
        cache=cache,
        show_progress=show_progress,
        worker=worker,
    )
    if outcome.failed:
        raise BuildError(describe_failures(outcome.failed, len(outcome.rows)))
    return outcome.bundles


def describe_failures(failed: list[dict], total: int, limit: int = 20) -> str:
    """The failed keys, each with its family, key id, architecture and error (first `limit`)."""
    lines = [f"  {r['family']} key {r['key_id']} on {r['arch']}: {r['error']}" for r in failed]
    if len(lines) > limit:
        lines = lines[:limit] + [f"  ... and {len(lines) - limit} more (see the build report)"]
    return f"{len(failed)} of {total} kernels failed to compile:\n" + "\n".join(lines)


def refuse_to_drop_families(plan_keys: dict[str, list], out_dir: Path, name: str) -> None:
    """A BuildError if a bundle this plan would replace holds families the plan leaves out
    (`aot-build --families X` into a folder of every family's bundles must not drop them)."""
    for arch, keys in plan_keys.items():
        path = Path(out_dir) / bundle_filename(name, arch)
        if not path.exists():
            continue
        try:
            held = set(read_manifest(path).families)
        except BundleError:  # not a bundle this version reads: nothing known to lose
            continue
        building = {key.FAMILY for key in keys}
        if held - building:
            raise BuildError(
                f"{path} holds {', '.join(sorted(held - building))}, which this build of "
                f"{', '.join(sorted(building))} leaves out: give the new bundle a name of its own "
                f"(--name NAME; servers load every bundle of a folder), or remove {path} first "
                "to replace it"
            )


def _remove_dead_leftovers(out_dir: Path) -> None:
    """Temporary files and scratch folders of builds that were killed (SIGKILL, power loss)."""
    remove_dead_leftovers(out_dir)
    remove_dead_leftovers(tempfile.gettempdir())


@contextmanager
def _work_folder(out_dir: Path, shard_folder: str | None) -> Iterator[Path]:
    """Scratch for a plain build; for a shard, a folder that replaces `shard_folder` at the end."""
    if shard_folder is None:
        with scratch_folder("cute-aot-build") as scratch:
            yield scratch
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / temporary_name(f".{shard_folder}", folder=True)
    work.mkdir()
    work.chmod(0o755)  # whatever the umask: CI artifact uploads and other users read it
    try:
        yield work
        final = out_dir / shard_folder
        # The previous folder is renamed aside, not deleted, until the new one is in place (a
        # kill in between leaves it under a temporary name the next build reaps).
        aside = out_dir / temporary_name(f".{shard_folder}", folder=True)
        with suppress(FileNotFoundError):
            os.rename(final, aside)
        os.replace(work, final)  # a shard folder is complete or absent
        shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _make_objects(todo, objects_dir, jobs, cache, show_progress, worker):
    """Objects for every (arch, key): from the cache where possible, else compiled."""
    rows: dict[tuple[str, str], dict] = {}
    planned = {(arch, key.symbol): key for arch, key in todo}
    calls = []
    for arch, key in todo:
        target = objects_dir / arch / f"{key.symbol}.o"
        row = cache.fetch_object(key, arch, target) if cache else None
        if row is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            calls.append(CompileCall(key, arch, target.parent))
        else:
            rows[(arch, key.symbol)] = row
    jobs = max(1, min(jobs or default_jobs(), len(calls) or 1))
    with _compile_progress(len(todo), len(rows), show_progress) as on_compiled:

        def on_row(row: dict) -> None:
            row.setdefault("cached", False)
            where = (row["arch"], row["symbol"])
            rows[where] = row
            if cache and row["status"] == "ok":
                cache.store_object(planned[where], row["arch"], row)
            on_compiled(row)

        run_compiles(calls, jobs, on_row, worker)
    return rows, jobs


@contextmanager
def _compile_progress(total: int, cached: int, show: bool):
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    failed = 0

    def note() -> str:
        return f"{cached} cached" + (f", [red]{failed} failed[/red]" if failed else "")

    with Progress(*columns, disable=not show, transient=False) as progress:
        # Cached keys count as done from the start, so the ETA reflects compiles only.
        bar = progress.add_task("compiling", total=total, completed=cached, note=note())

        def on_compiled(row: dict) -> None:
            nonlocal failed
            failed += row["status"] != "ok"
            progress.update(bar, advance=1, note=note())

        yield on_compiled


def write_bundles(
    plan_keys: dict[str, list],
    rows: dict[tuple[str, str], dict],
    out_dir: Path,
    name: str,
    bundle_version: str,
    cache: BuildCache | None,
    allow_failures: bool,
    tables: BuildTables | None = None,
    record_tables: bool = True,
    superseded: Sequence[Path] = (),
) -> tuple[list[WrittenBundle], dict[str, int]]:
    """One bundle per architecture whose keys all compiled (or, allowing failures, any did).

    The `superseded` files are removed once the first new bundle is on disk, just before it
    replaces the old one: a failed write keeps the old pair whole, and a kill between a bundle's
    rename and its new report's write leaves bundles without a report, never beside a report of
    other bytes."""
    written, incomplete = [], {}
    superseded = list(superseded)
    for arch, keys in plan_keys.items():
        good = [key for key in keys if rows[(arch, key.symbol)]["status"] == "ok"]
        if len(good) < len(keys):
            incomplete[arch] = len(keys) - len(good)
            if not allow_failures or not good:
                continue
        objects = {key: rows[(arch, key.symbol)] for key in good}
        written.append(
            _write_bundle(
                arch,
                objects,
                out_dir,
                name,
                bundle_version,
                cache,
                tables,
                record_tables,
                superseded,
            )
        )
    return written, incomplete


def _write_bundle(
    arch, objects, out_dir, name, bundle_version, cache, tables, record, superseded
) -> WrittenBundle:
    ordered = [objects[key] for key in sorted(objects, key=lambda key: key.symbol)]
    records = table_records({key.FAMILY for key in objects}, arch, tables) if record else {}
    digest = cache.bundle_digest(name, arch, bundle_version, ordered, records) if cache else None
    data = cache.fetch_bundle(digest) if cache else None
    if data is None:
        try:
            families = bundle_facts({key.FAMILY for key in objects}, arch, records)
            _, data = pack_bundle(name, arch, objects, families, bundle_version)
        except BuildError as exc:
            raise BuildError(f"bundle {name!r} for {arch}: {exc}") from None
        if cache:
            cache.store_bundle(digest, data)
    path = out_dir / bundle_filename(name, arch)
    if not _same_bytes(path, data):  # an unchanged bundle keeps its file (and mtime)
        try:  # the old report stays until the new bytes are on disk: a failed write keeps it
            atomic_write(path, data, before_replace=functools.partial(_remove_all, superseded))
        except OSError as exc:  # e.g. a full disk: the previous file, if any, is untouched
            raise BuildError(f"cannot write {path}: {exc.strerror or exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    return WrittenBundle(path, arch, len(objects), len(data), digest)


def _remove_all(superseded: list[Path]) -> None:
    """Remove the files that describe the bundles being replaced; the list is shared by the
    architectures, emptied by the first bundle replaced."""
    while superseded:
        superseded[-1].unlink(missing_ok=True)
        superseded.pop()


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False
