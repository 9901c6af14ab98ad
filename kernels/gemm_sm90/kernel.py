"""Hopper GEMM (CuTe DSL, sm_90a): wgmma fed by TMA through a multi-stage mbarrier pipeline.

    out[M, N] (bf16) = x[M, K] @ w[N, K]^T (+ bias[N]), fp32 accumulation.
    bf16 x, w:   out = bf16(acc + bias)
    fp8 e4m3 x, w (scaled=True): out = bf16(acc * x_scale[0] * w_scale[0] + bias)

M, N and K are runtime (symbolic) sizes: one binary serves every shape whose K keeps each row
16-byte aligned (K % 8 for bf16, K % 16 for fp8) and whose bases are 16-byte aligned.

Design (what a reviewer can check against the code below)
------
* CTA tile tile_m x tile_n x tile_k; tile_m in {64, 128}, tile_n in {64, 128, 256}; tile_k = 64
  for bf16 and 128 for fp8 (4 wgmma k-steps of 16 / 32, i.e. 128-byte rows, 128-byte swizzle
  chosen by sm90_utils.make_smem_layout_a/b).  grid = (ceil(M/tile_m) rounded up to cluster_m,
  ceil(N/tile_n) rounded up to cluster_n); CTAs are mapped to output tiles in groups of
  raster_m M tiles (see _tile_of_this_cta) so that each wave reuses its operands from L2.
* Warp roles, (tile_m / 64 + 1) warpgroups of 128 threads:
    - warpgroups 0 .. C-1 (C = tile_m / 64) are consumers: warpgroup g issues the wgmma of rows
      [64 g, 64 g + 64) of the tile (tiled MMA with atom layout (C, 1, 1), 64 x tile_n per
      atom), fp32 accumulators in registers (tile_n / 2 per thread).  setmaxnreg raises them to
      240 (C = 1) or 232 (C = 2) registers.
    - warpgroup C is the producer: setmaxnreg lowers it to 40 registers; its warp 0 (one elected
      thread, inside cute.copy) issues the TMA loads; its other 3 warps only join the
      final cluster barrier.
* Main-loop pipeline: PipelineTmaAsync with `stages` slots; per slot one "full" mbarrier (TMA
  transaction bytes = x tile + w tile bytes) and one "empty" mbarrier (one arrive per consumer
  warp per CTA that multicasts into this slot).  Producer: producer_acquire (wait empty, arm
  full with the byte count) -> TMA x tile, TMA w tile on the full barrier -> advance.  Consumer:
  consumer_wait (full) -> warpgroup.fence -> 4 wgmma k-steps -> commit_group; the slot of the
  previous k-tile is released only after wait_group(1) shows its wgmma finished (one wgmma
  batch in flight, so TMA writes never race the tensor cores' reads).
* Clusters (cluster_m x cluster_n, size <= 2 here): the w tile is multicast to the cluster_m
  CTAs that share an N tile, the x tile to the cluster_n CTAs that share an M tile; each CTA
  loads its 1/cluster slice of the multicast tile.  Consumer releases go to every CTA of the
  multicast group (PipelineTmaAsync multicast signalling).  A final cluster barrier keeps each
  CTA's shared memory alive until its peers have stopped writing into it.
* Out of bounds: the TMA descriptors cover the true [M, K] and [N, K] extents, so rows >= M,
  rows >= N and columns >= K of a box are zero-filled by the hardware (a zero K tail adds 0 to
  the accumulators).  The epilogue predicates every store on (m < M, n < N).
* Epilogue (consumer threads only): per accumulator element scale (fp8), add bias[n] when
  has_bias (read only for n < N), convert to bf16.  With N % 8 == 0 (aligned_n, what every
  model layer has) the tile is staged in shared memory (the operand slots, free by then; rows
  padded by 8 elements so a warp's writes hit 32 distinct banks) and written back as 16-byte
  row segments, whole rows per warp, predicated on m < M and n < N.  Any other N stores each
  element from registers (2-byte stores under the same predicates).
* fp8 accumulates in the wgmma accumulators with no periodic promotion to a second fp32 set (as
  torch._scaled_mm with use_fast_accum=True). Hopper's fp8 tensor-core accumulation keeps about
  14 bits, so the error grows with K: at M=16384, N=8192, K=28672 every tactic missed aot-tune's
  check (2% of the largest output) on random normal inputs; tile 128 x 256 has no registers
  left for a second accumulator set.
* PDL (pdl=True): every thread executes griddepcontrol.wait after the pipeline's barriers are
  initialised and before the first global read of x / w / bias / scales and before any write of
  out; consumers execute griddepcontrol.launch_dependents after their last wgmma retired (before
  the epilogue), the producer after its last TMA was issued.  The launch sets use_pdl.

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

__all__ = ["HopperGemm", "SMEM_CAPACITY", "stage_bytes"]

SMEM_CAPACITY = 232448  # bytes of dynamic shared memory an sm_90 CTA may use (227 KiB)
BARRIER_RESERVE = 1024  # mbarriers + alignment slack
WARPGROUP = 128
OUT_VECTOR = 8  # bf16 per 16-byte store of the staged epilogue
OUT_PAD = 8  # bf16 per staged row: rows 4 banks apart, so a warp's writes never conflict
EPILOGUE_BARRIER = 1  # named barrier of the consumer warpgroups (0 is __syncthreads)
PRODUCER_REGS = 40
CONSUMER_REGS = {1: 240, 2: 232}  # keeps (C * consumer + producer) * 128 <= 64 Ki registers


def stage_bytes(tile_m: int, tile_n: int, tile_k: int, elem_bytes: int) -> int:
    """Shared memory of one pipeline stage: one x tile and one w tile."""
    return (tile_m + tile_n) * tile_k * elem_bytes


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
    ):
        tile_m, tile_n = tile_mn
        if tile_m not in (64, 128):
            raise ValueError(f"HopperGemm: tile_m must be 64 or 128, got {tile_m}")
        if tile_n not in (64, 128, 256):
            raise ValueError(f"HopperGemm: tile_n must be 64, 128 or 256, got {tile_n}")
        if cluster_mn not in ((1, 1), (2, 1), (1, 2)):
            raise ValueError(f"HopperGemm: cluster must be 1x1, 2x1 or 1x2, got {cluster_mn}")
        if ab_dtype not in (BFloat16, cutlass.Float8E4M3FN):
            raise ValueError(f"HopperGemm: operands must be bf16 or fp8 e4m3, got {ab_dtype}")
        self.ab_dtype = ab_dtype
        self.scaled = ab_dtype.width == 8
        self.acc_dtype = Float32
        self.out_dtype = BFloat16
        # 4 wgmma k-steps per tile: 128-byte rows (k 16 for bf16, 32 for fp8 per wgmma).
        self.tile_k = 64 if ab_dtype.width == 16 else 128
        self.tile_shape_mnk = (tile_m, tile_n, self.tile_k)
        self.cluster_mn = tuple(cluster_mn)
        self.stages = int(stages)
        need = self.stages * stage_bytes(tile_m, tile_n, self.tile_k, ab_dtype.width // 8)
        if self.stages < 2 or need + BARRIER_RESERVE > SMEM_CAPACITY:
            raise ValueError(
                f"HopperGemm: {self.stages} stages of {tile_m}x{tile_n}x{self.tile_k} need "
                f"{need} B of shared memory (have {SMEM_CAPACITY - BARRIER_RESERVE}, min 2 stages)"
            )
        self.has_bias = bool(has_bias)
        self.pdl = bool(pdl)
        if raster_m < 1 or raster_m % cluster_mn[0]:
            raise ValueError(
                f"HopperGemm: raster_m must be a multiple of cluster_m, got {raster_m}"
            )
        self.raster_clusters = raster_m // cluster_mn[0]
        # N % 8 == 0 (out rows 16-byte aligned): stage the tile in the operand slots and store
        # 16-byte segments; they must hold the padded tile.
        self.aligned_n = bool(aligned_n)
        staged = tile_m * (tile_n + OUT_PAD) * 2
        if self.aligned_n and staged > need:
            raise ValueError(f"HopperGemm: {self.stages} stages cannot stage a {tile_mn} out tile")
        self.mma_warpgroups = tile_m // 64
        self.threads = (self.mma_warpgroups + 1) * WARPGROUP
        self.mma_threads = self.mma_warpgroups * WARPGROUP
        self.producer_warp = self.mma_warpgroups * 4  # first warp of the producer warpgroup
        self.x_mcast = self.cluster_mn[1]  # CTAs sharing one x tile (same M, other N)
        self.w_mcast = self.cluster_mn[0]  # CTAs sharing one w tile (same N, other M)

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
        tile_m, tile_n, tile_k = self.tile_shape_mnk
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype,
            self.ab_dtype,
            LayoutEnum.from_tensor(x).sm90_mma_major_mode(),
            LayoutEnum.from_tensor(w).sm90_mma_major_mode(),
            self.acc_dtype,
            (self.mma_warpgroups, 1, 1),
            tiler_mn=(64, tile_n),
        )
        x_smem = sm90_utils.make_smem_layout_a(
            LayoutEnum.from_tensor(x),
            self.tile_shape_mnk,
            self.ab_dtype,
            self.stages,
        )
        w_smem = sm90_utils.make_smem_layout_b(
            LayoutEnum.from_tensor(w),
            self.tile_shape_mnk,
            self.ab_dtype,
            self.stages,
        )
        tma_x, tma_mx = cute.nvgpu.cpasync.make_tiled_tma_atom(
            self._tma_load_op(self.x_mcast),
            x,
            cute.slice_(x_smem, (None, None, 0)),
            (tile_m, tile_k),
            num_multicast=self.x_mcast,
        )
        tma_w, tma_mw = cute.nvgpu.cpasync.make_tiled_tma_atom(
            self._tma_load_op(self.w_mcast),
            w,
            cute.slice_(w_smem, (None, None, 0)),
            (tile_n, tile_k),
            num_multicast=self.w_mcast,
        )

        @cute.struct
        class SharedStorage:
            pipeline_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sX: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(x_smem)], 1024]
            sW: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(w_smem)], 1024]

        self.shared_storage = SharedStorage
        cluster_m, cluster_n = self.cluster_mn
        m = x.shape[0]
        n = w.shape[0]
        grid_m = (m + (tile_m - 1)) // tile_m
        grid_n = (n + (tile_n - 1)) // tile_n
        grid_m = (grid_m + (cluster_m - 1)) // cluster_m * cluster_m
        grid_n = (grid_n + (cluster_n - 1)) // cluster_n * cluster_n
        self.kernel(
            tma_x, tma_mx, tma_w, tma_mw, x_scale, w_scale, bias, out, tiled_mma, x_smem, w_smem
        ).launch(
            grid=[grid_m, grid_n, 1],
            block=[self.threads, 1, 1],
            cluster=[cluster_m, cluster_n, 1],
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
    def _tile_of_this_cta(self):
        """The output tile (m, n) of this CTA, clusters visited in groups of raster_m M tiles.

        CTAs launch in block order, x fastest. Taken as tiles directly, a wave would cover a
        few N columns of every M tile and so stream all of x through L2 once per couple of N
        tiles. Grouping (as Triton's GROUP_M) makes each wave a compact block of tiles: about
        raster_m M tiles by (wave / raster_m) N tiles. Remapping whole clusters keeps each
        cluster's CTAs on neighbouring tiles that share their multicast operand.
        """
        bidx, bidy, _ = cute.arch.block_idx()
        grid_m, grid_n, _ = cute.arch.grid_dim()
        cluster_m, cluster_n = self.cluster_mn
        clusters_m = grid_m // cluster_m
        linear = bidx // cluster_m + (bidy // cluster_n) * clusters_m
        per_group = self.raster_clusters * (grid_n // cluster_n)
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
    def _epilogue_value(self, value, scale, mBias, col, N):
        if cutlass.const_expr(self.scaled):
            value = value * scale
        if cutlass.const_expr(self.has_bias):
            bias = Float32(0.0)
            if col < N:
                bias = mBias[col].to(Float32)
            value = value + bias
        return value.to(self.out_dtype)

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
                tCgOut[i] = self._epilogue_value(acc[i], scale, mBias, col, N)

    @cute.jit
    def _store_through_smem(self, acc, scale, thr_mma, smem, mBias, mOut, tile, tidx):
        """N % 8 == 0: the tile goes to shared memory (padded rows: no bank conflicts), then
        each consumer thread stores 16-byte row segments: whole, coalesced rows of out.

        The operand slots are reused for it: every TMA write into them has landed (each k-tile's
        full barrier was waited on) and, after the barrier below, no wgmma reads them.
        """
        M, N = mOut.shape
        tile_m, tile_n = self.tile_shape_mnk[:2]
        sOut = cute.make_tensor(
            cute.recast_ptr(smem, dtype=self.out_dtype),
            cute.make_layout((tile_m, tile_n), stride=(tile_n + OUT_PAD, 1)),
        )
        tCsOut = thr_mma.partition_C(sOut)
        tCcOut = thr_mma.partition_C(
            cute.local_tile(cute.make_identity_tensor((M, N)), (tile_m, tile_n), tile)
        )
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER, number_of_threads=self.mma_threads)
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            tCsOut[i] = self._epilogue_value(acc[i], scale, mBias, tCcOut[i][1], N)
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER, number_of_threads=self.mma_threads)
        per_row = tile_n // OUT_VECTOR
        rows_per_pass = self.mma_threads // per_row
        first_row = tidx // per_row
        segment = tidx % per_row
        column = tile[1] * tile_n + segment * OUT_VECTOR
        for step in cutlass.range_constexpr(tile_m // rows_per_pass):
            row = first_row + step * rows_per_pass
            out_row = tile[0] * tile_m + row
            if out_row < M and column < N:
                staged = cute.make_rmem_tensor((1, OUT_VECTOR), self.out_dtype)
                cute.autovec_copy(cute.local_tile(sOut, (1, OUT_VECTOR), (row, segment)), staged)
                cute.autovec_copy(
                    staged, cute.local_tile(mOut, (1, OUT_VECTOR), (out_row, column // OUT_VECTOR))
                )

    @cute.kernel
    def kernel(
        self,
        tma_x: cute.CopyAtom,
        mX: cute.Tensor,
        tma_w: cute.CopyAtom,
        mW: cute.Tensor,
        mXScale: cute.Tensor | None,
        mWScale: cute.Tensor | None,
        mBias: cute.Tensor,
        mOut: cute.Tensor,
        tiled_mma: cute.TiledMma,
        x_smem: cute.ComposedLayout,
        w_smem: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        tile_m_idx, tile_n_idx = self._tile_of_this_cta()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == self.producer_warp:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_w)

        # ---- cluster coordinates and multicast masks ----
        cta_layout_mnk = cute.make_layout((*self.cluster_mn, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout_mnk.get_flat_coord(rank)
        x_mask = None
        w_mask = None
        if cutlass.const_expr(self.x_mcast > 1):
            x_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1)
        if cutlass.const_expr(self.w_mcast > 1):
            w_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0)

        # ---- shared memory and the main-loop pipeline ----
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        x_stage_layout = cute.slice_(x_smem, (None, None, 0))
        w_stage_layout = cute.slice_(w_smem, (None, None, 0))
        tx_bytes = cute.size_in_bytes(self.ab_dtype, x_stage_layout) + cute.size_in_bytes(
            self.ab_dtype, w_stage_layout
        )
        main_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.pipeline_barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.mma_threads),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            enable_multicast_signaling=True,
            defer_sync=True,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        sX = storage.sX.get_tensor(x_smem.outer, swizzle=x_smem.inner)
        sW = storage.sW.get_tensor(w_smem.outer, swizzle=w_smem.inner)
        tile_coord = (tile_m_idx, tile_n_idx, None)
        gX = cute.local_tile(mX, self.tile_shape_mnk, tile_coord, proj=(1, None, 1))
        gW = cute.local_tile(mW, self.tile_shape_mnk, tile_coord, proj=(None, 1, 1))
        k_tiles = cute.size(gX, mode=[2])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_mn)
        if cutlass.const_expr(self.pdl):
            # Everything above touched only shared memory and descriptors; from here on x, w,
            # bias and scales are read and out is written.
            cute.arch.griddepcontrol_wait()

        if warp >= self.producer_warp:
            # ================= producer warpgroup =================
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == self.producer_warp:
                tXsX, tXgX = cute.nvgpu.cpasync.tma_partition(
                    tma_x,
                    cluster_coord[1],
                    cute.make_layout(cute.slice_(cta_layout_mnk, (0, None, 0)).shape),
                    cute.group_modes(sX, 0, 2),
                    cute.group_modes(gX, 0, 2),
                )
                tWsW, tWgW = cute.nvgpu.cpasync.tma_partition(
                    tma_w,
                    cluster_coord[0],
                    cute.make_layout(cute.slice_(cta_layout_mnk, (None, 0, 0)).shape),
                    cute.group_modes(sW, 0, 2),
                    cute.group_modes(gW, 0, 2),
                )
                state = pipeline.make_pipeline_state(
                    pipeline.PipelineUserType.Producer, self.stages
                )
                for k_tile in cutlass.range(k_tiles, unroll=1):
                    main_pipe.producer_acquire(state)
                    full = main_pipe.producer_get_barrier(state)
                    cute.copy(
                        tma_x,
                        tXgX[(None, k_tile)],
                        tXsX[(None, state.index)],
                        tma_bar_ptr=full,
                        mcast_mask=x_mask,
                    )
                    cute.copy(
                        tma_w,
                        tWgW[(None, k_tile)],
                        tWsW[(None, state.index)],
                        tma_bar_ptr=full,
                        mcast_mask=w_mask,
                    )
                    main_pipe.producer_commit(state)
                    state.advance()
                if cutlass.const_expr(self.pdl):
                    cute.arch.griddepcontrol_launch_dependents()
                # Wait until the consumers released every slot: no TMA write is still in
                # flight into this CTA (or a peer) when the CTA exits.
                main_pipe.producer_tail(state)
        else:
            # ================= consumer warpgroups =================
            cute.arch.setmaxregister_increase(CONSUMER_REGS[self.mma_warpgroups])
            thr_mma = tiled_mma.get_slice(tidx)
            tCrX = tiled_mma.make_fragment_A(thr_mma.partition_A(sX))
            tCrW = tiled_mma.make_fragment_B(thr_mma.partition_B(sW))
            acc = cute.make_rmem_tensor(
                thr_mma.partition_shape_C(self.tile_shape_mnk[:2]), self.acc_dtype
            )
            acc.fill(0.0)
            k_blocks = cute.size(tCrX, mode=[2])
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            for k_tile in cutlass.range(k_tiles, unroll=1):
                main_pipe.consumer_wait(read)
                cute.nvgpu.warpgroup.fence()
                for k_block in cutlass.range_constexpr(k_blocks):
                    slot = (None, None, k_block, read.index)
                    cute.gemm(tiled_mma, acc, tCrX[slot], tCrW[slot], acc)
                cute.nvgpu.warpgroup.commit_group()
                # Keep one wgmma batch in flight; the batch before it has now finished
                # reading its slot, which may be refilled.
                cute.nvgpu.warpgroup.wait_group(1)
                if k_tile > 0:
                    main_pipe.consumer_release(release)
                    release.advance()
                read.advance()
            cute.nvgpu.warpgroup.wait_group(0)
            if k_tiles > 0:
                main_pipe.consumer_release(release)
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_launch_dependents()

            # ---- epilogue: (scale) + bias -> bf16 -> out ----
            scale = Float32(1.0)
            if cutlass.const_expr(self.scaled):
                scale = mXScale[0] * mWScale[0]
            tile = (tile_m_idx, tile_n_idx)
            if cutlass.const_expr(self.aligned_n):
                self._store_through_smem(acc, scale, thr_mma, storage.sX.data_ptr(), mBias, mOut,
                                         tile, tidx)  # fmt: skip
            else:
                self._store_from_registers(acc, scale, thr_mma, mBias, mOut, tile)

        # Peers multicast into this CTA's shared memory: stay resident until they are done.
        if cutlass.const_expr(self.cluster_mn[0] * self.cluster_mn[1] > 1):
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
