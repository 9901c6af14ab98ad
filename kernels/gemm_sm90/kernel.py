"""Hopper GEMM (CuTe DSL, sm_90a): wgmma fed by TMA through a multi-stage mbarrier pipeline.

    out[M, N] (bf16) = x[M, K] @ w[N, K]^T (+ bias[N]), fp32 accumulation.
    bf16 x, w:   out = bf16(acc + bias)
    fp8 e4m3 x, w (scaled=True): out = bf16(acc * x_scale[0] * w_scale[0] + bias)

M, N and K are runtime (symbolic) sizes: one binary serves every shape whose K keeps each row
16-byte aligned (K % 8 for bf16, K % 16 for fp8) and whose bases are 16-byte aligned.

Design (what a reviewer can check against the code below)
------
* Operands. The MMA computes a tile of A[Mk, K] @ B[Nk, K]^T. Normally A = x, B = w (kernel
  coordinates are out's). With swap_ab, A = w and B = x: the kernel computes out^T, so the
  token dimension M sits on the wgmma's N side, whose tile may be 8..64 wide. A decode-sized M
  then fills a 64- or 128-row weight tile instead of padding a 64-row x tile with zeros.
* CTA tile tile_m x tile_n x tile_k (kernel coordinates); tile_m in {64, 128, 192}, tile_n any
  multiple of 8 up to 256 (wgmma's N: widths such as 80 or 96 fill the SMs where powers of two
  leave a wave part-empty); tile_k = 64 for bf16 and 128 for fp8 (4 wgmma k-steps of 16 / 32, i.e.
  128-byte rows, 128-byte swizzle chosen by sm90_utils.make_smem_layout_a/b).
* Grid and scheduler: grid = (ceil(Mk/tile_m) rounded up to cluster_m, ceil(Nk/tile_n) rounded
  up to cluster_n, split_k). CTAs are mapped to output tiles in groups of raster_m M tiles (see
  scheduler.py) so that each wave reuses its operands from L2. z is the K split.
* Persistent (persistent=True, split_k = 1): the grid is at most SMS CTAs (resources.py: 132, the
  H100/H200 SXM SM count; on another GPU only the wave count changes, never the result); each
  cluster walks the cluster tiles c, c + L, c + 2L, .. (L clusters launched) in the same grouped
  raster order. The producer's pipeline runs on across tiles, so while the consumers run one
  tile's epilogue it is already loading the next tile's first `stages` k-tiles; the epilogue
  stages through its own shared-memory buffers (not the operand slots, which are being
  refilled): the TMA-store epilogue below, or (swap-AB) a whole padded out^T tile. Short-K
  shapes gain most: a CTA no longer pays a pipeline fill and an exposed epilogue per tile.
* Ping-pong (pingpong=True, persistent only): two consumer warpgroups each own whole tiles,
  warpgroup g the tiles g, g + 2, .. of its CTA's walk (tile_m x tile_n of at most 128
  accumulators per thread: 128 x 128, 64 x 256, 64 x 128). The producer loads every tile's
  k-tiles in walk order through the one pipeline, so warpgroup g skips the other's k-tiles
  (its pipeline states advance by k_tiles per foreign tile). The main loops take turns: g
  waits on named barrier MAIN_LOOP_TURN + g before its tile's first k-tile, and the other
  arrives on it once it has issued its own tile's last wgmma. The turn is what keeps the
  pipeline's parity waits exact: a warpgroup waits on a slot's "full" barrier only after every
  earlier use of that slot was waited for, never two phases ahead. Each warpgroup's epilogue
  (own staging buffer, own bias slice, own named barrier EPILOGUE_BARRIER + g) so runs while
  the other's wgmmas keep the tensor cores busy, which the cooperative tile cannot do.
* Split-K (split_k = S > 1): the S CTAs of one output tile form a cluster (1, 1, S); CTA s runs
  k-tiles [s * T / S, (s + 1) * T / S) of the T = ceil(K / tile_k). Each stages its fp32
  partial tile in its own shared memory; after a cluster barrier, CTA s reduces rows
  [s * R / S, (s + 1) * R / S) of the tile by reading all S partials through distributed shared
  memory (ld.shared::cluster), always in the order 0, 1, .., S - 1, so the result does not
  depend on timing (bitwise equal across runs and graph replays) and no workspace or second
  kernel is needed. A final cluster barrier keeps every CTA's partial alive until its peers
  have read it. Small M with small N thus launches S times more CTAs (9-24 CTAs of 132 SMs
  was what cost the most before).
* Warp roles, (C + 1) warpgroups of 128 threads:
    - warpgroups 0 .. C-1 are consumers. Cooperative (C = tile_m / 64): warpgroup g issues the
      wgmma of rows [64 g, 64 g + 64) of the tile (tiled MMA with atom layout (C, 1, 1), 64 x
      tile_n per atom), fp32 accumulators in registers (tile_n / 2 per thread). Ping-pong (C =
      2): each issues all tile_m / 64 atoms of its own tile (atom layout (1, 1, 1)).
      setmaxnreg raises them to 240 (C = 1), 232 (C = 2) or 152 (C = 3) registers. Three
      (tile_m = 192, at most 96 accumulators each: 192 x 192) is the shape cuBLAS ran on
      the H200 for large problems (nvjet 192 x 192, ncu): per k-tile it loads what 128 x 256
      loads for 12.5% more products, and a third warpgroup keeps wgmmas in flight.
    - warpgroup C is the producer: setmaxnreg lowers it to 40 registers; its warp 0 (one elected
      thread, inside cute.copy) issues the TMA loads; its other 3 warps only join the cluster
      barriers.
* Main-loop pipeline: PipelineTmaAsync with `stages` slots; per slot one "full" mbarrier (TMA
  transaction bytes = A tile + B tile bytes) and one "empty" mbarrier (one arrive per consumer
  warp per CTA that multicasts into this slot).  Producer: producer_acquire (wait empty, arm
  full with the byte count) -> TMA A tile, TMA B tile on the full barrier -> advance.  Consumer:
  consumer_wait (full) -> warpgroup.fence -> 4 wgmma k-steps -> commit_group; the slot of the
  previous k-tile is released only after wait_group(1) shows its wgmma finished (one wgmma
  batch in flight, so TMA writes never race the tensor cores' reads).
* fp8 promotion (promote=True): each k-tile's 4 wgmma (128 values of K) accumulate into a
  zeroed second register set; after wait_group(0) it is added to the fp32 accumulators in
  ordinary FMA precision. Hopper's fp8 tensor-core accumulation keeps about 14 bits, so without
  this the error grows with K (DeepSeek-V3 report 3.3.2 promotes at the same interval). It
  costs one wgmma batch of overlap per k-tile and twice the accumulator registers (tile_n <=
  128). promote=False is the fast-accumulation variant (as torch._scaled_mm with
  use_fast_accum=True), a separate tactic.
* Clusters for multicast (cluster_m x cluster_n, size <= 2, split_k = 1): the B tile is
  multicast to the cluster_m CTAs that share an N tile, the A tile to the cluster_n CTAs that
  share an M tile; each CTA loads its 1/cluster slice of the multicast tile.  Consumer releases
  go to every CTA of the multicast group (PipelineTmaAsync multicast signalling).  A final
  cluster barrier keeps each CTA's shared memory alive until its peers have stopped writing
  into it.
* Out of bounds: the TMA descriptors cover the true extents, so rows past M or N and columns
  past K of a box are zero-filled by the hardware (a zero K tail adds 0 to the accumulators).
  The epilogue predicates every store on (m < M, n < N).
* Epilogue (consumer threads only), after a barrier that shows every consumer warpgroup's last
  wgmma retired (the operand slots are reused): with N % 8 == 0 (aligned_n, what every model
  layer has) the tile is staged in shared memory in out's own row-major order (rows padded by 8
  elements against bank conflicts) and written back as 16-byte row segments of out, whole rows
  per warp, predicated on m < M and n < N. split_k = 1 stages bf16(acc * scale + bias), the
  bias read from shared memory: when a tile's main loop starts, the first consumer threads
  cp.async its bias slice (16 bytes each) into sBias, waited for just before the epilogue's
  first barrier, so the epilogue never waits on global bias loads. split_k > 1 stages the fp32
  partial and applies scale and bias after the reduction. Any other N (split_k = 1, no swap)
  stores each element from registers (2-byte stores).
* PDL (pdl=True): every thread executes griddepcontrol.wait after the pipeline's barriers are
  initialised and before the first global read of x / w / bias / scales and before any write of
  out; consumers execute griddepcontrol.launch_dependents after their last wgmma retired (before
  the epilogue), the producer after its last TMA was issued.  The launch sets use_pdl.
* TMA-store epilogue (persistent, no swap, N % 8 == 0, tile_n % 16 == 0: every large-M tactic):
  bf16(acc * scale + bias) is formed in registers, then leaves in strips of 32 columns (16 where
  tile_n is not a multiple of 32) as high as the tiled MMA (tile_m, or 64 rows for ping-pong's
  one-warpgroup MMA), so each strip's values are consecutive in the retiled fragment. Per
  strip: stmatrix from the retiled fragment into one of the tile owner's EPI_BUFFERS = 2
  swizzled buffers, fence.proxy.async (the TMA unit reads through the async proxy), named
  barrier, then warp 0 of the owner issues the TMA store, commits it and waits until at most
  one store is still reading shared memory, named barrier. So a buffer is rewritten only after
  the store issued two strips earlier has read it, the global writes run under the next strips
  and the next tile's main loop, TMA clips rows past M and columns past N (no predicates), and
  shared memory holds 2 strips per owner (16 KiB at tile_m = 128, 8 KiB per ping-pong
  warpgroup) instead of a whole padded tile: ping-pong 128 x 128 keeps 6 stages instead of 4,
  persistent 128 x 256 and 192 x 192 keep 4 instead of 3. Before the CTA exits, each storing
  warp waits for its last stores to finish reading.
* Barrier order per CTA: mbarrier init -> pipeline_init_arrive/wait (CTA or multicast
  cluster) -> [griddepcontrol.wait] -> [ping-pong: bar.sync MAIN_LOOP_TURN + g, except
  warpgroup 0's first tile] -> main loop (full/empty mbarriers) -> [ping-pong: bar.arrive
  MAIN_LOOP_TURN + 1 - g if the other has a next tile] -> named barrier 1 (ping-pong: 1 + g)
  (consumers: operand slots free, or persistent: the staging buffer's previous tile stored;
  each thread's bias piece waited for before it, so all are visible to every consumer) ->
  stage -> named barrier 1 (split_k = 1) or cluster barrier (split_k > 1, producer warps
  join) -> store (TMA-store epilogue instead: bias barrier, then per strip stmatrix -> fence ->
  barrier -> TMA store, wait_group.read 1 -> barrier) -> [persistent: next tile] -> cluster
  barrier (any cluster: peers done with this CTA's shared memory) -> exit.

Shared memory, stages, the accumulator budget and the SM count are resources.py's, the one model
that keys' stages (stages_for) and dispatch are sized by; this module checks by it and launch.py
allocates by it.

Modules, one job each (quack's split): scheduler.py (grid, raster order, persistent walk, K
split), mainloop.py (pipeline, TMA producer, wgmma consumers, ping-pong turns), epilogue.py
(register, staged/split-K and TMA-store strategies), launch.py (host: operands, layouts, TMA
descriptors, the shared-memory struct, the launch). This class holds the compile-time
parameters, picks the parts, and is the device entry (warp roles, barriers, cluster exit).

This module imports cutlass at import time; it is only imported at build time or for JIT. No
`from __future__ import annotations` here: cute.struct reads its field annotations as objects.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
from cutlass import BFloat16, Float32

from cute_aot.kernels.gemm_sm90.epilogue import (
    RegisterEpilogue,
    StagedEpilogue,
    TmaStoreEpilogue,
)
from cute_aot.kernels.gemm_sm90.launch import launch
from cute_aot.kernels.gemm_sm90.mainloop import Mainloop

# The one shared-memory, stage, register and SM model (pure Python; dispatch sizes keys by it).
from cute_aot.kernels.gemm_sm90.resources import (
    BARRIER_RESERVE,
    BF16_DTYPE,
    FP8_DTYPE,
    SMEM_CAPACITY,
    SPLITS,
    TILE_K,
    WARPGROUP,
    accumulator_budget,
    accumulators_per_thread,
    stage_bytes,
    staged_bytes,
    staging_bytes,
    stores_by_tma,
    strip_cols,
)
from cute_aot.kernels.gemm_sm90.scheduler import TileScheduler

__all__ = ["HopperGemm"]

PRODUCER_REGS = 40
CONSUMER_REGS = {1: 240, 2: 232, 3: 152}  # keeps (C * consumer + producer) * 128 <= 64 Ki
# The fp32 accumulators these leave a consumer thread: resources.MAX_ACC_PER_THREAD.


class HopperGemm:
    """out = x @ w^T (+ bias) on Hopper: TMA -> shared-memory pipeline -> wgmma -> bf16 stores."""

    def __init__(
        self,
        ab_dtype: type[cutlass.Numeric],
        tile_mn: tuple[int, int],
        cluster_mn: tuple[int, int],
        stages: int,
        has_bias: bool,
        pdl: bool,
        raster_m: int = 8,
        aligned_n: bool = True,
        swap_ab: bool = False,
        split_k: int = 1,
        promote: bool = False,
        persistent: bool = False,
        pingpong: bool = False,
    ):
        tile_m, tile_n = tile_mn
        if tile_m not in (64, 128, 192):
            raise ValueError(f"HopperGemm: tile_m must be 64, 128 or 192, got {tile_m}")
        if tile_n % 8 or not 8 <= tile_n <= 256:
            raise ValueError(f"HopperGemm: tile_n must be a multiple of 8 in 8..256, got {tile_n}")
        if cluster_mn not in ((1, 1), (2, 1), (1, 2)):
            raise ValueError(f"HopperGemm: cluster must be 1x1, 2x1 or 1x2, got {cluster_mn}")
        if ab_dtype not in (BFloat16, cutlass.Float8E4M3FN):
            raise ValueError(f"HopperGemm: operands must be bf16 or fp8 e4m3, got {ab_dtype}")
        if split_k not in SPLITS:
            raise ValueError(f"HopperGemm: split_k must be one of {SPLITS}, got {split_k}")
        if split_k > 1 and tuple(cluster_mn) != (1, 1):
            raise ValueError("HopperGemm: split_k > 1 uses the cluster for K; cluster must be 1x1")
        if persistent and split_k > 1:
            raise ValueError("HopperGemm: a persistent grid walks whole tiles: split_k must be 1")
        if pingpong and (not persistent or swap_ab or not aligned_n):
            raise ValueError(
                "HopperGemm: ping-pong walks whole tiles of a persistent grid "
                "(no swap-AB, N % 8 == 0)"
            )
        if (swap_ab or split_k > 1) and not aligned_n:
            raise ValueError("HopperGemm: swap_ab and split_k need N % 8 == 0 (aligned_n)")
        self.ab_dtype = ab_dtype
        self.scaled = ab_dtype.width == 8
        if promote and not self.scaled:
            raise ValueError("HopperGemm: promote is for fp8 (bf16 accumulates in fp32)")
        self.acc_dtype = Float32
        self.out_dtype = BFloat16
        # 4 wgmma k-steps per tile: 128-byte rows (k 16 for bf16, 32 for fp8 per wgmma).
        self.tile_k = TILE_K[FP8_DTYPE if self.scaled else BF16_DTYPE]
        self.tile_shape_mnk = (tile_m, tile_n, self.tile_k)
        self.cluster_mn = tuple(cluster_mn)
        self.stages = int(stages)
        self.persistent = bool(persistent)
        self.pingpong = bool(pingpong)
        self.out_tile = (tile_n, tile_m) if swap_ab else (tile_m, tile_n)
        # Cooperative: tile_m / 64 warpgroups share a tile, 64 rows each. Ping-pong: two
        # warpgroups, each owning whole tiles (every other tile this CTA walks).
        self.mma_warpgroups = 2 if self.pingpong else tile_m // 64
        self.tile_warpgroups = 1 if self.pingpong else self.mma_warpgroups
        # A persistent CTA stages its epilogue outside the operand slots (being refilled);
        # ping-pong warpgroups each have their own buffers. In out's own order (no swap) it
        # goes out by TMA stores of column strips, so only two strips need shared memory.
        # (resources: stores_by_tma, staging_bytes; stages_for leaves room for it.)
        self.tma_store = stores_by_tma(tile_n, persistent, swap_ab, aligned_n)
        # A strip spans the tiled MMA's rows (64 per warpgroup sharing the tile: ping-pong's
        # 128-row tile is two strips high), so its values are consecutive in the retiled
        # fragment (epilogue.py: TmaStoreEpilogue).
        rows = 64 * self.tile_warpgroups
        self.epi_tile = (rows, strip_cols(tile_n))
        self.staging_bytes = staging_bytes(tile_m, tile_n, persistent, swap_ab, pingpong, aligned_n)
        self.epilogue_bytes = self.staging_bytes * (2 if self.pingpong else 1)
        need = self.stages * stage_bytes(tile_m, tile_n, self.tile_k, ab_dtype.width // 8)
        reserve = BARRIER_RESERVE * (2 if self.pingpong else 1)
        if self.stages < 2 or need + self.epilogue_bytes + reserve > SMEM_CAPACITY:
            raise ValueError(
                f"HopperGemm: {self.stages} stages of {tile_m}x{tile_n}x{self.tile_k} need "
                f"{need} B of shared memory (have {SMEM_CAPACITY - reserve - self.epilogue_bytes}, "
                "min 2 stages)"
            )
        self.has_bias = bool(has_bias)
        self.pdl = bool(pdl)
        if raster_m < 1 or raster_m % cluster_mn[0]:
            raise ValueError(
                f"HopperGemm: raster_m must be a multiple of cluster_m, got {raster_m}"
            )
        self.raster_clusters = raster_m // cluster_mn[0]
        self.swap_ab = bool(swap_ab)
        self.split_k = int(split_k)
        self.promote = bool(promote)
        per_thread = accumulators_per_thread(tile_m, tile_n, self.pingpong)
        budget = accumulator_budget(tile_m, self.pingpong)
        if per_thread * (2 if self.promote else 1) > budget:
            raise ValueError(
                f"HopperGemm: a {tile_m}x{tile_n} tile has {per_thread} accumulators per thread"
                f"{' (promotion doubles them)' if self.promote else ''}; at most {budget} fit"
            )
        rows, cols = self.out_tile  # in out's own coordinates (rows of out, columns of out)
        if rows % self.split_k:
            raise ValueError(f"HopperGemm: split_k={split_k} must divide the tile's {rows} rows")
        # N % 8 == 0 (out rows 16-byte aligned): stage the tile in the operand slots and store
        # 16-byte segments; they must hold the padded tile (fp32 partials under split-K).
        self.aligned_n = bool(aligned_n)
        # The tile's bias slice, fetched into shared memory (cp.async) when its main loop
        # starts, so the epilogue reads it there instead of waiting on global loads. The
        # staged path without split-K only (split-K adds bias after the reduction).
        self.prefetch_bias = self.has_bias and self.aligned_n and self.split_k == 1
        self.bias_tile = tile_m if self.swap_ab else tile_n  # bias runs along out's columns
        self.staged_dtype = Float32 if self.split_k > 1 else self.out_dtype
        staged = staged_bytes(self.out_tile, self.staged_dtype.width // 8)
        if self.aligned_n and not self.persistent and staged > need:
            raise ValueError(f"HopperGemm: {self.stages} stages cannot stage a {tile_mn} out tile")
        self.threads = (self.mma_warpgroups + 1) * WARPGROUP
        self.mma_threads = self.mma_warpgroups * WARPGROUP
        self.tile_threads = self.tile_warpgroups * WARPGROUP  # consumers of one tile
        self.tile_owners = self.mma_warpgroups // self.tile_warpgroups  # 2 for ping-pong
        self.producer_warp = self.mma_warpgroups * 4  # first warp of the producer warpgroup
        self.a_mcast = self.cluster_mn[1]  # CTAs sharing one A tile (same M, other N)
        self.b_mcast = self.cluster_mn[0]  # CTAs sharing one B tile (same N, other M)
        # The parts, each with only the compile-time parameters of its job.
        self.scheduler = TileScheduler(
            self.tile_shape_mnk, self.cluster_mn, self.raster_clusters, self.persistent, split_k
        )
        if self.tma_store:
            epilogue_kind = TmaStoreEpilogue
        elif self.aligned_n:
            epilogue_kind = StagedEpilogue
        else:
            epilogue_kind = RegisterEpilogue
        self.epilogue = epilogue_kind(
            self.tile_shape_mnk,
            self.out_tile,
            self.swap_ab,
            self.split_k,
            self.scaled,
            self.has_bias,
            self.prefetch_bias,
            self.persistent,
            self.staging_bytes,
            self.epilogue_bytes,
            self.epi_tile,
            self.tile_threads,
            self.tile_owners,
        )
        self.mainloop = Mainloop(
            ab_dtype,
            self.acc_dtype,
            self.tile_shape_mnk,
            self.cluster_mn,
            self.stages,
            self.tile_threads,
            self.tile_owners,
            self.promote,
            self.pingpong,
            self.pdl,
            self.scheduler,
            self.epilogue,
        )

    # ------------------------------------------------------------------ host
    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        w: cute.Tensor,
        bias: cute.Tensor,
        out: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """bf16: (x, w, bias, out); the exported function's ABI order."""
        launch(self, x, w, None, None, bias, out, stream)

    @cute.jit
    def call_scaled(
        self,
        x: cute.Tensor,
        w: cute.Tensor,
        x_scale: cute.Tensor,
        w_scale: cute.Tensor,
        bias: cute.Tensor,
        out: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """fp8: (x, w, x_scale, w_scale, bias, out); scales are fp32 [1] device tensors."""
        launch(self, x, w, x_scale, w_scale, bias, out, stream)

    # ---------------------------------------------------------------- device
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        mXScale: cute.Tensor | None,
        mWScale: cute.Tensor | None,
        mBias: cute.Tensor,
        mOut: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_smem: cute.ComposedLayout,
        b_smem: cute.ComposedLayout,
        tma_out: cute.CopyAtom | None,
        mOutTma: cute.Tensor | None,
        epi_smem: cute.ComposedLayout | None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        first, end, step = self.scheduler.tiles_to_walk(mA, mB)
        clusters_m, clusters_n = self.scheduler.cluster_tiles(mA, mB)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == self.producer_warp:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

        # ---- cluster coordinates, multicast masks, this CTA's K split ----
        cta_layout_mnk = cute.make_layout((*self.cluster_mn, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        mcast_ctas = self.cluster_mn[0] * self.cluster_mn[1]
        cluster_coord = cta_layout_mnk.get_flat_coord(rank % mcast_ctas)
        split = rank // mcast_ctas  # 0 unless split_k > 1 (then the cluster is 1 x 1 x S)
        a_mask = None
        b_mask = None
        if cutlass.const_expr(self.a_mcast > 1):
            a_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1)
        if cutlass.const_expr(self.b_mcast > 1):
            b_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0)

        # ---- shared memory and the main-loop pipeline ----
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        main_pipe = self.mainloop.make_pipeline(storage, a_smem, b_smem, cta_layout_mnk)
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        sEpi = None
        if cutlass.const_expr(self.tma_store):
            sEpi = storage.sC.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)
        k_begin, k_tiles = self.scheduler.k_split(mA, split)

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_mn)
        if cutlass.const_expr(self.pdl):
            # Everything above touched only shared memory and descriptors; from here on x, w,
            # bias and scales are read and out is written.
            cute.arch.griddepcontrol_wait()

        if warp >= self.producer_warp:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == self.producer_warp:
                self.mainloop.produce(
                    tma_a,
                    mA,
                    tma_b,
                    mB,
                    sA,
                    sB,
                    main_pipe,
                    cta_layout_mnk,
                    cluster_coord,
                    (a_mask, b_mask),
                    (first, end, step),
                    (clusters_m, clusters_n),
                    (k_begin, k_tiles),
                )
            if cutlass.const_expr(self.split_k > 1):
                # The consumers' "partials staged" cluster barrier counts every thread.
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS[self.mma_warpgroups])
            owner = 0  # which of ping-pong's two tile owners this warpgroup is
            if cutlass.const_expr(self.pingpong):
                owner = warp // 4
            self.mainloop.consume(
                tiled_mma,
                sA,
                sB,
                storage,
                main_pipe,
                mXScale,
                mWScale,
                mBias,
                mOut,
                tidx % self.tile_threads if self.pingpong else tidx,
                split,
                (first, end, step),
                (clusters_m, clusters_n),
                k_tiles,
                owner,
                (tma_out, mOutTma, sEpi),
            )

        # Peers multicast into, or read the partial in, this CTA's shared memory: stay resident
        # until they are done.
        if cutlass.const_expr(self.cluster_mn[0] * self.cluster_mn[1] * self.split_k > 1):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
