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
  _tile_of) so that each wave reuses its operands from L2. z is the K split.
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
that keys' stages (stages_for) and dispatch are sized by; this module allocates and checks by it.

This module imports cutlass at import time; it is only imported at build time or for JIT. No
`from __future__ import annotations` here: cute.struct reads its field annotations as objects.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32
from cutlass.tensor_utils import LayoutEnum

# The one shared-memory, stage, register and SM model (pure Python; dispatch sizes keys by it).
from cute_aot.kernels.gemm_sm90.resources import (
    BARRIER_RESERVE,
    BF16_DTYPE,
    EPI_BUFFERS,
    FP8_DTYPE,
    OUT_PAD,
    OUT_VECTOR,
    SMEM_CAPACITY,
    SMS,
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

__all__ = ["HopperGemm"]

EPILOGUE_BARRIER = 1  # named barrier of the consumer warpgroups (0 is __syncthreads)
# Ping-pong: warpgroup g's epilogue barrier is EPILOGUE_BARRIER + g; "warpgroup g may start
# its main loop" is MAIN_LOOP_TURN + g (bar.sync by g, bar.arrive by the other).
MAIN_LOOP_TURN = 3
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
        # fragment (_epilogue_tma).
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
        self._launch(x, w, None, None, bias, out, stream)

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
        self._launch(x, w, x_scale, w_scale, bias, out, stream)

    def _launch(self, x, w, x_scale, w_scale, bias, out, stream):
        if cutlass.const_expr(x.element_type != self.ab_dtype or w.element_type != self.ab_dtype):
            raise TypeError(f"HopperGemm: x and w must be {self.ab_dtype}")
        if cutlass.const_expr(out.element_type != self.out_dtype):
            raise TypeError("HopperGemm: out must be bf16")
        if cutlass.const_expr(self.scaled != (x_scale is not None)):
            raise TypeError("HopperGemm: fp8 takes x_scale and w_scale, bf16 does not")
        a, b = (w, x) if self.swap_ab else (x, w)
        tile_m, tile_n, tile_k = self.tile_shape_mnk
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype,
            self.ab_dtype,
            LayoutEnum.from_tensor(a).sm90_mma_major_mode(),
            LayoutEnum.from_tensor(b).sm90_mma_major_mode(),
            self.acc_dtype,
            (self.tile_warpgroups, 1, 1),
            tiler_mn=(64, tile_n),
        )
        a_smem = sm90_utils.make_smem_layout_a(
            LayoutEnum.from_tensor(a),
            self.tile_shape_mnk,
            self.ab_dtype,
            self.stages,
        )
        b_smem = sm90_utils.make_smem_layout_b(
            LayoutEnum.from_tensor(b),
            self.tile_shape_mnk,
            self.ab_dtype,
            self.stages,
        )
        tma_a, tma_ma = cute.nvgpu.cpasync.make_tiled_tma_atom(
            self._tma_load_op(self.a_mcast),
            a,
            cute.slice_(a_smem, (None, None, 0)),
            (tile_m, tile_k),
            num_multicast=self.a_mcast,
        )
        tma_b, tma_mb = cute.nvgpu.cpasync.make_tiled_tma_atom(
            self._tma_load_op(self.b_mcast),
            b,
            cute.slice_(b_smem, (None, None, 0)),
            (tile_n, tile_k),
            num_multicast=self.b_mcast,
        )
        epi_smem = tma_out = tma_mout = None
        c_type, c_size = cutlass.Uint8, max(self.epilogue_bytes, 16)
        if cutlass.const_expr(self.tma_store):
            # Every owner's EPI_BUFFERS strips, swizzled as the TMA store reads them.
            epi_smem = sm90_utils.make_smem_layout_epi(
                self.out_dtype,
                LayoutEnum.from_tensor(out),
                self.epi_tile,
                EPI_BUFFERS * self.tile_owners,
            )
            c_type, c_size = self.out_dtype, cute.cosize(epi_smem)
            tma_out, tma_mout = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(),
                out,
                cute.slice_(epi_smem, (None, None, 0)),
                self.epi_tile,
            )

        @cute.struct
        class SharedStorage:
            pipeline_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            # One slice per warpgroup owning tiles; next to the barriers, in front of the
            # 1024-aligned sA (BARRIER_RESERVE, plus 1 KiB for ping-pong's two slices).
            sBias: cute.struct.Align[
                cute.struct.MemRange[BFloat16, self.bias_tile * self.tile_owners], 16
            ]
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(a_smem)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(b_smem)], 1024]
            # The persistent epilogue's buffer: raw bytes, or the TMA store's typed strips.
            sC: cute.struct.Align[cute.struct.MemRange[c_type, c_size], 1024]

        self.shared_storage = SharedStorage
        cluster_m, cluster_n = self.cluster_mn
        grid_m = (a.shape[0] + (tile_m - 1)) // tile_m
        grid_n = (b.shape[0] + (tile_n - 1)) // tile_n
        grid_m = (grid_m + (cluster_m - 1)) // cluster_m * cluster_m
        grid_n = (grid_n + (cluster_n - 1)) // cluster_n * cluster_n
        if cutlass.const_expr(self.persistent):
            # One row of clusters along x, each walking cluster tiles (kernel: _tiles_to_walk).
            clusters = (grid_m // cluster_m) * (grid_n // cluster_n)
            per_wave = SMS // (cluster_m * cluster_n)
            grid_m = cutlass.min(clusters, per_wave) * cluster_m
            grid_n = cluster_n
        self.kernel(
            tma_a,
            tma_ma,
            tma_b,
            tma_mb,
            x_scale,
            w_scale,
            bias,
            out,
            tiled_mma,
            a_smem,
            b_smem,
            tma_out,
            tma_mout,
            epi_smem,
        ).launch(
            grid=[grid_m, grid_n, self.split_k],
            block=[self.threads, 1, 1],
            cluster=[cluster_m, cluster_n, self.split_k],
            stream=stream,
            use_pdl=self.pdl,
        )

    @staticmethod
    def _tma_load_op(mcast: int):
        if mcast == 1:
            return cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        return cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()

    # ---------------------------------------------------------------- device
    @cute.jit
    def _cluster_tiles(self, mA, mB):
        """(cluster tiles along M, along N) of the whole problem."""
        tile_m, tile_n = self.tile_shape_mnk[:2]
        cluster_m, cluster_n = self.cluster_mn
        tiles_m = (mA.shape[0] + (tile_m - 1)) // tile_m
        tiles_n = (mB.shape[0] + (tile_n - 1)) // tile_n
        return (tiles_m + (cluster_m - 1)) // cluster_m, (tiles_n + (cluster_n - 1)) // cluster_n

    @cute.jit
    def _tile_of(self, linear, clusters_m, clusters_n):
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
    def _tiles_to_walk(self, mA, mB):
        """(first cluster tile, end, step) of this CTA's cluster: one tile in a plain grid (its
        block index, clusters in launch order), every L-th of them in a persistent one."""
        bidx, bidy, _ = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        cluster_m, cluster_n = self.cluster_mn
        clusters_m, clusters_n = self._cluster_tiles(mA, mB)
        if cutlass.const_expr(self.persistent):
            return bidx // cluster_m, clusters_m * clusters_n, grid_m // cluster_m
        first = bidx // cluster_m + (bidy // cluster_n) * clusters_m
        return first, first + 1, 1

    @cute.jit
    def _epilogue_value(self, value, scale, bias):
        """bf16(acc * scale + bias), the scale for fp8 only, the bias where the key has one."""
        if cutlass.const_expr(self.scaled):
            value = value * scale
        if cutlass.const_expr(self.has_bias):
            value = value + bias
        return value.to(self.out_dtype)

    @cute.jit
    def _bias_at(self, mBias, col, N):
        """bias[col] from global memory (0 past N, or with no bias)."""
        bias = Float32(0.0)
        if cutlass.const_expr(self.has_bias):
            if col < N:
                bias = mBias[col].to(Float32)
        return bias

    @cute.jit
    def _fetch_bias(self, mBias, sBias, tile, tidx):
        """Start copying this tile's bias slice into sBias (16 bytes per thread, cp.async);
        _epilogue waits for it. N % 8 == 0, so a 16-byte piece is wholly inside N or past it
        (whose columns are never stored)."""
        first = (
            tile[0] * self.bias_tile
            if cutlass.const_expr(self.swap_ab)
            else (tile[1] * self.bias_tile)
        )
        pieces = self.bias_tile // OUT_VECTOR
        if tidx < pieces and first + tidx * OUT_VECTOR < mBias.shape[0]:
            atom = cute.make_copy_atom(
                cute.nvgpu.cpasync.CopyG2SOp(), BFloat16, num_bits_per_copy=16 * 8
            )
            cute.copy(
                atom,
                cute.local_tile(mBias, (OUT_VECTOR,), (first // OUT_VECTOR + tidx,)),
                cute.local_tile(sBias, (OUT_VECTOR,), (tidx,)),
            )
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _store_from_registers(self, acc, scale, thr_mma, mBias, mOut, tile):
        """Any N: each accumulator element to out[m, n] with a 2-byte store, when in bounds."""
        M, N = mOut.shape
        tile_mn = self.tile_shape_mnk[:2]
        tCgOut = thr_mma.partition_C(cute.local_tile(mOut, tile_mn, tile))
        tCcOut = thr_mma.partition_C(
            cute.local_tile(cute.make_identity_tensor((M, N)), tile_mn, tile)
        )
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            row, col = tCcOut[i]
            if row < M and col < N:
                tCgOut[i] = self._epilogue_value(acc[i], scale, self._bias_at(mBias, col, N))

    @cute.jit
    def _stage(self, acc, scale, thr_mma, smem, mBias, sBias, mOut, tile):
        """Accumulators -> the staged tile, kept in out's row-major order whatever the operand
        order: bf16(acc * scale + bias) (split_k = 1, bias from sBias) or the fp32 partial
        (split_k > 1)."""
        M, N = mOut.shape
        tile_m, tile_n = self.tile_shape_mnk[:2]
        row_stride = self.out_tile[1] + OUT_PAD
        stride = (1, row_stride) if cutlass.const_expr(self.swap_ab) else (row_stride, 1)
        tCsOut = thr_mma.partition_C(
            cute.make_tensor(
                cute.recast_ptr(smem, dtype=self.staged_dtype),
                cute.make_layout((tile_m, tile_n), stride=stride),
            )
        )
        extent = (N, M) if cutlass.const_expr(self.swap_ab) else (M, N)
        tCcOut = thr_mma.partition_C(
            cute.local_tile(cute.make_identity_tensor(extent), (tile_m, tile_n), tile)
        )
        tCcTile = thr_mma.partition_C(cute.make_identity_tensor((tile_m, tile_n)))  # static
        # Built in registers first so the copy can pair neighbouring columns (4-byte stores).
        staged = cute.make_rmem_tensor(acc.shape, self.staged_dtype)
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            if cutlass.const_expr(self.split_k > 1):
                staged[i] = acc[i]
            else:
                axis = 0 if cutlass.const_expr(self.swap_ab) else 1
                if cutlass.const_expr(self.prefetch_bias):
                    bias = sBias[tCcTile[i][axis]].to(Float32)  # the tile's slice
                else:
                    bias = self._bias_at(mBias, tCcOut[i][axis], N)
                staged[i] = self._epilogue_value(acc[i], scale, bias)
        cute.autovec_copy(staged, tCsOut)

    @cute.jit
    def _peer_segment(self, smem_f32, offset, peer):
        """8 fp32 of a peer CTA's staged partial (two 16-byte ld.shared::cluster)."""
        values = []
        for half in cutlass.range_constexpr(2):
            remote = cute.arch.map_dsmem_ptr(smem_f32 + (offset + 4 * half), peer)
            values.extend(
                cute.arch.inline_ptx(
                    "ld.shared::cluster.v4.f32 { {$w0}, {$w1}, {$w2}, {$w3} }, [{$r0}];",
                    write_only_types=[Float32] * 4,
                    read_only_args=[remote],
                )
            )
        return values

    @cute.jit
    def _store_staged(self, scale, smem, mBias, mOut, tile, tidx, rank):
        """Each consumer thread stores 16-byte row segments of the staged tile: whole, coalesced
        rows of out. Under split-K, CTA `rank` stores its 1/S of the rows, each the sum of the
        S partials in rank order, then scaled, biased and rounded."""
        M, N = mOut.shape
        rows, cols = self.out_tile
        row_stride = cols + OUT_PAD
        my_rows = rows // self.split_k
        per_row = cols // OUT_VECTOR
        segments = my_rows * per_row  # consecutive threads take consecutive segments of a row
        tile_row, tile_col = (tile[1], tile[0]) if cutlass.const_expr(self.swap_ab) else tile
        sOut = cute.make_tensor(
            cute.recast_ptr(smem, dtype=self.staged_dtype),
            cute.make_layout((rows, cols), stride=(row_stride, 1)),
        )
        smem_f32 = cute.recast_ptr(smem, dtype=Float32)
        threads = self.tile_threads
        for step in cutlass.range_constexpr((segments + threads - 1) // threads):
            index = tidx + step * threads
            segment = index % per_row
            row = rank * my_rows + index // per_row
            out_row = tile_row * rows + row
            column = tile_col * cols + segment * OUT_VECTOR
            if index < segments and out_row < M and column < N:
                staged = cute.make_rmem_tensor((1, OUT_VECTOR), self.out_dtype)
                if cutlass.const_expr(self.split_k == 1):
                    cute.autovec_copy(
                        cute.local_tile(sOut, (1, OUT_VECTOR), (row, segment)), staged
                    )
                else:
                    offset = row * row_stride + segment * OUT_VECTOR
                    total = self._peer_segment(smem_f32, offset, 0)
                    for peer in cutlass.range_constexpr(1, self.split_k):
                        part = self._peer_segment(smem_f32, offset, peer)
                        total = [t + p for t, p in zip(total, part, strict=True)]
                    for j in cutlass.range_constexpr(OUT_VECTOR):
                        bias = Float32(0.0)  # the whole segment is inside N
                        if cutlass.const_expr(self.has_bias):
                            bias = mBias[column + j].to(Float32)
                        staged[0, j] = self._epilogue_value(total[j], scale, bias)
                cute.autovec_copy(
                    staged, cute.local_tile(mOut, (1, OUT_VECTOR), (out_row, column // OUT_VECTOR))
                )

    @cute.jit
    def _produce(
        self,
        tma_a,
        mA,
        tma_b,
        mB,
        sA,
        sB,
        main_pipe,
        cta_layout_mnk,
        cluster_coord,
        masks,
        walk,
        clusters,
        k_range,
    ):
        """The producer warp: for every tile this CTA walks, TMA-load its k-tiles of A and B
        into the pipeline's slots (multicast within the cluster where masks say so)."""
        first, end, step = walk
        k_begin, k_tiles = k_range
        # Per operand: its TMA atom, shared and global tensors, which tile coordinates index
        # it, and the CTAs it is multicast to (the others along the cluster's M or N).
        operands = (
            (tma_a, sA, mA, (1, None, 1), cluster_coord[1], (0, None, 0), masks[0]),
            (tma_b, sB, mB, (None, 1, 1), cluster_coord[0], (None, 0, 0), masks[1]),
        )
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for linear in cutlass.range(first, end, step, unroll=1):
            tile_coord = (*self._tile_of(linear, *clusters), None)
            loads = []
            for tma, smem, gmem, proj, peer, peers, mask in operands:
                tile = cute.local_tile(gmem, self.tile_shape_mnk, tile_coord, proj=proj)
                to_smem, from_gmem = cute.nvgpu.cpasync.tma_partition(
                    tma,
                    peer,
                    cute.make_layout(cute.slice_(cta_layout_mnk, peers).shape),
                    cute.group_modes(smem, 0, 2),
                    cute.group_modes(tile, 0, 2),
                )
                loads.append((tma, from_gmem, to_smem, mask))
            for k_tile in cutlass.range(k_begin, k_begin + k_tiles, unroll=1):
                main_pipe.producer_acquire(state)
                full = main_pipe.producer_get_barrier(state)
                for tma, from_gmem, to_smem, mask in loads:
                    cute.copy(
                        tma,
                        from_gmem[(None, k_tile)],
                        to_smem[(None, state.index)],
                        tma_bar_ptr=full,
                        mcast_mask=mask,
                    )
                main_pipe.producer_commit(state)
                state.advance()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        # Wait until the consumers released every slot: no TMA write is still in flight into
        # this CTA (or a peer) when the CTA exits.
        main_pipe.producer_tail(state)

    @cute.jit
    def _consume(
        self,
        tiled_mma,
        sA,
        sB,
        storage,
        main_pipe,
        mXScale,
        mWScale,
        mBias,
        mOut,
        tidx,
        split,
        walk,
        clusters,
        k_tiles,
        owner,
        tma_epilogue,
    ):
        """The consumer warpgroups: for every tile this CTA walks, the wgmma main loop over the
        pipeline's slots into fp32 accumulators, then the epilogue. Ping-pong: warpgroup
        `owner` takes every other tile (the producer loads them all in walk order), its
        main loop in turn with the other's, so one's epilogue runs under the other's wgmma."""
        first, end, step = walk
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C(self.tile_shape_mnk[:2]), self.acc_dtype
        )
        part = None
        if cutlass.const_expr(self.promote):
            part = cute.make_rmem_tensor(acc.shape, self.acc_dtype)
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        scale = Float32(1.0)
        if cutlass.const_expr(self.scaled):
            scale = mXScale[0] * mWScale[0]
        # The staged tile: its own buffer when persistent, else the (idle) operand slots.
        # (The offsets are whole 16-byte vectors: assume says so, for the vectorised copies.)
        staging = storage.sA.data_ptr()
        if cutlass.const_expr(self.persistent):
            offset = cute.assume(owner * self.staging_bytes, divby=1024)
            staging = storage.sC.data_ptr() + offset
        bias_offset = cute.assume(owner * self.bias_tile, divby=OUT_VECTOR)
        sBias = cute.make_tensor(
            storage.sBias.data_ptr() + bias_offset, cute.make_layout((self.bias_tile,))
        )
        tile_step = step * self.tile_owners
        if cutlass.const_expr(self.pingpong):
            # Skip the k-tiles of the other warpgroup's tile before this one's first.
            read.advance(owner * k_tiles)
            release.advance(owner * k_tiles)
        for linear in cutlass.range(first + owner * step, end, tile_step, unroll=1):
            tile = self._tile_of(linear, *clusters)
            if cutlass.const_expr(self.prefetch_bias):
                # sBias is free: the previous tile's _stage finished before its second barrier.
                self._fetch_bias(mBias, sBias, tile, tidx)
            if cutlass.const_expr(self.pingpong):
                # Wait for the other warpgroup's main loop of the tile before this one: only
                # then can this one's slots' phases not be mistaken for its.
                if linear != first:
                    cute.arch.barrier(
                        barrier_id=MAIN_LOOP_TURN + owner, number_of_threads=2 * WARPGROUP
                    )
            acc.fill(0.0)
            if cutlass.const_expr(self.promote):
                # Each k-tile into a zeroed second set, then added in full fp32.
                for _ in cutlass.range(k_tiles, unroll=1):
                    main_pipe.consumer_wait(read)
                    part.fill(0.0)
                    self._mma_k_tile(tiled_mma, part, tCrA, tCrB, read.index)
                    cute.nvgpu.warpgroup.wait_group(0)
                    main_pipe.consumer_release(read)
                    read.advance()
                    for i in cutlass.range(cute.size(acc), unroll_full=True):
                        acc[i] = acc[i] + part[i]
                self._pass_turn(owner, linear, step, end)
            else:
                for k_tile in cutlass.range(k_tiles, unroll=1):
                    main_pipe.consumer_wait(read)
                    self._mma_k_tile(tiled_mma, acc, tCrA, tCrB, read.index)
                    # Keep one wgmma batch in flight; the batch before it has now finished
                    # reading its slot, which may be refilled.
                    cute.nvgpu.warpgroup.wait_group(1)
                    if k_tile > 0:
                        main_pipe.consumer_release(release)
                        release.advance()
                    read.advance()
                self._pass_turn(owner, linear, step, end)
                cute.nvgpu.warpgroup.wait_group(0)
                if k_tiles > 0:
                    main_pipe.consumer_release(release)
                    release.advance()
            if cutlass.const_expr(self.pingpong):
                read.advance(k_tiles)  # the other warpgroup's next tile
                release.advance(k_tiles)
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_launch_dependents()
            if cutlass.const_expr(self.tma_store):
                self._epilogue_tma(
                    acc,
                    scale,
                    tiled_mma,
                    sBias,
                    tma_epilogue,
                    tile,
                    tidx,
                    owner,
                    (linear - first) // tile_step,
                )
            else:
                self._epilogue(
                    acc, scale, thr_mma, staging, mBias, sBias, mOut, tile, tidx, split, owner
                )
        if cutlass.const_expr(self.tma_store):
            # The last strips' TMA stores must have read shared memory before the CTA exits.
            if cute.arch.make_warp_uniform(tidx // 32) == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _pass_turn(self, owner, linear, step, end):
        """Ping-pong: every wgmma of this tile is issued; the other warpgroup, if it has a
        next tile (linear + step), may start its main loop."""
        if cutlass.const_expr(self.pingpong):
            if linear + step < end:
                cute.arch.barrier_arrive(
                    barrier_id=MAIN_LOOP_TURN + 1 - owner, number_of_threads=2 * WARPGROUP
                )

    @cute.jit
    def _mma_k_tile(self, tiled_mma, into, tCrA, tCrB, slot_index):
        """One k-tile's wgmmas from pipeline slot `slot_index` into `into`, as one committed
        batch (the caller decides how long to let it run)."""
        cute.nvgpu.warpgroup.fence()
        for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            slot = (None, None, k_block, slot_index)
            cute.gemm(tiled_mma, into, tCrA[slot], tCrB[slot], into)
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def _epilogue(self, acc, scale, thr_mma, staging, mBias, sBias, mOut, tile, tidx, split, owner):
        """(scale) + bias -> bf16 -> out, through shared memory when N % 8 == 0."""
        barrier = EPILOGUE_BARRIER + owner  # the tile's own consumers
        if cutlass.const_expr(self.aligned_n):
            if cutlass.const_expr(self.prefetch_bias):
                cute.arch.cp_async_wait_group(0)  # this thread's bias piece has landed
            # Every consumer warpgroup's wgmma has retired (the operand slots are free) and,
            # persistent, has stored the previous tile from the staging buffer; every bias
            # piece is visible to all consumer threads.
            cute.arch.barrier(barrier_id=barrier, number_of_threads=self.tile_threads)
            self._stage(acc, scale, thr_mma, staging, mBias, sBias, mOut, tile)
            if cutlass.const_expr(self.split_k > 1):
                cute.arch.cluster_arrive()  # release: this CTA's partial is visible
                cute.arch.cluster_wait()  # acquire: every peer's partial is
            else:
                cute.arch.barrier(barrier_id=barrier, number_of_threads=self.tile_threads)
            self._store_staged(scale, staging, mBias, mOut, tile, tidx, split)
        else:
            self._store_from_registers(acc, scale, thr_mma, mBias, mOut, tile)

    @cute.jit
    def _epilogue_tma(
        self, acc, scale, tiled_mma, sBias, tma_epilogue, tile, tidx, owner, tiles_done
    ):
        """bf16(acc * scale + bias) -> out by TMA stores, one epi_tile strip at a time:
        stmatrix into one of this owner's EPI_BUFFERS buffers, fence (the TMA unit reads it
        through the async proxy), barrier, then one warp issues the store. A buffer is
        rewritten only after the store issued EPI_BUFFERS strips earlier has read it (bulk
        wait_group.read before the second barrier), so the stores run under the next strips
        and the next tile's main loop. TMA clips rows past M and columns past N."""
        tma_out, mOutTma, sEpi = tma_epilogue
        barrier = EPILOGUE_BARRIER + owner  # the tile's own consumers
        tile_m, tile_n = self.tile_shape_mnk[:2]
        if cutlass.const_expr(self.prefetch_bias):
            cute.arch.cp_async_wait_group(0)  # this thread's bias piece has landed
        # Every bias piece is visible to every consumer thread of the tile.
        cute.arch.barrier(barrier_id=barrier, number_of_threads=self.tile_threads)
        thr_mma = tiled_mma.get_slice(tidx)
        tCcTile = thr_mma.partition_C(cute.make_identity_tensor((tile_m, tile_n)))  # static
        values = cute.make_rmem_tensor(acc.shape, self.out_dtype)
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            bias = Float32(0.0)
            if cutlass.const_expr(self.has_bias):
                bias = sBias[tCcTile[i][1]].to(Float32)
            values[i] = self._epilogue_value(acc[i], scale, bias)
        atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.out_dtype)
        r2s = cute.make_tiled_copy_S(atom, cute.make_tiled_copy_C_atom(atom, tiled_mma))
        thr_r2s = r2s.get_slice(tidx)
        tRS_sEpi = thr_r2s.partition_D(sEpi)  # (R2S, R2S_M, R2S_N, buffer)
        # The retiled fragment is ((R2S, column groups), MMA_M, 1), column groups inner: with a
        # strip as high as the tiled MMA, strip (m, s) is the per_strip values from
        # (m * strips_n + s) * per_strip on (a strip as high as the tile would not be
        # consecutive where MMA_M > 1, as in ping-pong).
        tRS_rValues = r2s.retile(values)
        strip = cute.make_rmem_tensor(cute.shape(thr_r2s.partition_S(sEpi))[:3], self.out_dtype)
        per_strip = cute.size(strip)
        sStrips, gStrips = cute.nvgpu.cpasync.tma_partition(
            tma_out,
            0,
            cute.make_layout(1),
            cute.group_modes(sEpi, 0, 2),
            cute.zipped_divide(cute.local_tile(mOutTma, (tile_m, tile_n), tile), self.epi_tile),
        )
        strips_n = tile_n // self.epi_tile[1]
        strips = tile_m // self.epi_tile[0] * strips_n
        for s in cutlass.range_constexpr(strips):
            for v in cutlass.range_constexpr(per_strip):
                strip[v] = tRS_rValues[s * per_strip + v]
            buffer = owner * EPI_BUFFERS + (tiles_done * strips + s) % EPI_BUFFERS
            cute.copy(r2s, strip, tRS_sEpi[(None, None, None, buffer)])
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=barrier, number_of_threads=self.tile_threads)
            if cute.arch.make_warp_uniform(tidx // 32) == 0:
                cute.copy(
                    tma_out, sStrips[(None, buffer)], gStrips[(None, (s // strips_n, s % strips_n))]
                )
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(EPI_BUFFERS - 1, read=True)
            cute.arch.barrier(barrier_id=barrier, number_of_threads=self.tile_threads)

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
        first, end, step = self._tiles_to_walk(mA, mB)
        clusters_m, clusters_n = self._cluster_tiles(mA, mB)
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
        a_stage_layout = cute.slice_(a_smem, (None, None, 0))
        b_stage_layout = cute.slice_(b_smem, (None, None, 0))
        tx_bytes = cute.size_in_bytes(self.ab_dtype, a_stage_layout) + cute.size_in_bytes(
            self.ab_dtype, b_stage_layout
        )
        main_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.pipeline_barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.tile_threads),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            enable_multicast_signaling=True,
            defer_sync=True,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        sEpi = None
        if cutlass.const_expr(self.tma_store):
            sEpi = storage.sC.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)
        tile_k = self.tile_shape_mnk[2]
        k_total = (mA.shape[1] + (tile_k - 1)) // tile_k
        k_begin = split * k_total // self.split_k
        k_tiles = (split + 1) * k_total // self.split_k - k_begin

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_mn)
        if cutlass.const_expr(self.pdl):
            # Everything above touched only shared memory and descriptors; from here on x, w,
            # bias and scales are read and out is written.
            cute.arch.griddepcontrol_wait()

        if warp >= self.producer_warp:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == self.producer_warp:
                self._produce(
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
            self._consume(
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
