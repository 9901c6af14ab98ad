"""`aot-tune`: time every candidate tactic of a family on this GPU, keep the fastest correct one
per problem, and write the winners as a dispatch table (kernels/tables.py) with its provenance.

    aot-tune --family FAMILY --bundles bundles --out tables.json
    aot-build --arch sm90a --tables tables.json        # bundles that carry and use the table

Candidates come from bundles built with `aot-build --all-tactics` (no compiler needed here) or,
for keys no bundle holds, from JIT (cutlass-dsl installed). Each candidate is checked against
the family's torch reference before it may win. Measurements go to a results file (JSON lines)
as they are made, so an interrupted run resumes where it stopped.

The timing (aot/tools/aot_tune/timing.py) replays CUDA graphs of many calls, operands cycled
out of L2. Kernels that use PDL keep it on: consecutive calls in the graph overlap as they do in a
model's forward pass, which is what the tactic is chosen for.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cute_aot.aot import models as model_shapes
from cute_aot.aot.tools.aot_tune.timing import (
    operand_copies,
    seconds_per_call,
    seconds_per_call_each,
)
from cute_aot.artifacts import PACKAGE_VERSION
from cute_aot.artifacts.core import settings, terminal
from cute_aot.artifacts.core.errors import CuteAotError
from cute_aot.artifacts.core.json_lines import append_line, read_objects
from cute_aot.kernels import KernelFamily, TorchReference, capability, contract, family
from cute_aot.kernels.arch import normalize_arch
from cute_aot.kernels.tables import Table, read_tables, write_tables

RELATIVE_TOLERANCE = 0.02  # of the reference's largest magnitude: catches wrong kernels, not ulps


def tensors_for(found: KernelFamily, problem, seed: int):
    """Random inputs of a problem in ABI order (None for an optional input left out)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    inputs = []
    for arg, shape in zip(found.inputs, found.input_shapes(problem), strict=True):
        if shape is None:
            inputs.append(None)
            continue
        values = torch.randn(shape, device="cuda", generator=gen)
        if arg.dtype == "float32" and tuple(shape) == (1,):
            values = values.abs() + 0.5  # a scale
        inputs.append(values.to(getattr(torch, arg.dtype)))
    return tuple(inputs)


def operand_sets(found: KernelFamily, problem) -> tuple[list[tuple], object]:
    """Copies of a problem's random inputs, enough to cycle out of L2, and an output tensor."""
    import torch

    first = tensors_for(found, problem, seed=0)
    size = sum(t.numel() * t.element_size() for t in first if t is not None)
    sets = [first] + [tensors_for(found, problem, seed) for seed in range(1, operand_copies(size))]
    out = torch.empty(
        tuple(found.output_shape(problem)), dtype=getattr(torch, found.output.dtype), device="cuda"
    )
    return sets, out


def is_close(out, reference) -> bool:
    scale = float(reference.float().abs().max()) or 1.0
    error = float((out.float() - reference.float()).abs().max())
    return error == error and error <= RELATIVE_TOLERANCE * scale  # NaN is never close


class Tuner:
    def __init__(self, found: KernelFamily, arch: str, results_path: Path, console: Console):
        self.family = found
        self.arch = arch
        self.results_path = results_path
        self.console = console
        self.done = self._read_results()
        self.compiled: dict[str, object] = {}

    def _read_results(self) -> dict[tuple[str, str], dict]:
        """What earlier runs measured (the one JSON-lines reader: a line cut short by an
        interruption, or one that is no object, is skipped)."""
        done = {}
        if self.results_path.exists():
            for _, row in read_objects(self.results_path, "tuning results"):
                if row.get("family") == self.family.name and row.get("arch") == self.arch:
                    if isinstance(row.get("problem"), list) and isinstance(row.get("key_id"), str):
                        done[(json.dumps(row["problem"]), row["key_id"])] = row
        return done

    def function(self, key):
        """The candidate's function: from the loaded bundles, else JIT; None when neither."""
        from cute_aot.runtime import REGISTRY

        function = REGISTRY.bundle_function(key.FAMILY, key.id, self.arch)
        if function is None and key.id not in self.compiled:
            try:
                self.compiled[key.id] = self.family.compile(key, self.arch)
            except ImportError:
                self.compiled[key.id] = None  # no cutlass here: only bundle keys can be timed
        return function or self.compiled.get(key.id)

    def measure(self, problem, candidates, progress, task) -> dict[str, dict]:
        """key id -> result row for every candidate of `problem` (measured now or earlier); the
        finalists' times are from one interleaved re-timing (_retime_finalists)."""
        import torch

        rows = {}
        operands = None
        problem_id = json.dumps(list(problem))
        for key in candidates:
            row = self.done.get((problem_id, key.id))
            if row is None:
                operands = operands or self._operands(problem)
                row = self._measure_one(key, problem, *operands)
                self._record(row)
            rows[key.id] = row
            progress.advance(task)
        final = finalists({key_id: row["us"] for key_id, row in rows.items() if row["ok"]})
        if not all(rows[key_id].get("retimed") for key_id in final):
            operands = operands or self._operands(problem)
            keys = {key.id: key for key in candidates if key.id in final}
            self._retime_finalists(problem, keys, [rows[key_id] for key_id in final], operands)
        del operands
        torch.cuda.empty_cache()
        return rows

    def _retime_finalists(self, problem, keys: dict, rows: list[dict], operands) -> None:
        """Time the finalists again, their replays interleaved (timing.seconds_per_call_each):
        candidates are first timed one after the other, and a later one runs at lower clocks
        once the GPU is at its power limit. Each row's `us` becomes the interleaved time."""
        _, _, sets, out = operands
        calls = {
            key_id: self.family.bind(self.function(key), problem) for key_id, key in keys.items()
        }
        times = seconds_per_call_each(calls, sets, out)
        for row in rows:
            row.update(
                first_us=row.get("first_us", row["us"]), us=times[row["key_id"]] * 1e6, retimed=True
            )
            self._record(row)

    def _record(self, row: dict) -> None:
        """Append a result row (a later row of the same problem and key replaces an earlier),
        with the one appender: a row cut short before is closed, never glued to this one."""
        append_line(self.results_path, (json.dumps(row) + "\n").encode())

    def _operands(self, problem):
        sets, out = operand_sets(self.family, problem)
        return sets[0], self.family.reference(*sets[0]), sets, out

    def _measure_one(self, key, problem, inputs, reference, sets, out) -> dict:
        row = {
            "family": self.family.name,
            "arch": self.arch,
            "problem": list(problem),
            "key_id": key.id,
            "key": key.fields(),
            "us": None,
            "ok": False,
            "error": None,
        }
        try:
            function = self.function(key)
            if function is None:
                row["error"] = "not in the bundles, and no JIT here"
                return row
            call = self.family.bind(function, problem)
            out.fill_(float("nan"))
            call(*inputs, out)
            if not is_close(out, reference):
                row["error"] = "does not match the reference"
                return row
            row["us"] = seconds_per_call(call, sets, out) * 1e6
            row["ok"] = True
        except Exception as exc:  # a candidate that cannot run loses; the others go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return row


FINALIST_MARGIN = 1.15  # within this of the fastest first time: timed again, interleaved
MAX_FINALISTS = 6


def finalists(times: dict[str, float]) -> list[str]:
    """The candidates worth a second, interleaved timing: at most MAX_FINALISTS, fastest first,
    within FINALIST_MARGIN of the fastest (the order bias seen was 4-10%); none for one."""
    if len(times) < 2:
        return []
    ranked = sorted(times, key=times.get)
    best = times[ranked[0]]
    return [key_id for key_id in ranked[:MAX_FINALISTS] if times[key_id] <= FINALIST_MARGIN * best]


def provenance(found: KernelFamily, arch: str, shapes, candidates: int) -> dict:
    import torch

    facts = {
        "source": "aot-tune",
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cute_aot": PACKAGE_VERSION,
        "torch": torch.__version__,
        "family_version": found.version,
        "shapes": [list(shape) for shape in shapes],
        "candidates": candidates,
        "method": "CUDA graph replays (median of 5), operands cycled out of L2, PDL as keyed; "
        "finalists within 15% re-timed with replays interleaved",
    }
    try:
        query = "driver_version,clocks.sm,clocks.max.sm,power.limit"
        line = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        facts.update(
            dict(
                zip(
                    ("driver", "sm_clock", "max_sm_clock", "power_limit"),
                    (part.strip() for part in line.split(",")),
                    strict=False,
                )
            )
        )
    except (OSError, subprocess.SubprocessError):
        pass  # clocks are informative; a machine without nvidia-smi still tunes
    return facts


def parse_where(texts, key_class) -> dict[str, tuple[str, ...]]:
    """`--where FIELD=VALUE[|VALUE..]` pairs, each FIELD one of `key_class`'s (read before any
    GPU is looked for: a misspelt field costs no device time). A key matches a FIELD when its
    value is any of the alternatives; booleans as 1/0/true/false."""
    known = {"family", *(f.name for f in dataclasses.fields(key_class))}
    pairs = {}
    for text in texts:
        field, sep, value = text.partition("=")
        if not sep or not field.strip():
            raise click.BadParameter(f"{text!r} is not FIELD=VALUE", param_hint="--where")
        if field.strip() not in known:
            raise click.BadParameter(
                f"{key_class.FAMILY} keys have no field {field.strip()!r}", param_hint="--where"
            )
        alternatives = (v.strip().lower() for v in value.split("|"))
        pairs[field.strip()] = tuple({"true": "1", "false": "0"}.get(v, v) for v in alternatives)
    return pairs


def matches(key, where: dict[str, tuple[str, ...]]) -> bool:
    """Whether `key` has, for every FIELD of `where` (parse_where's), one of its values."""
    fields = key.fields()
    for field, wanted in where.items():
        value = fields[field]
        text = ("1" if value else "0") if isinstance(value, bool) else str(value).lower()
        if text not in wanted:
            return False
    return True


def tune(
    found: KernelFamily,
    arch: str,
    shapes,
    results_path: Path,
    console: Console,
    ms: tuple[int, ...] = (),
    base: Table | None = None,
    where: dict[str, str] | None = None,
) -> Table:
    """`ms`: tune only problems of these M (all the family's when empty); `base`: a table whose
    rows are kept where nothing tuned now covers them; `where`: time only candidates with
    these key fields, against the tactic `base` (or the family's default table) picks, so a
    row changes only where one of them beats it."""
    tuner = Tuner(found, arch, results_path, console)
    problems = [p for shape in shapes for p in found.tune_problems(shape) if not ms or p[0] in ms]
    candidates = {p: found.tune_candidates(p, arch) for p in problems}
    if where:
        for problem, keys in candidates.items():
            incumbent = found.dispatch(problem, arch, base or found.default_table(arch)).key
            chosen = [key for key in keys if matches(key, where)]
            candidates[problem] = chosen + ([incumbent] if incumbent not in chosen else [])
    total = sum(len(c) for c in candidates.values())
    winners = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=not console.is_terminal) as progress:
        task = progress.add_task(f"tuning {found.name}", total=total)
        for problem in problems:
            rows = tuner.measure(problem, candidates[problem], progress, task)
            timings = {key_id: row["us"] for key_id, row in rows.items() if row["ok"]}
            if not timings:
                errors = {row["error"] for row in rows.values()}
                console.print(
                    f"[yellow]{escape(str(problem))}: no candidate ran ({escape(str(errors))}); "
                    "the default rule keeps it[/yellow]"
                )
                continue
            best = min(timings, key=timings.get)
            key = next(k for k in candidates[problem] if k.id == best)
            winners.append((problem, key, timings))
    facts = provenance(found, arch, shapes, total)
    if ms:
        facts["m"] = sorted(ms)
    if base is None:
        return found.tuned_table(arch, winners, facts)
    return found.tuned_table(arch, winners, facts, base=base)


def _current_arch() -> str:
    from cute_aot.runtime.device import current_gpu_arch

    arch = current_gpu_arch()
    if arch is None:
        raise click.UsageError("no supported GPU here: aot-tune measures on the GPU it runs on")
    return arch


def _parse_shapes(found: KernelFamily, texts) -> list:
    """Each --shape by the family's own rule (as aot-build reads it), before the GPU is looked
    at: a shape the family refuses is a usage error that costs no device time."""
    try:
        return [tuple(found.parse_shape(text)) for text in texts]
    except ValueError as exc:  # UnsupportedProblemError, or a plug-in's own ValueError
        raise click.BadParameter(str(exc), param_hint="--shape") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--family", "family_name", required=True, help="Kernel family to tune.")
@click.option("--arch", help="Architecture of this GPU (default: detected); checked against it.")
@click.option(
    "--shape",
    "shape_texts",
    multiple=True,
    help="Shape to tune, repeatable, as aot-build --shape writes it without the FAMILY: prefix "
    "(a GEMM's weight N,K, or named: N=256,K=7168).",
)
@click.option("--model", "models", multiple=True, help="Tune a model preset's shapes.")
@click.option(
    "--bundles",
    "bundle_paths",
    multiple=True,
    type=click.Path(exists=True),
    help="Bundles (aot-build --all-tactics) holding the candidates; others are JIT-compiled.",
)
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Tables file to write; its tables for other families or architectures are kept.",
)
@click.option(
    "--results",
    "results_path",
    type=click.Path(dir_okay=False),
    help="Measurements, one JSON line each (default: OUT.results.jsonl); resumes.",
)
@click.option(
    "--m",
    "ms",
    type=int,
    multiple=True,
    help="Tune only problems of this M (repeatable; default: every M the family tunes).",
)
@click.option(
    "--base",
    "base_path",
    type=click.Path(exists=True, dir_okay=False),
    help="A tables file whose table for this family keeps its rows where nothing "
    "tuned now covers them (with --m: re-tune some M ranges only).",
)
@click.option(
    "--where",
    "where_texts",
    multiple=True,
    help="Time only candidates whose key has FIELD=VALUE (repeatable; VALUE may list "
    "alternatives, tile_n=144|160), against the tactic the --base (or default) "
    "table picks: challengers vs the incumbent.",
)
def main(
    family_name,
    arch,
    shape_texts,
    models,
    bundle_paths,
    out_path,
    results_path,
    ms,
    base_path,
    where_texts,
):
    """Measure a family's tactics on this GPU and write the winners as a dispatch table."""
    click.get_current_context().with_resource(settings.tool_process())  # never recorded, served
    console = terminal.console(stderr=True)
    try:
        found = family(family_name)
        # what tune() and the Tuner class below use: candidates to time, and a reference
        lacking = [p.__name__ for p in (contract.Tuner, TorchReference) if not capability(found, p)]
        if lacking:
            raise click.UsageError(f"{family_name} has no {' or '.join(lacking)}: nothing to tune")
        shapes = _parse_shapes(found, shape_texts)
        where = parse_where(where_texts, found.Key)
        base_tables = read_tables(base_path) if base_path else None
        detected = _current_arch()
        arch = normalize_arch(arch) if arch else detected
        if arch != detected:
            raise click.UsageError(f"this GPU is {detected}: it cannot tune for {arch}")
        if found.default_table(arch) is None:
            raise click.UsageError(f"{family_name} has no dispatch table for {arch}")
        for name in models:
            shapes += model_shapes.family_shapes(model_shapes.preset(name), found)
        shapes = list(dict.fromkeys(shapes or found.default_shapes))
        if bundle_paths:
            from cute_aot.runtime import load_bundles

            load_bundles(*bundle_paths, gpu_arch=arch)
        base = None
        if base_tables is not None:
            base = next((t for t in base_tables if (t.family, t.arch) == (found.name, arch)), None)
            if base is None:
                raise click.BadParameter(
                    f"{base_path} has no {found.name} table for {arch}", param_hint="--base"
                )
        results = Path(results_path or f"{out_path}.results.jsonl")
        table = tune(found, arch, shapes, results, console, tuple(ms), base, where)
        kept = []
        if Path(out_path).exists():
            kept = [t for t in read_tables(out_path) if (t.family, t.arch) != (found.name, arch)]
        write_tables(out_path, [*kept, table])
        console.print(
            f"wrote {found.name} {table.describe()} to {out_path} (measurements: {results})"
        )
    except CuteAotError as exc:
        console.print(f"[red]aot-tune failed:[/red] {escape(str(exc))}")
        sys.exit(1)


if __name__ == "__main__":
    main()
