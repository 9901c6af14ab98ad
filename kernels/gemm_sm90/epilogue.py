"""Hopper GEMM epilogues: accumulators -> bf16(acc * scale + bias) -> out, one strategy per kind.

The key picks one (kernel.py, HopperGemm.__init__); the consumer warpgroups (mainloop.py) call
`prepare` once, `fetch_bias` when a tile's main loop starts and `store_tile` after it:

* RegisterEpilogue (N % 8 != 0, split_k = 1, no swap): each accumulator element to out with a
  2-byte store from registers, predicated on (m < M, n < N).
* StagedEpilogue (N % 8 == 0, not TMA-stored): the tile is staged in shared memory in out's own
  row-major order (rows padded by OUT_PAD elements against bank conflicts; the idle operand
  slots, or persistent, the sC buffer) and written back as 16-byte row segments, whole rows per
  warp. split_k = 1 stages bf16(acc * scale + bias), the bias from the tile's sBias slice;
  split_k > 1 stages the fp32 partial, and after a cluster barrier CTA s reduces its 1/S of the
  rows over all S partials through distributed shared memory, always in rank order, so the
  result does not depend on timing.
* TmaStoreEpilogue (persistent, no swap, N % 8 == 0, tile_n % 16 == 0): bf16 values formed in
  registers leave in strips (epi_tile) through EPI_BUFFERS swizzled buffers per tile owner:
  stmatrix -> fence.proxy.async -> barrier -> one warp's TMA store, wait_group.read
  EPI_BUFFERS - 1 -> barrier. TMA clips rows past M and columns past N.

Ping-pong: each of the two tile owners has its own staging buffer, bias slice and named barrier
EPILOGUE_BARRIER + owner. Shared-memory sizes are resources.py's (staging_bytes, strip_cols).
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32
from cutlass.tensor_utils import LayoutEnum

from cute_aot.kernels.gemm_sm90.resources import EPI_BUFFERS, OUT_PAD, OUT_VECTOR

__all__ = ["EPILOGUE_BARRIER", "RegisterEpilogue", "StagedEpilogue", "TmaStoreEpilogue"]

EPILOGUE_BARRIER = 1  # named barrier of a tile's consumer warpgroups (0 is __syncthreads)


class Epilogue:
    """What every strategy shares: the scale, the bias, the staging buffer and the bias slice."""

    def __init__(
        self,
        tile_shape_mnk: tuple[int, int, int],
        out_tile: tuple[int, int],
        swap_ab: bool,
        split_k: int,
        scaled: bool,
        has_bias: bool,
        prefetch_bias: bool,
        persistent: bool,
        staging_bytes: int,
        epilogue_bytes: int,
        epi_tile: tuple[int, int],
        tile_threads: int,
        tile_owners: int,
    ):
        self.tile_shape_mnk = tile_shape_mnk
        self.out_tile = out_tile  # in out's own coordinates (out^T's tile under swap-AB)
        self.swap_ab = swap_ab
        self.split_k = split_k
        self.scaled = scaled
        self.has_bias = has_bias
        self.prefetch_bias = prefetch_bias
        self.persistent = persistent
        self.staging_bytes = staging_bytes  # one tile owner's sC buffer
        self.epilogue_bytes = epilogue_bytes  # every owner's
        self.epi_tile = epi_tile
        self.tile_threads = tile_threads
        self.tile_owners = tile_owners
        self.out_dtype = BFloat16
        self.staged_dtype = Float32 if split_k > 1 else self.out_dtype
        self.bias_tile = tile_shape_mnk[0] if swap_ab else tile_shape_mnk[1]  # out's columns

    # ------------------------------------------------------------------ host
    def host_setup(self, out):
        """(epi_smem, tma_out, tma_mout, sC element type, sC elements): a raw byte buffer
        (at least 16 bytes: the struct wants a member) unless the strategy stores by TMA."""
        return None, None, None, cutlass.Uint8, max(self.epilogue_bytes, 16)

    # ---------------------------------------------------------------- device
    @cute.jit
    def prepare(self, storage, owner, mXScale, mWScale):
        """(scale, staging buffer, bias slice) of tile owner `owner`: the staged tile's own
        buffer when persistent, else the (idle) operand slots. (The offsets are whole 16-byte
        vectors: assume says so, for the vectorised copies.)"""
        scale = Float32(1.0)
        if cutlass.const_expr(self.scaled):
            scale = mXScale[0] * mWScale[0]
        staging = storage.sA.data_ptr()
        if cutlass.const_expr(self.persistent):
            offset = cute.assume(owner * self.staging_bytes, divby=1024)
            staging = storage.sC.data_ptr() + offset
        bias_offset = cute.assume(owner * self.bias_tile, divby=OUT_VECTOR)
        sBias = cute.make_tensor(
            storage.sBias.data_ptr() + bias_offset, cute.make_layout((self.bias_tile,))
        )
        return scale, staging, sBias

    @cute.jit
    def epilogue_value(self, value, scale, bias):
        """bf16(acc * scale + bias), the scale for fp8 only, the bias where the key has one."""
        if cutlass.const_expr(self.scaled):
            value = value * scale
        if cutlass.const_expr(self.has_bias):
            value = value + bias
        return value.to(self.out_dtype)

    @cute.jit
    def bias_at(self, mBias, col, N):
        """bias[col] from global memory (0 past N, or with no bias)."""
        bias = Float32(0.0)
        if cutlass.const_expr(self.has_bias):
            if col < N:
                bias = mBias[col].to(Float32)
        return bias

    @cute.jit
    def fetch_bias(self, mBias, sBias, tile, tidx):
        """Start copying this tile's bias slice into sBias (16 bytes per thread, cp.async);
        store_tile waits for it. N % 8 == 0, so a 16-byte piece is wholly inside N or past it
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

    def finish(self, tidx):
        """Before the CTA exits: nothing is still in flight from shared memory."""


class RegisterEpilogue(Epilogue):
    """Any N: each accumulator element to out[m, n] with a 2-byte store, when in bounds."""

    @cute.jit
    def store_tile(
        self,
        acc,
        scale,
        tiled_mma,
        thr_mma,
        staging,
        mBias,
        sBias,
        mOut,
        tma_epilogue,
        tile,
        tidx,
        split,
        owner,
        position,
    ):
        """The strategies' one signature; `position` is (linear, first, tile_step) of the walk
        (mainloop.py)."""
        M, N = mOut.shape
        tile_mn = self.tile_shape_mnk[:2]
        tCgOut = thr_mma.partition_C(cute.local_tile(mOut, tile_mn, tile))
        tCcOut = thr_mma.partition_C(
            cute.local_tile(cute.make_identity_tensor((M, N)), tile_mn, tile)
        )
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            row, col = tCcOut[i]
            if row < M and col < N:
                tCgOut[i] = self.epilogue_value(acc[i], scale, self.bias_at(mBias, col, N))


class StagedEpilogue(Epilogue):
    """N % 8 == 0: through a staged tile in shared memory, 16-byte row segments of out; the
    split-K reduction over the cluster's partials."""

    @cute.jit
    def store_tile(
        self,
        acc,
        scale,
        tiled_mma,
        thr_mma,
        staging,
        mBias,
        sBias,
        mOut,
        tma_epilogue,
        tile,
        tidx,
        split,
        owner,
        position,
    ):
        barrier = EPILOGUE_BARRIER + owner  # the tile's own consumers
        if cutlass.const_expr(self.prefetch_bias):
            cute.arch.cp_async_wait_group(0)  # this thread's bias piece has landed
        # Every consumer warpgroup's wgmma has retired (the operand slots are free) and,
        # persistent, has stored the previous tile from the staging buffer; every bias
        # piece is visible to all consumer threads.
        cute.arch.barrier(barrier_id=barrier, number_of_threads=self.tile_threads)
        self.stage(acc, scale, thr_mma, staging, mBias, sBias, mOut, tile)
        if cutlass.const_expr(self.split_k > 1):
            cute.arch.cluster_arrive()  # release: this CTA's partial is visible
            cute.arch.cluster_wait()  # acquire: every peer's partial is
        else:
            cute.arch.barrier(barrier_id=barrier, number_of_threads=self.tile_threads)
        self.store_staged(scale, staging, mBias, mOut, tile, tidx, split)

    @cute.jit
    def stage(self, acc, scale, thr_mma, smem, mBias, sBias, mOut, tile):
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
                    bias = self.bias_at(mBias, tCcOut[i][axis], N)
                staged[i] = self.epilogue_value(acc[i], scale, bias)
        cute.autovec_copy(staged, tCsOut)

    @cute.jit
    def peer_segment(self, smem_f32, offset, peer):
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
    def store_staged(self, scale, smem, mBias, mOut, tile, tidx, rank):
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
                    total = self.peer_segment(smem_f32, offset, 0)
                    for peer in cutlass.range_constexpr(1, self.split_k):
                        part = self.peer_segment(smem_f32, offset, peer)
                        total = [t + p for t, p in zip(total, part, strict=True)]
                    for j in cutlass.range_constexpr(OUT_VECTOR):
                        bias = Float32(0.0)  # the whole segment is inside N
                        if cutlass.const_expr(self.has_bias):
                            bias = mBias[column + j].to(Float32)
                        staged[0, j] = self.epilogue_value(total[j], scale, bias)
                cute.autovec_copy(
                    staged, cute.local_tile(mOut, (1, OUT_VECTOR), (out_row, column // OUT_VECTOR))
                )


class TmaStoreEpilogue(Epilogue):
    """Persistent tiles in out's own order: strips of the tile by TMA stores, two buffers per
    tile owner, the stores running under the next strips and the next tile's main loop."""

    def host_setup(self, out):
        """Every owner's EPI_BUFFERS strips, swizzled as the TMA store reads them, and the TMA
        store atom."""
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
        return epi_smem, tma_out, tma_mout, c_type, c_size

    @cute.jit
    def store_tile(
        self,
        acc,
        scale,
        tiled_mma,
        thr_mma,
        staging,
        mBias,
        sBias,
        mOut,
        tma_epilogue,
        tile,
        tidx,
        split,
        owner,
        position,
    ):
        """bf16(acc * scale + bias) -> out by TMA stores, one epi_tile strip at a time:
        stmatrix into one of this owner's EPI_BUFFERS buffers, fence (the TMA unit reads it
        through the async proxy), barrier, then one warp issues the store. A buffer is
        rewritten only after the store issued EPI_BUFFERS strips earlier has read it (bulk
        wait_group.read before the second barrier), so the stores run under the next strips
        and the next tile's main loop. TMA clips rows past M and columns past N."""
        linear, first, tile_step = position
        tiles_done = (linear - first) // tile_step  # this owner's tiles stored before
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
            values[i] = self.epilogue_value(acc[i], scale, bias)
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

    @cute.jit
    def finish(self, tidx):
        """The last strips' TMA stores must have read shared memory before the CTA exits."""
        if cute.arch.make_warp_uniform(tidx // 32) == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
