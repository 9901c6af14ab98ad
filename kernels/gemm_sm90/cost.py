"""Hopper GEMM wave and cost model: tiles, k-tiles and waves of a tactic on a problem, the
split-K rules, and the measured per-tile costs the wave model picks a tile for an untuned
large-M shape by (wave_model_tactic).

Dispatch only (dispatch.py): neither kernel.py nor build.py imports it, so tuning it never makes
built bundles stale. Waves are of resources.SMS CTAs. This module never imports cutlass or torch.
"""

from __future__ import annotations

from cute_aot.kernels.gemm_sm90.resources import BF16_DTYPE, SMS, SPLITS, TILE_K, can_promote

# Split-K adds CTAs only up to about this many: past it, aot-tune on the H200 measured the
# 1x1xS cluster's reduction costing more than the extra SMs bring (M <= 256, 23 layer shapes).
SPLIT_MAX_CTAS = 72
MIN_K_TILES_PER_SPLIT = 4  # fewer and the pipeline never fills
# A split borrowed from another shape's row (M 128-256, shapes nobody tuned) keeps at least this
# many k-tiles per CTA: on held-out shapes (N, K = 768..3072, 1536..4096) the H200 measured
# short-K splits losing up to 0.57x cuBLAS where the unsplit or half-split tile won.
BORROWED_MIN_K_TILES_PER_SPLIT = 16
# What a CTA pays besides streaming its k-tiles (pipeline fill, epilogue), in k-tiles: the cost
# model of borrowed rows (work_of) charges it per CTA, so splitting a short K is not free.
CTA_FILL_K_TILES = 8


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
        # A split CTA streams 1/split of K besides its fill (work_of's unit).
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


def waves_of(tactic: dict, m: int, n: int) -> int:
    """Whole waves of CTAs a tactic launches on an M x N out (K splits included)."""
    return -(-tiles_of(tactic, m, n) * tactic["split_k"] // SMS)


def work_of(tactic: dict, m: int, n: int, k: int, dtype: str) -> int:
    """What a tactic's time scales with on one problem: whole waves of CTAs x (k-tiles per CTA
    + CTA_FILL_K_TILES) x tile elements (a tile count just past a wave costs the whole next
    wave)."""
    per_cta = -(-k_tiles_of(k, dtype) // tactic["split_k"]) + CTA_FILL_K_TILES
    return waves_of(tactic, m, n) * per_cta * tactic["tile_m"] * tactic["tile_n"]
