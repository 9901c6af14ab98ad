"""Hopper GEMM resource model: shared memory, pipeline stages, registers and SMs, the one copy.

kernel.py allocates and checks shared memory and registers by it (HopperGemm.__init__) and
launches at most SMS CTAs in a persistent grid; keys.py refuses a key whose stages are not
stages_for's; dispatch and the cost model size tactics and count waves by it. kernel.py imports
it, so it is inside the family's source hash (kernels/__init__.py: binary_modules): a change here
makes built bundles stale, as a change to kernel.py does.

Two shared-memory figures for a persistent tile owner's epilogue, on purpose:

* staging_bytes: what the kernel allocates (its sC buffer): the TMA store's strips, else the
  padded out tile the way round it is staged; nothing for an any-N key (N % 8 != 0), which
  stores from registers.
* epilogue_bytes: what stages_for leaves free for it: the same with N % 8 == 0, except that a
  padded tile is counted either way round; and for an any-N key its N % 8 == 0 twin's strips,
  so both keys of a tactic have the same stages (an any-N persistent 128 x 128 tile keeps 6
  stages where its allocation alone would leave room for 7).

epilogue_bytes is never less than staging_bytes, so the stages of a key always fit what the
kernel allocates (HopperGemm re-checks it).

This module never imports cutlass or torch: servers import it on every call path.
"""

from __future__ import annotations

BF16_DTYPE = "bfloat16"
FP8_DTYPE = "float8_e4m3fn"
ELEMENT_BYTES = {BF16_DTYPE: 2, FP8_DTYPE: 1}
# Shared memory (kernel.py allocates by it and re-checks it): 227 KiB per CTA less barriers.
SMEM_CAPACITY = 232448  # bytes of dynamic shared memory an sm_90 CTA may use (227 KiB)
BARRIER_RESERVE = 1024  # mbarriers + alignment slack (per tile owner: ping-pong reserves two)
MAX_STAGES = 8
TILE_K = {BF16_DTYPE: 64, FP8_DTYPE: 128}  # 128-byte rows either way
# split-K: CTAs per output tile (a cluster (1, 1, S): at most 8 CTAs is portable)
SPLITS: tuple[int, ...] = (1, 2, 4, 8)
# H100/H200 SXM SMs: the CTAs a persistent grid launches at most (kernel.py; on another GPU only
# the wave count changes, never the result) and the SMs a wave fills (the cost model).
SMS = 132
WARPGROUP = 128  # threads
OUT_VECTOR = 8  # bf16 per 16-byte store of the staged epilogue; needs out rows 16-byte aligned
OUT_PAD = 8  # elements of padding per staged out row: rows 4 (bf16) / 8 (fp32) banks apart
# TMA-store epilogue (persistent, whole tiles in out's order): the tile leaves in strips of
# EPI_COLS columns (16 where tile_n is not a multiple of 32) as high as the tiled MMA, each
# through one of EPI_BUFFERS shared-memory buffers per tile owner.
EPI_COLS = 32
EPI_BUFFERS = 2
# fp32 accumulators a consumer thread may hold (promotion included), by consumer warpgroups:
# what their registers (kernel.py: CONSUMER_REGS) leave beside addresses, pipeline state and the
# epilogue's values.
MAX_ACC_PER_THREAD = {1: 128, 2: 128, 3: 96}


def accumulators_per_thread(tile_m: int, tile_n: int, pingpong: bool = False) -> int:
    """A cooperative tile spreads over tile_m / 64 warpgroups; a ping-pong tile is one's."""
    return tile_m * tile_n // ((1 if pingpong else tile_m // 64) * WARPGROUP)


def accumulator_budget(tile_m: int, pingpong: bool = False) -> int:
    """The accumulators a consumer thread may hold: three consumer warpgroups have fewer
    registers each (kernel.py: CONSUMER_REGS)."""
    return MAX_ACC_PER_THREAD[2 if pingpong else tile_m // 64]


def can_promote(tile_m: int, tile_n: int, pingpong: bool = False) -> bool:
    """fp8 promotion holds a second accumulator set: it must fit in the registers."""
    return 2 * accumulators_per_thread(tile_m, tile_n, pingpong) <= accumulator_budget(
        tile_m, pingpong
    )


def stores_by_tma(tile_n: int, persistent: bool, swap_ab: bool, aligned_n: bool = True) -> bool:
    """kernel.py: a persistent tile in out's own order leaves by TMA stores of column strips
    (N % 8 == 0 too; an any-N key stores from registers and needs no buffer at all)."""
    return persistent and aligned_n and not swap_ab and tile_n % 16 == 0


def strip_cols(tile_n: int) -> int:
    """Columns per TMA-stored epilogue strip (kernel.py: epi_tile)."""
    return EPI_COLS if tile_n % EPI_COLS == 0 else 16


def stage_bytes(tile_m: int, tile_n: int, tile_k: int, elem_bytes: int) -> int:
    """Shared memory of one pipeline stage: one A tile and one B tile."""
    return (tile_m + tile_n) * tile_k * elem_bytes


def staged_bytes(out_tile: tuple[int, int], elem_bytes: int) -> int:
    """Shared memory of the staged out tile (padded rows)."""
    return out_tile[0] * (out_tile[1] + OUT_PAD) * elem_bytes


def staging_bytes(
    tile_m: int,
    tile_n: int,
    persistent: bool,
    swap_ab: bool = False,
    pingpong: bool = False,
    aligned_n: bool = True,
) -> int:
    """Shared memory the kernel allocates for a persistent CTA's tile owner's epilogue: two bf16
    strips for the TMA store (tile_m rows, ping-pong's 64), else the padded bf16 tile in out's
    order (out^T under swap-AB). None unless persistent with N % 8 == 0: a plain CTA stages in
    its idle operand slots, an any-N key stores from registers."""
    if stores_by_tma(tile_n, persistent, swap_ab, aligned_n):
        return EPI_BUFFERS * (64 if pingpong else tile_m) * strip_cols(tile_n) * 2
    if persistent and aligned_n:
        return staged_bytes((tile_n, tile_m) if swap_ab else (tile_m, tile_n), 2)
    return 0


def epilogue_bytes(
    tile_m: int, tile_n: int, persistent: bool, swap_ab: bool = False, pingpong: bool = False
) -> int:
    """Shared memory stages_for leaves a persistent CTA's tile owner for its epilogue: what the
    kernel allocates with N % 8 == 0 (staging_bytes: two bf16 strips for the TMA store, tile_m
    rows, ping-pong's 64), except that the padded tile is counted either way round (swap-AB
    stages out^T). An any-N key's stages are its N % 8 == 0 twin's, though it allocates none."""
    if not persistent:
        return 0  # the epilogue stages in the idle operand slots
    if stores_by_tma(tile_n, persistent, swap_ab):
        return staging_bytes(tile_m, tile_n, persistent, swap_ab, pingpong)
    return max(staged_bytes((tile_m, tile_n), 2), staged_bytes((tile_n, tile_m), 2))


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
    per_stage = stage_bytes(tile_m, tile_n, TILE_K[dtype], ELEMENT_BYTES[dtype])
    staging = epilogue_bytes(tile_m, tile_n, persistent, swap_ab, pingpong)
    owners = 2 if pingpong else 1
    free = SMEM_CAPACITY - owners * (BARRIER_RESERVE + staging)
    return min(MAX_STAGES, free // per_stage)


def _align(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


def shared_bytes(
    dtype: str,
    tile_m: int,
    tile_n: int,
    stages: int,
    persistent: bool = False,
    pingpong: bool = False,
    swap_ab: bool = False,
    aligned_n: bool = True,
) -> int:
    """The dynamic shared memory a kernel launches with: launch.py's struct, field by field —
    2 * stages mbarriers, each tile owner's bf16 bias slice (16-aligned), sA and sB
    (1024-aligned for the 128-byte swizzle), sC (1024-aligned: each owner's staging_bytes, at
    least 16 bytes), the whole rounded up to its 1024-byte alignment."""
    owners = 2 if pingpong else 1
    tile_k, elem = TILE_K[dtype], ELEMENT_BYTES[dtype]
    size = _align(2 * stages * 8, 16) + (tile_m if swap_ab else tile_n) * owners * 2
    size = _align(size, 1024) + stages * tile_m * tile_k * elem
    size = _align(size, 1024) + stages * tile_n * tile_k * elem
    staging = owners * staging_bytes(tile_m, tile_n, persistent, swap_ab, pingpong, aligned_n)
    size = _align(size, 1024) + max(staging, 16)
    return _align(size, 1024)
