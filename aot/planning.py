"""What to build: {arch: keys} from `aot-build`'s parsed options (architectures, families,
shapes, models, tables), from servers' miss logs (--from-misses) or from recorded calls
(--from-record); what is left out, and why, is said to a `Notes` (the build's console,
report.ConsoleNotes). Pure planning: no click, no rich, so it is tested without a command line;
options that contradict each other raise RequestError, which the command line turns into its
usage error."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cute_aot.aot import models as model_shapes
from cute_aot.aot.build import BuildPlan, buildable_families, keys_by_arch
from cute_aot.artifacts.core.errors import CuteAotError, TableError, UnsupportedProblemError
from cute_aot.kernels import families, family
from cute_aot.kernels.arch import normalize_arch
from cute_aot.kernels.contract import Shape
from cute_aot.kernels.tables import read_tables

DEFAULT_ARCHS = ("sm_90a", "sm_100a")

# A recorded call left out of the build: (call site, target, arch, why not).
NotBuilt = tuple[str, str, str, str | None]


class RequestError(ValueError):
    """Options that cannot be built together (a --shape of a family --families leaves out...):
    the command line reports it as its usage error, exit status 2."""


class Notes(Protocol):
    """Where planning says what it chose and what it left out, and why."""

    def note(self, text: str) -> None: ...

    def warning(self, text: str) -> None: ...

    def not_built(self, calls: list[NotBuilt]) -> None: ...


class StderrNotes:
    """Notes as plain lines on stderr; the calls not built one per line, tab-separated, whole."""

    def note(self, text: str) -> None:
        print(text, file=sys.stderr)

    warning = note

    def not_built(self, calls: list[NotBuilt]) -> None:
        print(f"{len(calls)} recorded call(s) not built", file=sys.stderr)
        for call in [("call site", "target", "arch", "why"), *calls]:
            print("\t".join(map(str, call)), file=sys.stderr)


@dataclass(frozen=True)
class PlanRequest:
    """What `aot-build` was asked to build, as parsed from its options."""

    archs: list[str]
    shapes: dict[str, list[Shape]]
    no_default_shapes: bool
    tables_file: str | None
    all_tactics: bool
    tuning_caches: Sequence[Path]
    models: list[str]
    model_configs: Sequence[Path]
    named_families: list[str]
    misses_file: str | None
    record_file: str | None

    @property
    def exact(self) -> bool:
        """Whether the keys are exactly the ones a record or a miss log names (the bundles
        then record no dispatch table: they never decide a server's)."""
        return bool(self.misses_file or self.record_file)


def plan_keys(
    notes: Notes, request: PlanRequest
) -> tuple[dict[str, list], dict | None, list[NotBuilt]]:
    """({arch: keys} to build, the tables they were enumerated with, the recorded calls left out)
    of `aot-build`'s options: the recorded calls, the logged misses, or else the plan of the
    architectures, families, shapes and models asked for."""
    # The tables keys were enumerated with, recorded in the bundles; keys from a miss log
    # were asked for with whatever table those servers had, so such bundles record none
    # (and never decide a server's dispatch table).
    tables: dict | None = None
    left_out: list = []
    if request.record_file:
        plan, left_out = plan_from_record(request.record_file, request.archs, notes)
        plan = keys_by_arch(plan)
    elif request.misses_file:
        plan = keys_by_arch(
            plan_from_misses(request.misses_file, request.archs, request.named_families, notes)
        )
    else:
        build_plan = _plan(
            notes,
            request.archs,
            request.shapes,
            request.no_default_shapes,
            request.models,
            request.model_configs,
            request.named_families,
        )
        build_plan.all_tactics = request.all_tactics
        build_plan.tuning_caches = list(request.tuning_caches)
        if request.tables_file:
            build_plan.tables = _read_build_tables(notes, request.tables_file, build_plan)
        tables = build_plan.tables
        plan = keys_by_arch(build_plan)
        _say_archs_without_keys(notes, build_plan.archs, plan)
    return plan, tables, left_out


def plan_from_misses(path, archs, named_families, notes: Notes | None = None) -> dict[str, list]:
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
        arch = _known_arch(record["arch"])
        if arch is None:
            skipped[(name, f"an architecture cute-aot does not build ({record['arch']!r})")] += 1
            continue
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
    notes = notes or StderrNotes()
    for (name, why), count in sorted(skipped.items()):
        notes.warning(f"skipping {count} misses of family {name!r}: {why}")
    if not plan:
        raise CuteAotError(f"{path}: no misses to build (for the requested archs/families)")
    return {arch: sorted(keys, key=lambda key: key.symbol) for arch, keys in sorted(plan.items())}


def plan_from_record(source, archs, notes: Notes) -> tuple[dict[str, list], list[NotBuilt]]:
    """({arch: keys}, [(call site, target, arch, why not)]) of records (runtime/capture/record.py: a
    file, a folder or a URL prefix), each distinct kernel once, keys in record order (keys_by_arch
    orders them): each replayable call for every architecture asked (default: the one it was
    recorded on). A call recorded with hardware answers is replayed only for the architecture
    that gave them; recorded on GPUs that answer otherwise, it is one kernel per answer (the
    answers are part of the key id), built side by side."""
    from cute_aot.kernels.recorded import RecordedCallKey, read_records

    wanted = [normalize_arch(arch) for arch in archs]
    plan: dict[str, dict] = {}
    left_out: list[NotBuilt] = []
    distinct: set[str] = set()
    records = read_records(source)
    files = len({where for where, _ in records})
    notes.note(f"records: {len(records)} from {files} file(s) in {source}")
    for _, record in records:
        site, target = record.get("site", "?"), record.get("target", "?")
        if not record.get("recreatable") or record.get("servable") is False:
            left_out.append((site, target, record.get("arch") or "-", record.get("reason")))
            continue
        key = RecordedCallKey.from_fields(record["key"])  # RECORD_SCHEMA checked it
        recorded_arch = _known_arch(record["arch"]) if record.get("arch") else None
        if record.get("arch") and recorded_arch is None:
            why = "an architecture cute-aot does not build"
            left_out.append((site, target, record["arch"], why))
            continue
        distinct.add(key.id)
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
        notes.not_built(left_out)
    plan = {arch: keys for arch, keys in plan.items() if keys}
    if not plan:
        raise CuteAotError(f"{source}: no recorded call to build")
    notes.note(f"records: {len(distinct)} distinct kernel(s)")
    return {arch: list(keys.values()) for arch, keys in plan.items()}, left_out


def _known_arch(name: str) -> str | None:
    """A recorded architecture's canonical name; None for one this release does not build."""
    try:
        return normalize_arch(name)
    except UnsupportedProblemError:
        return None


def _read_build_tables(notes: Notes, path: str, plan: BuildPlan) -> dict:
    """(family, arch) -> Table from a tables file; a table the build has no use for is said."""
    chosen = {}
    for table in read_tables(path):
        arch = normalize_arch(table.arch)
        if table.family not in plan.families or arch not in map(normalize_arch, plan.archs):
            notes.note(f"{path}: {table.family} table for {arch} not used (not in this build)")
            continue
        if family(table.family).default_table(arch) is None:
            raise TableError(path, f"{table.family} reads no dispatch table")
        chosen[(table.family, arch)] = table
        notes.note(f"{table.family} on {arch}: {table.describe()}")
    return chosen


def _plan(
    notes: Notes,
    archs: list[str],
    shapes: dict[str, list[Shape]],
    no_default_shapes: bool,
    models: list[str],
    model_configs: list[Path],
    named_families: list[str],
) -> BuildPlan:
    archs = list(dict.fromkeys(normalize_arch(arch) for arch in archs or DEFAULT_ARCHS))
    selected = _select_families(notes, archs, named_families, shapes)
    chosen = [model_shapes.preset(name) for name in models]
    chosen += [model_shapes.model_from_config(path) for path in model_configs]
    extra: dict[str, list[Shape]] = {}
    for model in chosen:
        found = model_shapes.shapes_for_models([model], [family(name) for name in selected])
        notes.note(f"model {model.name}: {_describe_shapes(found)}")
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
    notes: Notes, archs: list[str], named: list[str], shapes: dict[str, list[Shape]]
) -> list[str]:
    """The families to build: the named ones (default: every installed one), each for the
    requested architectures it supports. A family asked for by name (--families, or a --shape
    of its own) that supports none of them is an error; any other is skipped, and said so."""
    outside = [name for name in shapes if named and name not in named]
    if outside:
        raise RequestError(
            f"--shape for {', '.join(outside)}, which --families leaves out "
            f"(--families {','.join(named)})"
        )
    explicit = set(named) | set(shapes)
    for name in explicit:
        why = family(name).missing_requirements()
        if why:
            raise RequestError(why)
    if not named:
        for name, found in families().items():
            if found.missing_requirements():
                notes.note(f"family {name}: skipped ({found.missing_requirements()})")
    named = named or buildable_families()
    skips = BuildPlan(archs, named).skipped_archs()
    selected = []
    for name in named:
        supports, skipped = family(name).archs, skips.get(name, [])
        if len(skipped) < len(archs):
            selected.append(name)
            if skipped:
                notes.note(
                    f"family {name}: skipping {', '.join(skipped)} "
                    f"(built for {', '.join(supports)} only)"
                )
        elif name in explicit:
            raise RequestError(
                f"family {name} is built for {', '.join(supports)}, none of the requested "
                f"architectures ({', '.join(archs)})"
            )
        else:
            notes.note(f"family {name}: skipped (built for {', '.join(supports)}, none requested)")
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


def _say_archs_without_keys(notes: Notes, archs: list[str], plan: dict[str, list]) -> None:
    """An architecture can end up with no keys (its families were skipped, or none has shapes
    for it): it gets no bundle, and the operator is told rather than left to wonder."""
    for arch in archs:
        if arch not in plan:
            notes.note(f"{arch}: no keys for this architecture, no bundle")
    if not plan:
        raise CuteAotError("nothing to build: the plan has no keys (shapes, families, archs?)")
