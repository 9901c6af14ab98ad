"""Hopper GEMM host launch: operand order, tiled MMA, shared-memory layouts, TMA descriptors,
the shared-memory struct, the grid, and the launch (traced inside HopperGemm's host function).

* Operands: the MMA computes A[Mk, K] @ B[Nk, K]^T; A = x, B = w, or under swap-AB A = w and
  B = x (the kernel computes out^T, so a decode-sized M sits on the wgmma's narrow N side).
* Shared memory (one struct, SmemAllocator, dynamic): the pipeline's 2 * stages mbarriers, the
  bias slice of each tile owner, sA and sB (1024-aligned: the 128-byte swizzle), and sC, the
  persistent epilogue's buffer (raw bytes, or the TMA store's typed strips). resources.py's
  shared_bytes is its size.
* Launch: grid (scheduler.grid) x split_k, (C + 1) warpgroups per CTA, cluster (cluster_m,
  cluster_n, split_k), use_pdl as the key says.

No `from __future__ import annotations` here: cute.struct reads its field annotations as
objects.
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16
from cutlass.tensor_utils import LayoutEnum

__all__ = ["launch"]


def tma_load_op(mcast: int):
    """The TMA load of an operand tile, multicast when `mcast` CTAs share it."""
    if mcast == 1:
        return cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
    return cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()


def launch(gemm, x, w, x_scale, w_scale, bias, out, stream):
    """Check the operands against `gemm` (a HopperGemm), build its device-side arguments and
    launch gemm.kernel."""
    if cutlass.const_expr(x.element_type != gemm.ab_dtype or w.element_type != gemm.ab_dtype):
        raise TypeError(f"HopperGemm: x and w must be {gemm.ab_dtype}")
    if cutlass.const_expr(out.element_type != gemm.out_dtype):
        raise TypeError("HopperGemm: out must be bf16")
    if cutlass.const_expr(gemm.scaled != (x_scale is not None)):
        raise TypeError("HopperGemm: fp8 takes x_scale and w_scale, bf16 does not")
    a, b = (w, x) if gemm.swap_ab else (x, w)
    tile_m, tile_n, tile_k = gemm.tile_shape_mnk
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        gemm.ab_dtype,
        gemm.ab_dtype,
        LayoutEnum.from_tensor(a).sm90_mma_major_mode(),
        LayoutEnum.from_tensor(b).sm90_mma_major_mode(),
        gemm.acc_dtype,
        (gemm.tile_warpgroups, 1, 1),
        tiler_mn=(64, tile_n),
    )
    a_smem = sm90_utils.make_smem_layout_a(
        LayoutEnum.from_tensor(a),
        gemm.tile_shape_mnk,
        gemm.ab_dtype,
        gemm.stages,
    )
    b_smem = sm90_utils.make_smem_layout_b(
        LayoutEnum.from_tensor(b),
        gemm.tile_shape_mnk,
        gemm.ab_dtype,
        gemm.stages,
    )
    tma_a, tma_ma = cute.nvgpu.cpasync.make_tiled_tma_atom(
        tma_load_op(gemm.a_mcast),
        a,
        cute.slice_(a_smem, (None, None, 0)),
        (tile_m, tile_k),
        num_multicast=gemm.a_mcast,
    )
    tma_b, tma_mb = cute.nvgpu.cpasync.make_tiled_tma_atom(
        tma_load_op(gemm.b_mcast),
        b,
        cute.slice_(b_smem, (None, None, 0)),
        (tile_n, tile_k),
        num_multicast=gemm.b_mcast,
    )
    epi_smem, tma_out, tma_mout, c_type, c_size = gemm.epilogue.host_setup(out)

    @cute.struct
    class SharedStorage:
        pipeline_barriers: cute.struct.MemRange[cutlass.Int64, gemm.stages * 2]
        # One slice per warpgroup owning tiles; next to the barriers, in front of the
        # 1024-aligned sA (BARRIER_RESERVE, plus 1 KiB for ping-pong's two slices).
        sBias: cute.struct.Align[
            cute.struct.MemRange[BFloat16, gemm.bias_tile * gemm.tile_owners], 16
        ]
        sA: cute.struct.Align[cute.struct.MemRange[gemm.ab_dtype, cute.cosize(a_smem)], 1024]
        sB: cute.struct.Align[cute.struct.MemRange[gemm.ab_dtype, cute.cosize(b_smem)], 1024]
        # The persistent epilogue's buffer: raw bytes, or the TMA store's typed strips.
        sC: cute.struct.Align[cute.struct.MemRange[c_type, c_size], 1024]

    gemm.shared_storage = SharedStorage  # the kernel allocates it
    cluster_m, cluster_n = gemm.cluster_mn
    grid_m, grid_n = gemm.scheduler.grid(a, b)
    gemm.kernel(
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
        grid=[grid_m, grid_n, gemm.split_k],
        block=[gemm.threads, 1, 1],
        cluster=[cluster_m, cluster_n, gemm.split_k],
        stream=stream,
        use_pdl=gemm.pdl,
    )
