"""Hopper GEMM table dispatch: which key a problem gets under a table (kernels/tables.py).

A tuned row for the problem's (N, K, M range) first; for a shape with no row: up to M = 64 the
nearest tuned shape's row, up to 511 the tuned tactic with the least measured cost scaled to the
shape (cost.work_of), from 512 the wave model (cost.wave_model_tactic); else the hand-written
rule (TACTICS). The fp8 accumulation policy, the M buckets, the hand-written and packaged
tables (this package's tables.json) and aot-tune's tuned tables are here too.

Dispatch only: neither kernel.py nor build.py imports it, so a table or rule change never makes
built bundles stale. This module never imports cutlass or torch: servers import it on every
call path.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import NamedTuple

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.contract import Dispatch
from cute_aot.kernels.gemm_sm90.cost import (
    BORROWED_MIN_K_TILES_PER_SPLIT,
    MIN_K_TILES_PER_SPLIT,
    SPLIT_MAX_CTAS,
    auto_split,
    k_tiles_of,
    split_fits,
    tiles_of,
    wave_model_tactic,
    waves_of,
    work_of,
)
from cute_aot.kernels.gemm_sm90.keys import (
    ARCHS,
    FP8_FAMILY,
    PDL,
    RASTER_M,
    GemmProblem,
    GemmSm90Fp8Key,
    GemmSm90Key,
    check_problem,
    swap_tile_n,
)
from cute_aot.kernels.gemm_sm90.resources import (
    FP8_DTYPE,
    OUT_VECTOR,
    SMS,
    TILE_K,
    can_promote,
    stages_for,
)
from cute_aot.kernels.tables import Table, packaged_tables

# M buckets a server's batch sizes fall into (each bucket's M is also its upper edge).
M_BUCKETS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Tactic(NamedTuple):
    """One row of the tactic table: the largest M it serves and the CTA / cluster shape."""

    max_m: int  # inclusive; the last row has no bound (0)
    tile_m: int
    tile_n: int  # 0 with swap_ab: the narrowest SWAP_TILE_N that holds M
    cluster_m: int
    cluster_n: int
    swap_ab: bool
    split_k: int  # 0: as many splits as fill one wave (auto_split)
    why: str


# The tactic table (data; the dispatch rule reads it top to bottom, first match wins).
TACTICS: tuple[Tactic, ...] = (
    Tactic(
        64,
        128,
        0,
        1,
        1,
        True,
        0,
        "decode-sized M: swap-AB, 128 weight rows x M tokens per "
        "tile, K split until the wave is full",
    ),
    Tactic(
        256,
        128,
        128,
        1,
        1,
        False,
        0,
        "mid M: two consumer warpgroups, 128x128, K split until the wave is full",
    ),
    Tactic(
        0, 128, 256, 2, 1, False, 1, "large M: 128x256 tiles, w tile multicast to a 2x1 cluster"
    ),
)
# Below this N a 128x256 tile leaves too few CTAs; large M then keeps 128x128 (cluster 2x1).
WIDE_TILE_MIN_N = 2048


def _stages(dtype: str, tactic: dict) -> int:
    """stages_for a dispatch rule's tactic fields."""
    return stages_for(
        dtype,
        tactic["tile_m"],
        tactic["tile_n"],
        tactic["persistent"],
        tactic["pingpong"],
        tactic["swap_ab"],
    )


@functools.cache
def handwritten_table(family: str, arch: str) -> Table | None:
    """The hand-written rule as a table: TACTICS rows, no per-shape rows."""
    if arch not in ARCHS:
        return None
    data = {
        "rows": [tactic._asdict() for tactic in TACTICS],
        "wide_tile_min_n": WIDE_TILE_MIN_N,
        "raster_m": RASTER_M,
        "shape_rows": [],  # aot-tune's per-(N, K, M range) winners, checked first
    }
    return Table(family, arch, data, {"source": "package defaults (hand-written)"})


def default_table(family: str, arch: str) -> Table | None:
    """The table this package dispatches with: the tuned one it ships (tables.json, from
    aot-tune on an H200) where there is one, else the hand-written rule."""
    return packaged_tables(__package__).get((family, arch)) or handwritten_table(family, arch)


def _holds(row: dict, m: int) -> bool:
    low, high = row["m"]
    return low <= m and (high is None or m <= high)


def _shape_row(data: dict, m: int, n: int, k: int) -> dict | None:
    for row in data.get("shape_rows", ()):
        if row["n"] == n and row["k"] == k and _holds(row, m):
            return row
    return None


WAVE_MODEL_MIN_M = 512  # below its bucket the tuned rows' measured costs decide (_row_cost_row)
DECODE_MAX_M = 64  # up to here an untuned shape takes its nearest tuned shape's row


def _nearest_row(data: dict, m: int, n: int, k: int) -> dict | None:
    """For a decode-sized shape nobody tuned: the row of the tuned shape closest in log N (and,
    half as much, log K) at this M. Left out one tuned shape at a time on the H200's M <= 64
    measurements it ran within 4% of the best (geomean), ahead of _row_cost_row (6-7%):
    memory-bound tiles do not scale with waves x k-tiles."""
    rows = [row for row in data.get("shape_rows", ()) if _holds(row, m)]
    if not rows:
        return None
    return min(
        rows,
        key=lambda r: (abs(math.log(n / r["n"])) + 0.5 * abs(math.log(k / r["k"])), r["n"], r["k"]),
    )


def _row_cost_row(data: dict, m: int, n: int, k: int, dtype: str) -> dict | None:
    """For a shape nobody tuned: among the tactics that won a tuned row at this M, the one whose
    measured time per unit of work (work_of; median over its rows) times this shape's work is
    least. Left out one tuned shape at a time on the H200's M = 128 / 256 measurements, it ran
    within 6% (bf16) / 7% (fp8) of the measured best, geomean, where the nearest shape's row
    lost 14%."""
    per_unit: dict[tuple, list[float]] = {}
    rows: dict[tuple, dict] = {}
    k_tiles = k_tiles_of(k, dtype)
    for row in data.get("shape_rows", ()):
        if not _holds(row, m) or not row.get("us"):
            continue
        tactic = _row_tactic(row)
        if not split_fits(tactic["split_k"], k_tiles, BORROWED_MIN_K_TILES_PER_SPLIT):
            continue  # this K is too short to split that way
        measured_m = row["m"][1] or M_BUCKETS[-1]  # a row is measured at its bucket's M
        name = tuple(sorted(tactic.items())) + (("raster_m", row.get("raster_m")),)
        work = work_of(tactic, measured_m, row["n"], row["k"], dtype)
        per_unit.setdefault(name, []).append(row["us"] / work)
        rows.setdefault(name, row)
    if not per_unit:
        return None
    best = min(
        per_unit,
        key=lambda name: (
            statistics.median(per_unit[name]) * work_of(dict(name[:-1]), m, n, k, dtype)
        ),
    )
    return rows[best]


TACTIC_FIELDS = (
    "tile_m",
    "tile_n",
    "cluster_m",
    "cluster_n",
    "swap_ab",
    "split_k",
    "promote",
    "persistent",
    "pingpong",
)
TACTIC_DEFAULTS = {
    "swap_ab": False,
    "split_k": 1,
    "promote": False,
    "persistent": False,
    "pingpong": False,
}


def _row_tactic(row: dict) -> dict:
    """A table row's tactic fields; rows of FAMILY_VERSION 1 lack the later ones."""
    return {f: row.get(f, TACTIC_DEFAULTS.get(f)) for f in TACTIC_FIELDS}


def _promote_fp8(tactic: dict, dtype: str) -> str:
    """Promote fp8: narrow the tile until the second accumulator set fits; the note why, if it
    had to. (Never a ping-pong tactic: an exact row is its own evidence, and the wave model
    promotes only tiles whose second set fits.)"""
    tactic["promote"] = dtype == FP8_DTYPE
    if tactic["promote"] and not can_promote(tactic["tile_m"], tactic["tile_n"]):
        tactic["tile_n"] = 128
        return "fp8 promotion narrows tile_n to 128"
    return ""


def fast_accumulation_row(data: dict, m: int, k: int) -> dict | None:
    """A tuned row at this M (bucket) whose fp8 tactic accumulates fast at a K at least this
    long: aot-tune checked it against the fp32 reference there, and fast accumulation's error
    only grows with K (Hopper keeps ~14 bits of its fp8 sums). None: no such measurement."""
    checked = [
        row
        for row in data.get("shape_rows", ())
        if _holds(row, m) and row["k"] >= k and not row.get("promote", False)
    ]
    return max(checked, key=lambda row: (row["k"], row["n"]), default=None)


def _accumulate_fp8(tactic: dict, data: dict, m: int, n: int, k: int, dtype: str) -> str:
    """The one fp8 accumulation policy: a tactic accumulates fast only where a tuned row at this
    M showed fast accumulation accurate at this K or longer (fast_accumulation_row); otherwise
    it is promoted. The note why, where the evidence is another shape's."""
    if dtype != FP8_DTYPE or tactic["promote"]:
        return ""
    row = fast_accumulation_row(data, m, k)
    if row is None:
        return _promote_fp8(tactic, dtype) or "promoted: fast accumulation unchecked at this K"
    if (row["n"], row["k"]) == (n, k):
        return ""  # its own row
    return f"fast accumulation (checked at N={row['n']} K={row['k']})"


def _fit(tactic: dict, m: int, n: int, k: int, dtype: str, aligned_n: bool) -> str:
    """Resolve a hand-written row's data-dependent fields for this problem; the notes why."""
    notes = []
    if tactic["swap_ab"] and not aligned_n:
        tactic.update(swap_ab=False, tile_m=64, tile_n=128, split_k=1)
        notes.append(f"N={n} % {OUT_VECTOR} != 0: no swap-AB or split-K, 64x128")
    if tactic["swap_ab"] and tactic["tile_n"] == 0:
        tactic["tile_n"] = swap_tile_n(m)
        notes.append(f"swap-AB tile of {tactic['tile_n']} tokens")
    if tactic["split_k"] == 0:
        tiles = tiles_of(tactic, m, n)
        tactic["split_k"] = auto_split(tiles, k_tiles_of(k, dtype)) if aligned_n else 1
        if tactic["split_k"] > 1:
            notes.append(f"{tiles} tiles x split-K {tactic['split_k']} (<= {SPLIT_MAX_CTAS} CTAs)")
    return "; ".join(notes)


@functools.lru_cache(maxsize=4096)
def bucket_of(m: int) -> int:
    """The M a problem's tactic is chosen at: the smallest of M_BUCKETS holding it (the last
    for larger M). Tuned rows span whole buckets; the models for untuned shapes (waves, tile
    counts) would otherwise pick per M, and a key chosen at an M between buckets (say 2049)
    would be one no build enumerated (problems() yields the buckets): a miss on the server."""
    return next((bucket for bucket in M_BUCKETS if bucket >= m), M_BUCKETS[-1])


def choose(m: int, n: int, k: int, dtype: str, table: Table) -> tuple[dict, int, int, str]:
    """(tactic fields, stages, raster_m, why) for a problem under `table`: the one rule, read
    at M's bucket (bucket_of). A row tuned for this (N, K, M range) first; for a shape with no
    row: up to M = 64 the nearest tuned shape's row, then the tuned tactic with the least
    measured cost scaled to this shape, from the bucket of M = 512 (M > 256) the wave model;
    with no row at this M (or N % 8 != 0, which the swap-AB / split-K / persistent rows cannot
    serve), the hand-written rule."""
    m = bucket_of(m)
    data = table.data
    row = _shape_row(data, m, n, k)
    if row is not None:
        return _from_row(row, data, m, n, k, dtype, f"tuned row for N={n} K={k}")
    if n % OUT_VECTOR == 0 and data.get("shape_rows"):
        if m >= WAVE_MODEL_MIN_M:
            return _from_wave_model(m, n, k, dtype, data)
        fewest = MIN_K_TILES_PER_SPLIT
        if m <= DECODE_MAX_M:
            row = _nearest_row(data, m, n, k)
            which = f"nearest tuned shape N={row['n']} K={row['k']}" if row else ""
        else:
            row = _row_cost_row(data, m, n, k, dtype)
            which = (
                f"least measured cost of the tuned rows (won at N={row['n']} K={row['k']})"
                if row
                else ""
            )
            fewest = BORROWED_MIN_K_TILES_PER_SPLIT
        if row is not None:
            return _from_row(row, data, m, n, k, dtype, f"{which} for N={n} K={k}", fewest)
    return _from_rule(m, n, k, dtype, data)


def _from_row(
    row: dict,
    data: dict,
    m: int,
    n: int,
    k: int,
    dtype: str,
    which: str,
    fewest: int = MIN_K_TILES_PER_SPLIT,
):
    low, high = row["m"]
    bound = f"M in [{low}, {high if high is not None else 'inf'}]"
    why = f"{which} {bound}: {row.get('why', '')}".rstrip(": ")
    tactic = _row_tactic(row)
    while not split_fits(tactic["split_k"], k_tiles_of(k, dtype), fewest):
        tactic["split_k"] //= 2  # a neighbour's K was longer
    # The row's split filled its waves; at this N it may spill into one more (72 tiles x 2 =
    # 144 CTAs on 132 SMs): fewer splits then, each CTA streaming more of K.
    measured_waves, split = waves_of(tactic, high or M_BUCKETS[-1], row["n"]), tactic["split_k"]
    while tactic["split_k"] > 1 and waves_of(tactic, m, n) > measured_waves:
        tactic["split_k"] //= 2
    if tactic["split_k"] != split:
        why += f"; split-K {tactic['split_k']} keeps N={n} in {waves_of(tactic, m, n)} wave(s)"
    note = _accumulate_fp8(tactic, data, m, n, k, dtype)
    why += f"; {note}" if note else ""
    stages = _stages(dtype, tactic)
    return tactic, stages, row.get("raster_m", data["raster_m"]), why


def _from_wave_model(m: int, n: int, k: int, dtype: str, data: dict):
    promoted = dtype == FP8_DTYPE and fast_accumulation_row(data, m, k) is None
    tactic, why = wave_model_tactic(m, n, promoted, k_tiles_of(k, dtype), dtype)
    tactic["promote"] = False
    note = _accumulate_fp8(tactic, data, m, n, k, dtype)
    why += f"; {note}" if note else ""
    stages = _stages(dtype, tactic)
    return tactic, stages, data["raster_m"], f"N={n} K={k} not tuned: {why}"


def _from_rule(m: int, n: int, k: int, dtype: str, data: dict):
    rows = data["rows"]
    row = next(r for r in rows if r["max_m"] == 0 or m <= r["max_m"])
    tactic = _row_tactic(row)
    bound = f"M={m} <= {row['max_m']}" if row["max_m"] else f"M={m} > {rows[-2]['max_m']}"
    why = f"{bound}: {row['why']}"
    wide_tiles = tiles_of(tactic, m, n)
    if tactic["tile_n"] > 128 and wide_tiles < SMS:
        tactic["tile_n"] = 128
        why += f"; {wide_tiles} tiles of {tactic['tile_m']}x256 leave SMs idle: tile_n 128"
    elif tactic["tile_n"] > 128 and n < data["wide_tile_min_n"]:
        tactic["tile_n"] = 128
        why += f"; N={n} < {data['wide_tile_min_n']} narrows tile_n to 128"
    notes = [
        _accumulate_fp8(tactic, data, m, n, k, dtype),
        _fit(tactic, m, n, k, dtype, n % OUT_VECTOR == 0),
    ]
    why += "".join(f"; {note}" for note in notes if note)
    stages = _stages(dtype, tactic)
    return tactic, stages, data["raster_m"], why


def dispatch_problem(
    problem: GemmProblem, arch: str, family: str, table: Table | None = None
) -> Dispatch:
    problem = GemmProblem(*problem)
    check_problem(problem, family)
    if arch not in ARCHS:
        raise UnsupportedProblemError(f"{family}: built for {', '.join(ARCHS)} only, not {arch}")
    table = table or default_table(family, arch)
    m, n, k, dtype, has_bias = problem
    tactic, stages, raster_m, why = choose(m, n, k, dtype, table)
    aligned_n = n % OUT_VECTOR == 0
    key_class = GemmSm90Fp8Key if family == FP8_FAMILY else GemmSm90Key
    key = key_class(
        dtype,
        bool(has_bias),
        tactic["tile_m"],
        tactic["tile_n"],
        tactic["cluster_m"],
        tactic["cluster_n"],
        stages,
        PDL,
        raster_m,
        aligned_n,
        bool(tactic["swap_ab"]),
        int(tactic["split_k"]),
        bool(tactic["promote"]),
        bool(tactic["persistent"]),
        bool(tactic["pingpong"]),
    )
    reason = (
        f"{why} -> {key.describe()}, tile_k {TILE_K[dtype]}; {stages} stages fill shared memory; "
        + (
            f"N % {OUT_VECTOR} == 0: 16-byte stores through shared memory"
            if aligned_n
            else f"N % {OUT_VECTOR} != 0: 2-byte stores"
        )
        + f" [{table.describe()}]"
    )
    return Dispatch(key, reason)


def _bucket_range(m: int) -> list:
    lower = max((b for b in M_BUCKETS if b < m), default=0) + 1
    return [lower, None if m == M_BUCKETS[-1] else m]


def _overlaps(a: list, b: list) -> bool:
    inf = float("inf")
    return a[0] <= (b[1] or inf) and b[0] <= (a[1] or inf)


def tuned_table(
    family: str, arch: str, winners: list, provenance: dict, base: Table | None = None
) -> Table:
    """The default rule plus one row per measured (N, K, M bucket): the fastest correct tactic,
    its time and the runner-up's. A bucket's row serves the M range up to its M. `base`: an
    earlier table whose rows are kept where nothing measured now covers their (N, K, M range)."""
    data = dict(handwritten_table(family, arch).data)
    rows = []
    for problem, key, timings in sorted(winners, key=lambda w: (w[0].n, w[0].k, w[0].m)):
        ranked = sorted(timings.items(), key=lambda item: item[1])
        runner_up = ranked[1] if len(ranked) > 1 else None
        rows.append(
            {
                "n": problem.n,
                "k": problem.k,
                "m": _bucket_range(problem.m),
                **{f: getattr(key, f) for f in TACTIC_FIELDS},
                "raster_m": key.raster_m,
                "us": round(timings[key.id], 3),
                "runner_up_us": round(runner_up[1], 3) if runner_up else None,
                "why": f"fastest of {len(timings)} measured at M={problem.m}",
            }
        )
    if base is not None:
        kept = [
            old
            for old in base.data.get("shape_rows", ())
            if not any(
                (new["n"], new["k"]) == (old["n"], old["k"]) and _overlaps(new["m"], old["m"])
                for new in rows
            )
        ]
        rows = sorted(kept + rows, key=lambda r: (r["n"], r["k"], r["m"][0]))
        provenance = {**provenance, "kept_rows_from": base.provenance}
    data["shape_rows"] = rows
    return Table(family, arch, data, provenance)
