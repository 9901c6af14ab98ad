"""Hopper GEMM tile scheduler: which output tile a CTA computes, and which k-tiles.

* Grid (host): ceil(Mk / tile_m) rounded up to cluster_m by ceil(Nk / tile_n) rounded up to
  cluster_n, or, persistent, one row of at most SMS / cluster CTAs (resources.SMS) whose
  clusters walk the cluster tiles.
* Raster: cluster tiles are visited in groups of raster_m M tiles (as Triton's GROUP_M), so
  that each wave reuses its operands from L2 (tile_of).
* Walk: a plain CTA computes one cluster tile, its block index; a persistent cluster the tiles
  c, c + L, c + 2L, .. of the L clusters launched (tiles_to_walk).
* K split: split_k CTAs of a (1, 1, S) cluster share a tile; CTA s runs k-tiles
  [s * T / S, (s + 1) * T / S) of the T = ceil(K / tile_k) (k_split).

Compile-time parameters only; the kernel (kernel.py) and the main loop (mainloop.py) ask it.
"""

import cutlass
import cutlass.cute as cute

from cute_aot.kernels.gemm_sm90.resources import SMS

__all__ = ["TileScheduler"]


class TileScheduler:
    """Grouped raster order over cluster tiles, one tile per CTA or a persistent walk."""

    def __init__(
        self,
        tile_shape_mnk: tuple[int, int, int],
        cluster_mn: tuple[int, int],
        raster_clusters: int,
        persistent: bool,
        split_k: int,
    ):
        self.tile_shape_mnk = tile_shape_mnk
        self.cluster_mn = cluster_mn
        self.raster_clusters = raster_clusters  # raster_m in clusters
        self.persistent = persistent
        self.split_k = split_k

    # ------------------------------------------------------------------ host
    def grid(self, a, b):
        """(grid x, grid y) of the launch; z is the K split. Traced by the host function, not a
        jit function of its own: it has no dynamic control flow."""
        tile_m, tile_n, _ = self.tile_shape_mnk
        cluster_m, cluster_n = self.cluster_mn
        grid_m = (a.shape[0] + (tile_m - 1)) // tile_m
        grid_n = (b.shape[0] + (tile_n - 1)) // tile_n
        grid_m = (grid_m + (cluster_m - 1)) // cluster_m * cluster_m
        grid_n = (grid_n + (cluster_n - 1)) // cluster_n * cluster_n
        if cutlass.const_expr(self.persistent):
            # One row of clusters along x, each walking cluster tiles (tiles_to_walk).
            clusters = (grid_m // cluster_m) * (grid_n // cluster_n)
            per_wave = SMS // (cluster_m * cluster_n)
            grid_m = cutlass.min(clusters, per_wave) * cluster_m
            grid_n = cluster_n
        return grid_m, grid_n

    # ---------------------------------------------------------------- device
    @cute.jit
    def cluster_tiles(self, mA, mB):
        """(cluster tiles along M, along N) of the whole problem."""
        tile_m, tile_n = self.tile_shape_mnk[:2]
        cluster_m, cluster_n = self.cluster_mn
        tiles_m = (mA.shape[0] + (tile_m - 1)) // tile_m
        tiles_n = (mB.shape[0] + (tile_n - 1)) // tile_n
        return (tiles_m + (cluster_m - 1)) // cluster_m, (tiles_n + (cluster_n - 1)) // cluster_n

    @cute.jit
    def tile_of(self, linear, clusters_m, clusters_n):
        """The output tile (m, n) of this CTA when its cluster takes cluster tile `linear`,
        clusters visited in groups of raster_m M tiles.

        Taken in plain order, a wave would cover a few N columns of every M tile and so stream
        all of x through L2 once per couple of N tiles. Grouping (as Triton's GROUP_M) makes
        each wave a compact block of tiles: about raster_m M tiles by (wave / raster_m) N
        tiles. Remapping whole clusters keeps each cluster's CTAs on neighbouring tiles that
        share their multicast operand.
        """
        bidx, bidy, _ = cute.arch.block_idx()
        cluster_m, cluster_n = self.cluster_mn
        per_group = self.raster_clusters * clusters_n
        first_m = (linear // per_group) * self.raster_clusters
        group_m = cutlass.min(clusters_m - first_m, self.raster_clusters)
        within = linear % per_group
        cluster_tile_m = first_m + within % group_m
        cluster_tile_n = within // group_m
        return (
            cluster_tile_m * cluster_m + bidx % cluster_m,
            cluster_tile_n * cluster_n + bidy % cluster_n,
        )

    @cute.jit
    def tiles_to_walk(self, mA, mB):
        """(first cluster tile, end, step) of this CTA's cluster: one tile in a plain grid (its
        block index, clusters in launch order), every L-th of them in a persistent one."""
        bidx, bidy, _ = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        cluster_m, cluster_n = self.cluster_mn
        clusters_m, clusters_n = self.cluster_tiles(mA, mB)
        if cutlass.const_expr(self.persistent):
            return bidx // cluster_m, clusters_m * clusters_n, grid_m // cluster_m
        first = bidx // cluster_m + (bidy // cluster_n) * clusters_m
        return first, first + 1, 1

    @cute.jit
    def k_split(self, mA, split):
        """(first k-tile, k-tiles) of K split `split` (0 unless split_k > 1)."""
        tile_k = self.tile_shape_mnk[2]
        k_total = (mA.shape[1] + (tile_k - 1)) // tile_k
        k_begin = split * k_total // self.split_k
        k_tiles = (split + 1) * k_total // self.split_k - k_begin
        return k_begin, k_tiles
