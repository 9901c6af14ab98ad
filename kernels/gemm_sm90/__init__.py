"""Hopper GEMM family (wgmma + TMA), pure-Python part: key, tactic table, dispatch, shapes.

    out[M, N] bf16 = x[M, K] @ w[N, K]^T (+ bias[N]), K-major operands, fp32 accumulation, sm_90a.

Registered under the `cute_aot.families` entry points as ``gemm_sm90`` and ``gemm_sm90_fp8``
(pyproject.toml), exactly as another project's family would be.

Dispatch reads a table (kernels/tables.py): per-(N, K, M range) rows measured by `aot-tune` on
an H200, shipped in tables.json (a shape with no row of its own takes: up to M = 64 the nearest
tuned shape's row; up to 511 the tuned tactic with the least measured cost scaled to its waves
and k-tiles; from 512 the wave model's persistent tile), else the hand-written rule (TACTICS
below: swap-AB with K split for decode-sized M, 128 x 128 split until ~72 CTAs for mid M,
128 x 256 multicast tiles for large M, narrower where they would leave SMs idle). Bundles record
the table they were built with.

A tactic is the kernel's compile-time choice (kernel.py): tile and cluster shape, raster group,
swap-AB, split-K, persistent grid, fp8 promotion; each is a field of the key.

Two families share one kernel (kernel.py) because their exported functions' ABIs differ:

* ``gemm_sm90`` (bf16): ``fn(x bf16 [M, K], w bf16 [N, K], bias bf16 [N], out bf16 [M, N])``.
  bias is always passed; the key's ``has_bias`` decides whether the kernel reads it.
* ``gemm_sm90_fp8`` (float8_e4m3fn, per-tensor scales): ``fn(x fp8 [M, K], w fp8 [N, K],
  x_scale fp32 [1], w_scale fp32 [1], bias bf16 [N], out bf16 [M, N])`` computing
  ``bf16(acc * x_scale * w_scale + bias)``. The scales are device scalars (read by the kernel,
  never synchronised to the host), so a CUDA graph may capture calls whose scales change.

bias is optional in the op (None): `problem` then reports has_bias=False, which dispatches to a
key whose kernel never reads bias, and `bind` hands the exported function out's first row in its
place. Both variants are enumerated for every shape so a bundle holds both.

This module never imports cutlass or torch at module level: servers import it on every call path.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from cute_aot.artifacts.errors import UnsupportedProblemError
from cute_aot.kernels.contract import Dispatch, KernelFamily, TensorArg, parse_ints
from cute_aot.kernels.keys import KernelKey
from cute_aot.kernels.tables import Table, packaged_tables

FAMILY = "gemm_sm90"
FP8_FAMILY = "gemm_sm90_fp8"
# Bump when the kernel's code generation changes in a way the other key fields do not capture.
FAMILY_VERSION = 2  # 2: swap-AB, split-K in distributed smem, fp8 promotion, persistent grid

BF16_DTYPE = "bfloat16"
FP8_DTYPE = "float8_e4m3fn"
OUT_DTYPE = "bfloat16"
ALIGN_BYTES = 16  # TMA: every base address and every row (K * element size) 16-byte aligned
ELEMENT_BYTES = {BF16_DTYPE: 2, FP8_DTYPE: 1}
K_DIVISOR = {dtype: ALIGN_BYTES // size for dtype, size in ELEMENT_BYTES.items()}  # 8 / 16
ARCHS = ("sm_90a",)

# Shared memory (mirrors kernel.py, which re-checks it): 227 KiB per CTA less barriers.
SMEM_CAPACITY = 232448
BARRIER_RESERVE = 1024
MAX_STAGES = 8
TILE_K = {BF16_DTYPE: 64, FP8_DTYPE: 128}  # 128-byte rows either way

# M buckets a server's batch sizes fall into (each bucket's M is also its upper edge).
M_BUCKETS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Swap-AB puts M on the wgmma's N side: the narrowest of these that holds M (kernel.py).
SWAP_TILE_N: tuple[int, ...] = (8, 16, 32, 64)
# Tile widths between the powers of two: where N / 128 tiles leave a wave part-empty (ncu on the
# H200: cuBLAS ran M=256 N=5120 with 80-wide tiles on 128 SMs while our 128 wide took 80).
FILL_TILE_N: tuple[int, ...] = (80, 96, 112, 144, 160, 192)
SPLITS: tuple[int, ...] = (1, 2, 4, 8)  # split-K: CTAs per output tile (a 1x1xS cluster)
# Wider 128-row tiles split 2 or 4 ways, for mid M with small N and long K (M = 1024, N = 576,
# K = 7168: 8 x 4 tiles of 128 x 144 leave 100 SMs idle, split 4 ways they fill 128).
SPLIT_WIDE_TILE_N: tuple[int, ...] = FILL_TILE_N + (256,)
# And 64-row tiles of these widths, for decode sizes whose swap-AB tiles land just past a wave
# (M = 2, N = 5120: 80 swap-AB tiles x split 2 = 160 CTAs; 64 tiles of 64 x 80 x 2 = 128), and
# for mid M with N = 576 (M = 1024: 16 x 4 tiles of 64 x 144, split 2 ways, fill 128 SMs).
SPLIT_DECODE_TILE_N: tuple[int, ...] = (80, 96, 112, 144)
SMS = 132  # H200 SMs
# Split-K adds CTAs only up to about this many: past it, aot-tune on the H200 measured the
# 1x1xS cluster's reduction costing more than the extra SMs bring (M <= 256, 23 layer shapes).
SPLIT_MAX_CTAS = 72
MIN_K_TILES_PER_SPLIT = 4  # fewer and the pipeline never fills
# A split borrowed from another shape's row (M 128-256, shapes nobody tuned) keeps at least this
# many k-tiles per CTA: on held-out shapes (N, K = 768..3072, 1536..4096) the H200 measured
# short-K splits losing up to 0.57x cuBLAS where the unsplit or half-split tile won.
BORROWED_MIN_K_TILES_PER_SPLIT = 16
# What a CTA pays besides streaming its k-tiles (pipeline fill, epilogue), in k-tiles: the cost
# model of borrowed rows (_work) charges it per CTA, so splitting a short K is not free.
CTA_FILL_K_TILES = 8
OUT_PAD = 8  # kernel.py: elements of padding per staged out row
EPI_COLS = 32  # kernel.py: columns per TMA-stored epilogue strip
EPI_BUFFERS = 2  # kernel.py: strips in flight per tile owner
# kernel.py: fp32 accumulators per consumer thread, promotion included, by consumer warpgroups
MAX_ACC_PER_THREAD = {1: 128, 2: 128, 3: 96}


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
PDL = True
OUT_VECTOR = 8  # bf16 per 16-byte store (kernel.py); needs out rows 16-byte aligned
RASTER_M = 8  # a wave of ~132 CTAs covers 8 M tiles x ~16 N tiles (an L2-sized block)
BLOCK_ORDER = 1 << 16  # a raster group taller than any grid: plain block order, M tiles fastest


def accumulators_per_thread(tile_m: int, tile_n: int, pingpong: bool = False) -> int:
    """A cooperative tile spreads over tile_m / 64 warpgroups; a ping-pong tile is one's."""
    return tile_m * tile_n // ((1 if pingpong else tile_m // 64) * 128)


def accumulator_budget(tile_m: int, pingpong: bool = False) -> int:
    """The accumulators a consumer thread may hold: three consumer warpgroups have fewer
    registers each (kernel.py: CONSUMER_REGS)."""
    return MAX_ACC_PER_THREAD[2 if pingpong else tile_m // 64]


def can_promote(tile_m: int, tile_n: int, pingpong: bool = False) -> bool:
    """fp8 promotion holds a second accumulator set: it must fit in the registers."""
    return 2 * accumulators_per_thread(tile_m, tile_n, pingpong) <= accumulator_budget(
        tile_m, pingpong
    )


def swap_tile_n(m: int) -> int:
    return next((t for t in SWAP_TILE_N if t >= m), SWAP_TILE_N[-1])


def k_tiles_of(k: int, dtype: str) -> int:
    return -(-k // TILE_K[dtype])


def tiles_of(tactic: dict, m: int, n: int) -> int:
    """Output tiles of a tactic on an M x N out (swap-AB tiles N by tile_m, M by tile_n)."""
    rows, cols = (n, m) if tactic.get("swap_ab") else (m, n)
    return -(-rows // tactic["tile_m"]) * -(-cols // max(tactic["tile_n"], 1))


def split_fits(split: int, k_tiles: int, minimum: int = MIN_K_TILES_PER_SPLIT) -> bool:
    """Whether every one of `split` K splits gets `minimum` k-tiles."""
    return split == 1 or k_tiles >= minimum * split


def auto_split(tiles: int, k_tiles: int) -> int:
    """The most K splits that keep the CTAs within SPLIT_MAX_CTAS and give every split
    MIN_K_TILES_PER_SPLIT k-tiles."""
    return next(
        s
        for s in reversed(SPLITS)
        if s == 1 or (tiles * s <= SPLIT_MAX_CTAS and split_fits(s, k_tiles))
    )


def stores_by_tma(tile_n: int, persistent: bool, swap_ab: bool) -> bool:
    """kernel.py: a persistent tile in out's own order leaves by TMA stores of column strips
    (N % 8 == 0 too; an any-N key stores from registers and needs no buffer at all)."""
    return persistent and not swap_ab and tile_n % 16 == 0


def strip_cols(tile_n: int) -> int:
    """Columns per TMA-stored epilogue strip (kernel.py: epi_tile)."""
    return EPI_COLS if tile_n % EPI_COLS == 0 else 16


def epilogue_bytes(
    tile_m: int, tile_n: int, persistent: bool, swap_ab: bool = False, pingpong: bool = False
) -> int:
    """Shared memory a persistent CTA's tile owner keeps for its epilogue (kernel.py): two bf16
    strips for the TMA store (tile_m rows, ping-pong's 64), else (swap-AB stages out^T) the
    padded tile."""
    if not persistent:
        return 0  # the epilogue stages in the idle operand slots
    if stores_by_tma(tile_n, persistent, swap_ab):
        return EPI_BUFFERS * (64 if pingpong else tile_m) * strip_cols(tile_n) * 2
    return 2 * max(tile_m * (tile_n + OUT_PAD), tile_n * (tile_m + OUT_PAD))


def stages_for(
    dtype: str,
    tile_m: int,
    tile_n: int,
    persistent: bool = False,
    pingpong: bool = False,
    swap_ab: bool = False,
) -> int:
    """As many pipeline stages as shared memory holds, at most MAX_STAGES, beside a
    persistent CTA's epilogue buffers (epilogue_bytes), ping-pong's per warpgroup (and a
    second bias slice next to the barriers)."""
    per_stage = (tile_m + tile_n) * TILE_K[dtype] * ELEMENT_BYTES[dtype]
    staging = epilogue_bytes(tile_m, tile_n, persistent, swap_ab, pingpong)
    owners = 2 if pingpong else 1
    free = SMEM_CAPACITY - owners * (BARRIER_RESERVE + staging)
    return min(MAX_STAGES, free // per_stage)


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


@dataclass(frozen=True)
class GemmSm90Key(KernelKey):
    """Everything that changes a Hopper GEMM binary; M, N and K are symbolic (not in the key)."""

    FAMILY = FAMILY

    dtype: str  # x and w: "bfloat16" | "float8_e4m3fn"
    has_bias: bool
    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    stages: int
    pdl: bool
    raster_m: int = RASTER_M  # M tiles per raster group (kernel.py: _tile_of)
    aligned_n: bool = True  # N % 8 == 0: 16-byte stores of a tile staged in shared memory
    swap_ab: bool = False  # the kernel computes out^T = w @ x^T: tile_m along N, tile_n along M
    split_k: int = 1  # CTAs (a 1x1xS cluster) per output tile, reduced in distributed smem
    promote: bool = False  # fp8: each k-tile's sum added to fp32 accumulators (kernel.py)
    persistent: bool = False  # at most 132 CTAs, each walking tiles; epilogue under next loads
    pingpong: bool = False  # persistent: two warpgroups own alternate tiles (kernel.py)
    out_dtype: str = OUT_DTYPE
    align_bytes: int = ALIGN_BYTES
    version: int = FAMILY_VERSION

    def describe(self) -> str:
        return (
            f"{self.dtype} tile {self.tile_m}x{self.tile_n} cluster {self.cluster_m}x"
            f"{self.cluster_n} stages={self.stages} raster={self.raster_m} "
            f"bias={int(self.has_bias)}"
            f" pdl={int(self.pdl)}{'' if self.aligned_n else ' any-N'}"
            f"{' swap-AB' if self.swap_ab else ''}"
            f"{f' split-K {self.split_k}' if self.split_k > 1 else ''}"
            f"{' promoted' if self.promote else ''}"
            f"{' persistent' if self.persistent else ''}"
            f"{' ping-pong' if self.pingpong else ''}"
        )


@dataclass(frozen=True)
class GemmSm90Fp8Key(GemmSm90Key):
    """The fp8 family's key: the same fields, its own family name (and so its own ids)."""

    FAMILY = FP8_FAMILY


def check_key(key: GemmSm90Key, arch: str) -> None:
    """Refuse a key the kernel cannot be built for (build.py calls this before compiling)."""
    if arch not in ARCHS:
        raise UnsupportedProblemError(f"{key.FAMILY}: built for {', '.join(ARCHS)}, not {arch}")
    if key.dtype not in ELEMENT_BYTES or key.out_dtype != OUT_DTYPE:
        raise UnsupportedProblemError(f"{key.FAMILY}: key {key.describe()} has unknown dtypes")
    if key.align_bytes != ALIGN_BYTES:
        raise UnsupportedProblemError(f"{key.FAMILY}: align_bytes must be {ALIGN_BYTES}")
    why = tactic_refusal(key)
    if why:
        raise UnsupportedProblemError(f"{key.FAMILY}: key {key.describe()}: {why}")


def tactic_refusal(key: GemmSm90Key) -> str | None:
    """Why the kernel cannot build this combination (kernel.py checks the same), or None."""
    if key.split_k not in SPLITS:
        return f"split_k must be one of {SPLITS}"
    if key.split_k > 1 and (key.cluster_m, key.cluster_n) != (1, 1):
        return "split-K takes the cluster for K: cluster must be 1x1"
    if (key.swap_ab or key.split_k > 1) and not key.aligned_n:
        return "swap-AB and split-K need N % 8 == 0"
    if key.swap_ab and key.tile_n not in SWAP_TILE_N:
        return f"swap-AB tiles M by one of {SWAP_TILE_N}"
    rows = key.tile_n if key.swap_ab else key.tile_m
    if rows % key.split_k:
        return f"split_k={key.split_k} must divide the out tile's {rows} rows"
    budget = accumulator_budget(key.tile_m, key.pingpong)
    if accumulators_per_thread(key.tile_m, key.tile_n, key.pingpong) > budget:
        return f"a consumer thread holds at most {budget} accumulators here"
    if key.promote and (
        key.dtype != FP8_DTYPE or not can_promote(key.tile_m, key.tile_n, key.pingpong)
    ):
        return "promotion is for fp8 tiles whose two accumulator sets fit in the registers"
    if key.persistent and key.split_k > 1:
        return "a persistent grid walks whole tiles: split_k must be 1"
    if key.pingpong and (not key.persistent or key.swap_ab or not key.aligned_n):
        return "ping-pong walks whole tiles of a persistent grid (no swap-AB, N % 8 == 0)"
    if key.stages != stages_for(
        key.dtype, key.tile_m, key.tile_n, key.persistent, key.pingpong, key.swap_ab
    ):
        return "stages must fill shared memory (stages_for)"
    return None


class GemmProblem(NamedTuple):
    m: int
    n: int
    k: int
    dtype: str = BF16_DTYPE
    has_bias: bool = True


def check_problem(problem: GemmProblem, family: str) -> None:
    """Refuse problems no kernel of `family` is built for, with the reason."""
    m, n, k, dtype, _ = problem
    wanted = FP8_DTYPE if family == FP8_FAMILY else BF16_DTYPE
    if dtype != wanted:
        other = FAMILY if dtype == BF16_DTYPE else FP8_FAMILY if dtype == FP8_DTYPE else None
        hint = f" (use {other})" if other else ""
        raise UnsupportedProblemError(f"{family} takes {wanted} x and w, got {dtype}{hint}")
    if min(m, n, k) < 1:
        raise UnsupportedProblemError(f"{family}: empty problem M={m} N={n} K={k}")
    divisor = K_DIVISOR[dtype]
    if k % divisor:
        raise UnsupportedProblemError(
            f"{family}: {dtype} rows must be {ALIGN_BYTES}-byte aligned for TMA, so K % "
            f"{divisor} == 0; got K={k}"
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
    return packaged_tables(__name__).get((family, arch)) or handwritten_table(family, arch)


def _holds(row: dict, m: int) -> bool:
    low, high = row["m"]
    return low <= m and (high is None or m <= high)


def _shape_row(data: dict, m: int, n: int, k: int) -> dict | None:
    for row in data.get("shape_rows", ()):
        if row["n"] == n and row["k"] == k and _holds(row, m):
            return row
    return None


# Measured cost of a persistent tile, in ns per 10^6 tile elements per k-tile and wave: medians
# over the 23 default shapes at M 512..8192 (aot-tune, H200, bf16). The larger tiles are the
# cheapest per element; the smaller ones win only when they fill the waves better.
WAVE_TILE_COST = {(128, 256): 23.8, (128, 128): 24.0, (64, 256): 30.0, (64, 128): 36.0}
# The fill widths (non-persistent, 1x1 cluster) in the same unit: medians over the four shapes
# re-tuned with them at M 512..8192 (aot-tune, H200, bf16), scaled by 128 x 256's cost there.
# Dearer per element, they win where their tile count lands on whole waves (N = 4608, M = 512:
# 128 tiles of 128 x 144 in one wave, against 72 of 128 x 256 doing 1.8x the work per SM).
FILL_WAVE_TILE_COST = {
    (128, 192): 24.5,
    (128, 144): 25.9,
    (128, 160): 26.3,
    (128, 112): 28.5,
    (128, 96): 30.4,
    (64, 192): 30.4,
    (64, 160): 32.6,
    (64, 144): 33.0,
}
# Split 128-row tiles (1x1xS cluster, reduced in distributed shared memory), by (tile_m, tile_n,
# split), in the same unit for the whole K; the wave model scales them by the share of K (and
# fill) a split CTA streams. Medians over the four held-out shapes at M 512..2048 (aot-tune,
# H200, bf16), each problem's unit from its unsplit tiles: splitting costs 1.2-1.4x per element
# at 2 ways, 1.6-1.8x at 4 (the reduction and a shorter main loop), worth it only where the
# unsplit tiles leave most SMs idle. By dtype, measured for bf16 only: fp8 splits no untuned
# shape (with bf16's costs, fp8 512 x 1024 x 4096 took split-K 2 and ran 0.92x the unsplit
# tile's speed).
SPLIT_WAVE_TILE_COST = {
    BF16_DTYPE: {
        (128, 256, 2): 27.4,
        (128, 192, 2): 29.6,
        (128, 160, 2): 31.4,
        (128, 144, 2): 33.0,
        (128, 128, 2): 35.0,
        (128, 112, 2): 36.7,
        (128, 96, 2): 40.9,
        (128, 80, 2): 43.2,
        (128, 256, 4): 36.3,
        (128, 192, 4): 41.2,
        (128, 160, 4): 41.3,
        (128, 144, 4): 47.9,
        (128, 112, 4): 47.3,
        (128, 96, 4): 52.5,
        (128, 80, 4): 56.7,
    },
}
WAVE_MODEL_MIN_M = 512  # below its bucket the tuned rows' measured costs decide (_row_cost_row)
# Up to this many k-tiles a persistent 128-row tile runs as ping-pong 128 x 128: its epilogue
# then hides under the other warpgroup's main loop. Against the cooperative persistent tiles
# the tuned rows had picked, same problems (aot-tune, H200, M 512..8192), ping-pong 128 x 128
# (cluster 2x1) ran 1.07x as fast at K 512..2048 (bf16, 8..32 k-tiles) and 1.1-1.2x (fp8,
# 4..16), 1.00x at 32 k-tiles of fp8; from 64 k-tiles on, 0.97-1.04x: no gain to model.
PINGPONG_MAX_K_TILES = 32


def wave_model_tactic(
    m: int, n: int, promoted: bool = False, k_tiles: int = 0, dtype: str = BF16_DTYPE
) -> tuple[dict, str]:
    """For a large-M shape nobody tuned: the tile with the least cost x tile x waves (whole
    waves of SMS tiles: a tile count just past a wave costs the whole next wave). A persistent
    tile multicasts the w tile to a 2x1 cluster where there are two M tiles to share it; a fill
    width runs one CTA per tile. `promoted` (fp8): only tiles whose second accumulator set
    fits. Split-K tiles compete only for the dtypes whose split costs were measured. On the
    tuned shapes the persistent tiles alone were within 3% (geomean) of the measured best,
    where a fixed tile or the nearest row lost up to 45%."""
    tiles = [(tile, True, 1) for tile in WAVE_TILE_COST]
    tiles += [(tile, False, 1) for tile in FILL_WAVE_TILE_COST]
    split_costs = SPLIT_WAVE_TILE_COST.get(dtype, {})
    tiles += [
        ((tile_m, tile_n), False, split)
        for tile_m, tile_n, split in split_costs
        if split_fits(split, k_tiles, BORROWED_MIN_K_TILES_PER_SPLIT)
    ]
    if promoted:
        tiles = [choice for choice in tiles if can_promote(*choice[0])]

    def cost(choice):
        (tile_m, tile_n), walks, split = choice
        ctas = tiles_of({"tile_m": tile_m, "tile_n": tile_n}, m, n) * split
        if split == 1:
            per_element = (WAVE_TILE_COST if walks else FILL_WAVE_TILE_COST)[tile_m, tile_n]
            return per_element * tile_m * tile_n * -(-ctas // SMS)
        # A split CTA streams 1/split of K besides its fill (_work's unit).
        share = (-(-k_tiles // split) + CTA_FILL_K_TILES) / (k_tiles + CTA_FILL_K_TILES)
        per_element = split_costs[tile_m, tile_n, split] * share
        return per_element * tile_m * tile_n * -(-ctas // SMS)

    (tile_m, tile_n), walks, split = min(tiles, key=cost)
    pingpong = walks and tile_m == 128 and not promoted and 0 < k_tiles <= PINGPONG_MAX_K_TILES
    tile_n = 128 if pingpong else tile_n
    tactic = {
        "tile_m": tile_m,
        "tile_n": tile_n,
        "cluster_m": 2 if walks and m > tile_m else 1,
        "cluster_n": 1,
        "swap_ab": False,
        "split_k": split,
        "persistent": walks,
        "pingpong": pingpong,
    }
    count = tiles_of(tactic, m, n)
    kind = "persistent tiles" if walks else "tiles (fill width)" if split == 1 else "tiles"
    why = f"wave model: {count} {kind} of {tile_m}x{tile_n}"
    if split > 1:
        why += f" x split-K {split} ({k_tiles} k-tiles)"
    why += f" in {-(-count * split // SMS)} wave(s)"
    if pingpong:
        why += f"; {k_tiles} k-tiles <= {PINGPONG_MAX_K_TILES}: ping-pong 128x128"
    return tactic, why


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


def _waves(tactic: dict, m: int, n: int) -> int:
    """Whole waves of CTAs a tactic launches on an M x N out (K splits included)."""
    return -(-tiles_of(tactic, m, n) * tactic["split_k"] // SMS)


def _work(tactic: dict, m: int, n: int, k: int, dtype: str) -> int:
    """What a tactic's time scales with on one problem: whole waves of CTAs x (k-tiles per CTA
    + CTA_FILL_K_TILES) x tile elements (a tile count just past a wave costs the whole next
    wave)."""
    per_cta = -(-k_tiles_of(k, dtype) // tactic["split_k"]) + CTA_FILL_K_TILES
    return _waves(tactic, m, n) * per_cta * tactic["tile_m"] * tactic["tile_n"]


def _row_cost_row(data: dict, m: int, n: int, k: int, dtype: str) -> dict | None:
    """For a shape nobody tuned: among the tactics that won a tuned row at this M, the one whose
    measured time per unit of _work (median over its rows) times this shape's _work is least.
    Left out one tuned shape at a time on the H200's M = 128 / 256 measurements, it ran within
    6% (bf16) / 7% (fp8) of the measured best, geomean, where the nearest shape's row lost 14%."""
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
        work = _work(tactic, measured_m, row["n"], row["k"], dtype)
        per_unit.setdefault(name, []).append(row["us"] / work)
        rows.setdefault(name, row)
    if not per_unit:
        return None
    best = min(
        per_unit,
        key=lambda name: statistics.median(per_unit[name]) * _work(dict(name[:-1]), m, n, k, dtype),
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
    measured_waves, split = _waves(tactic, high or M_BUCKETS[-1], row["n"]), tactic["split_k"]
    while tactic["split_k"] > 1 and _waves(tactic, m, n) > measured_waves:
        tactic["split_k"] //= 2
    if tactic["split_k"] != split:
        why += f"; split-K {tactic['split_k']} keeps N={n} in {_waves(tactic, m, n)} wave(s)"
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


# (N, K) of the dense layers the default bundles serve (fused QKV and gate-up as served).
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = (
    # Llama-3-8B: hidden 4096, 32 q / 8 kv heads of 128, intermediate 14336
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    # Llama-3-70B: hidden 8192, 64 q / 8 kv heads of 128, intermediate 28672
    (10240, 8192),
    (8192, 8192),
    (57344, 8192),
    (8192, 28672),
    # Qwen3-32B: hidden 5120, 64 q / 8 kv heads of 128, intermediate 25600
    (10240, 5120),
    (5120, 8192),
    (51200, 5120),
    (5120, 25600),
    # DeepSeek-V3 dense MLP (first 3 layers): hidden 7168, intermediate 18432; shared expert
    # (intermediate 2048); MLA projections (q_lora 1536, kv_lora 512, 128 heads of 128 + 64 rope)
    (36864, 7168),
    (7168, 18432),
    (4096, 7168),
    (7168, 2048),
    (1536, 7168),
    (24576, 1536),
    (576, 7168),
    (32768, 512),
    (7168, 16384),
)


def shapes_from_config(config: dict[str, Any], family: str) -> list[tuple[int, int]]:
    """(N, K) of a transformer's dense projections: attention (QKV and O, or MLA's low-rank
    projections), the dense MLP (gate-up, down) and shared experts (gate-up, down)."""
    hidden = config.get("hidden_size")
    if not _positive(hidden):
        return []
    shapes = _attention_shapes(config, hidden)
    for width in (
        config.get("intermediate_size"),
        _product(config.get("n_shared_experts"), config.get("moe_intermediate_size")),
    ):
        if _positive(width):
            shapes += [(2 * width, hidden), (hidden, width)]
    dtype = FP8_DTYPE if family == FP8_FAMILY else BF16_DTYPE
    unique = list(dict.fromkeys(shapes))
    for n, k in unique:
        check_problem(GemmProblem(1, n, k, dtype), family)
    return unique


def _attention_shapes(config: dict[str, Any], hidden: int) -> list[tuple[int, int]]:
    heads = config.get("num_attention_heads")
    if not _positive(heads):
        return []
    kv_rank, q_rank = config.get("kv_lora_rank"), config.get("q_lora_rank")
    if _positive(kv_rank):  # multi-head latent attention (DeepSeek-V2/V3)
        nope, rope = config.get("qk_nope_head_dim"), config.get("qk_rope_head_dim")
        v_dim = config.get("v_head_dim")
        if not all(_positive(v) for v in (nope, rope, v_dim)):
            return []
        q_head = heads * (nope + rope)
        shapes = [(q_rank, hidden), (q_head, q_rank)] if _positive(q_rank) else [(q_head, hidden)]
        return shapes + [
            (kv_rank + rope, hidden),  # kv_a (with the shared rope key)
            (heads * (nope + v_dim), kv_rank),  # kv_b
            (hidden, heads * v_dim),  # o
        ]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    if not all(_positive(v) for v in (kv_heads, head_dim)):
        return []
    q = heads * head_dim
    return [(q + 2 * kv_heads * head_dim, hidden), (hidden, q)]


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _product(*values):
    return values[0] * values[1] if all(_positive(v) for v in values) else None


class GemmSm90Family(KernelFamily):
    """The family contract for the bf16 Hopper GEMM (kernels/contract.py)."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = GemmSm90Key
    archs = ARCHS
    dtype = BF16_DTYPE
    abi = (
        TensorArg("x", BF16_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("w", BF16_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("bias", BF16_DTYPE, 1, align_bytes=ALIGN_BYTES, optional=True),
        TensorArg("out", OUT_DTYPE, 2, align_bytes=ALIGN_BYTES, output=True),
    )
    builder = "cute_aot.kernels.gemm_sm90.build"
    default_shapes = DEFAULT_SHAPES
    shape_syntax = "N,K"

    def problem(self, x, w, bias, *scales) -> GemmProblem:
        from cute_aot.artifacts.errors import InputError

        (m, k), (n, k_w) = x.shape, w.shape
        if k != k_w:
            raise InputError(f"{self.name}: x is [M, K={k}] but w is [N, K={k_w}]")
        if bias is not None and tuple(bias.shape) != (n,):
            raise InputError(f"{self.name}: bias must be [N={n}], got {list(bias.shape)}")
        for scale in scales:
            if tuple(scale.shape) != (1,):
                raise InputError(f"{self.name}: scales must be [1], got {list(scale.shape)}")
        if 0 in (m, n, k):
            raise InputError(f"{self.name}: empty problem x {tuple(x.shape)}, w {tuple(w.shape)}")
        dtype = str(x.dtype).removeprefix("torch.")
        if str(w.dtype).removeprefix("torch.") != dtype:
            raise InputError(f"{self.name}: x is {dtype} but w is {w.dtype}")
        if k % K_DIVISOR.get(dtype, 1):
            raise InputError(f"{self.name}: K={k} must be a multiple of {K_DIVISOR[dtype]}")
        return GemmProblem(m, n, k, dtype, bias is not None)

    def dispatch(self, problem, arch: str, table: Table | None = None) -> Dispatch:
        return dispatch_problem(problem, arch, self.name, table)

    def default_table(self, arch: str) -> Table | None:
        return default_table(self.name, arch)

    def tune_problems(self, shape) -> Iterator[GemmProblem]:
        """One problem per M bucket, with bias: the tactic does not depend on it."""
        n, k = shape
        for m in M_BUCKETS:
            yield GemmProblem(m, n, k, self.dtype, True)

    def tune_candidates(self, problem, arch: str) -> list[GemmSm90Key]:
        """The tactics worth timing at this M: swap-AB (tile fitted to M) and 64-row tiles for
        decode sizes; every tile up to 128 x 128 split or not, and the wide ones, for mid M;
        every tile (fill widths, clusters, rasters, splits, persistent) above."""
        problem = GemmProblem(*problem)
        check_problem(problem, self.name)
        aligned_n = problem.n % OUT_VECTOR == 0
        m = problem.m

        def wanted(key: GemmSm90Key) -> bool:
            if key.swap_ab:
                return m <= 256 and key.tile_n == swap_tile_n(m)
            if m <= 64:
                return key.tile_m == 64 and key.tile_n <= 128 and key.cluster_m == key.cluster_n
            if m <= 256:
                return not key.persistent
            # Fill widths too: a width whose tiles land on whole waves (N = 576 in 4 tiles of
            # 144, N = 5120 in 32 of 160) beats the padded or wave-split power-of-two tiles;
            # and split tiles of both heights (M = 1024, N = 576: 64 x 144 split 2 ways, 128).
            return True

        return [
            key
            for key in self.tactic_space(arch, aligned=(aligned_n,))
            if key.has_bias == problem.has_bias and wanted(key)
        ]

    def tuned_table(self, arch: str, winners: list, provenance: dict, base=None) -> Table:
        return tuned_table(self.name, arch, winners, provenance, base)

    def problems(self, shape) -> Iterator[GemmProblem]:
        n, k = shape
        for m in M_BUCKETS:
            for has_bias in (False, True):
                yield GemmProblem(m, n, k, self.dtype, has_bias)

    def parse_shape(self, text: str) -> tuple[int, int]:
        n, k = parse_ints(self, text, self.shape_syntax)
        check_problem(GemmProblem(1, n, k, self.dtype), self.name)
        return n, k

    def parse_problem(self, text: str, dtypes: str | None = None) -> GemmProblem:
        """`M,N,K` (bias read) or `M,N,K,0` (no bias), the dims also named (`M=7,N=6144,K=4096`);
        --dtype names x and w's dtype."""
        values = text.split(",")
        has_bias = True
        if len(values) == 4:
            flag = values.pop().strip().lower().removeprefix("bias=")
            if flag not in ("0", "1", "false", "true"):  # not a dim misread as a bias flag
                raise UnsupportedProblemError(f"{self.name}: {text!r} is not M,N,K[,0|1]")
            has_bias = flag in ("1", "true")
        m, n, k = parse_ints(self, ",".join(values), "M,N,K")
        return GemmProblem(m, n, k, (dtypes or self.dtype).split(",")[0].strip(), has_bias)

    def describe_problem(self, problem) -> dict:
        return GemmProblem(*problem)._asdict()

    def shapes_from_model(self, config: dict) -> list[tuple[int, int]]:
        return shapes_from_config(config, self.name)

    def input_shapes(self, problem) -> tuple[tuple[int, ...] | None, ...]:
        m, n, k, _, has_bias = GemmProblem(*problem)
        return (m, k), (n, k), (n,) if has_bias else None

    def bind(self, function, problem):
        """Without a bias the key's kernel never reads one; the exported function still takes
        a bf16 [N] tensor, so it gets out's first row (no allocation, right device)."""
        if GemmProblem(*problem).has_bias:
            return function
        return lambda x, w, bias, out: function(x, w, out[0], out)

    def tactic_space(self, arch: str, aligned: tuple[bool, ...] = (True,)) -> list[GemmSm90Key]:
        """Every tile and cluster shape the kernel builds, with and without bias; for the tiles
        large M uses, also other raster groups (BLOCK_ORDER: M tiles fastest, no grouping).
        `aligned`: which epilogues (N % 8 == 0, or any N); default shapes all have N % 8 == 0."""
        if arch not in ARCHS:
            return []
        promotes = (False, True) if self.dtype == FP8_DTYPE else (False,)
        # Three consumer warpgroups (192 rows) for large M: 192 x 128 and 192 x 192.
        wide_m = [(192, 128), (192, 192)]
        unsplit = [
            (tile_m, tile_n, cluster_m, cluster_n, raster_m, False, 1, False, False)
            for tile_m, tile_n in [(m, n) for m in (64, 128) for n in (64, 128, 256)] + wide_m
            for cluster_m, cluster_n in ((1, 1), (2, 1), (1, 2))
            for raster_m in (
                (RASTER_M, 2 * RASTER_M, BLOCK_ORDER)
                if tile_m * tile_n >= 128 * 128
                else (RASTER_M,)
            )
        ]
        persistent = [
            (tile_m, tile_n, cluster_m, cluster_n, RASTER_M, False, 1, True, pingpong)
            for tile_m, tile_n in [(m, n) for m in (64, 128) for n in (128, 256)] + wide_m
            for cluster_m, cluster_n in ((1, 1), (2, 1), (1, 2))
            for pingpong in (False, True)
        ]
        filling = [
            (tile_m, tile_n, cluster_m, 1, RASTER_M, False, 1, False, False)
            for tile_m in (64, 128)
            for tile_n in FILL_TILE_N
            for cluster_m in (1, 2)
        ]
        split = (
            [
                (tile_m, tile_n, 1, 1, RASTER_M, False, split_k, False, False)
                for tile_m in (64, 128)
                for tile_n in (64, 128)
                for split_k in SPLITS[1:]
            ]
            + [
                (128, tile_n, 1, 1, RASTER_M, False, split_k, False, False)
                for tile_n in SPLIT_WIDE_TILE_N
                for split_k in SPLITS[1:3]
            ]
            + [
                (64, tile_n, 1, 1, RASTER_M, False, split_k, False, False)
                for tile_n in SPLIT_DECODE_TILE_N
                for split_k in SPLITS[1:3]
            ]
        )
        swapped = [
            (tile_m, tile_n, 1, 1, RASTER_M, True, split_k, False, False)
            for tile_m in (64, 128)
            for tile_n in SWAP_TILE_N
            for split_k in SPLITS
        ]
        keys = [
            self.Key(
                self.dtype,
                has_bias,
                tile_m,
                tile_n,
                cluster_m,
                cluster_n,
                stages_for(self.dtype, tile_m, tile_n, walks, pingpong, swap_ab),
                PDL,
                raster_m,
                aligned_n,
                swap_ab,
                split_k,
                promote,
                walks,
                pingpong,
            )
            for (
                tile_m,
                tile_n,
                cluster_m,
                cluster_n,
                raster_m,
                swap_ab,
                split_k,
                walks,
                pingpong,
            ) in unsplit + filling + persistent + split + swapped
            for promote in promotes
            for has_bias in (False, True)
            for aligned_n in aligned
        ]
        return [key for key in keys if tactic_refusal(key) is None]

    def output_shape(self, problem) -> tuple[int, int]:
        return problem[0], problem[1]

    def reference(self, x, w, bias=None):
        """F.linear in fp32, cast to bf16."""
        import torch.nn.functional as F

        return F.linear(x.float(), w.float(), None if bias is None else bias.float()).bfloat16()


class GemmSm90Fp8Family(GemmSm90Family):
    """fp8 e4m3 x and w with per-tensor fp32 device scales: its own ABI, so its own family."""

    name = FP8_FAMILY
    Key = GemmSm90Fp8Key
    dtype = FP8_DTYPE
    abi = (
        TensorArg("x", FP8_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("w", FP8_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("x_scale", "float32", 1, align_bytes=4),
        TensorArg("w_scale", "float32", 1, align_bytes=4),
        TensorArg("bias", BF16_DTYPE, 1, align_bytes=ALIGN_BYTES, optional=True),
        TensorArg("out", OUT_DTYPE, 2, align_bytes=ALIGN_BYTES, output=True),
    )

    def problem(self, x, w, x_scale, w_scale, bias) -> GemmProblem:
        return super().problem(x, w, bias, x_scale, w_scale)

    def input_shapes(self, problem) -> tuple[tuple[int, ...] | None, ...]:
        m, n, k, _, has_bias = GemmProblem(*problem)
        return (m, k), (n, k), (1,), (1,), (n,) if has_bias else None

    def bind(self, function, problem):
        if GemmProblem(*problem).has_bias:
            return function
        return lambda x, w, x_scale, w_scale, bias, out: function(
            x, w, x_scale, w_scale, out[0], out
        )

    def reference(self, x, w, x_scale, w_scale, bias=None):
        """fp32 product of the dequantised operands, scaled, plus bias, cast to bf16."""
        import torch.nn.functional as F

        acc = F.linear(x.float(), w.float()) * (x_scale.float() * w_scale.float())
        return (acc if bias is None else acc + bias.float()).bfloat16()


family = GemmSm90Family()
fp8_family = GemmSm90Fp8Family()
Key = GemmSm90Key
