"""Router GEMM, "dot-product" backend (CuTe DSL, SM90+).

    out[M, N] (fp32) = x[M, K] (bf16) @ w[N, K]^T (bf16), fp32 accumulation.

Design
------
* One CTA per expert row ``n`` (grid = (N, 1, 1)), ``block_size`` threads.
* ``M`` (tokens, 1..16) and ``K`` (hidden size, multiple of 8) are compile-time
  constants; ``N`` is a runtime (symbolic) size.
* K loop, fully unrolled at compile time.  The row is cut into 8-element
  (128-bit) chunks; in round ``i`` thread ``t`` owns chunk ``t + i*block_size``
  so consecutive threads read consecutive 16-byte words (coalesced).  For every
  chunk the thread loads w[n, chunk] once and x[m, chunk] for all M rows, and
  does 8 fp32 FMAs per row into its M accumulators.
* K tail (K not a multiple of 8*block_size): the remaining elements are cut
  into 4-element (64-bit) chunks spread over the threads (the last round
  predicated on the thread index).  Because K % 8 == 0 is required (16-byte
  row alignment), no scalar remainder can occur.
* Reduction of each accumulator: butterfly shuffle inside each warp, one
  partial per (warp, m) in shared memory, then thread m (< M) sums the
  per-warp partials in a fixed order and writes out[m, n].  The result is
  deterministic (no atomics).
* PDL: with ``pdl=True`` the kernel executes ``griddepcontrol.wait`` before
  it touches global memory, signals ``griddepcontrol.launch_dependents`` once
  its loads are issued, and the launch sets programmatic stream serialization
  (``use_pdl=True``).

This module imports cutlass at import time; it is only imported at build time
or for JIT.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils
from cutlass import BFloat16, Float32

__all__ = ["RouterGemmDotProduct", "compile_dot_product"]

_WARP = 32
_VEC = 8  # bf16 elements per 128-bit load
_VEC_TAIL = 4  # bf16 elements per 64-bit load (K tail)


class RouterGemmDotProduct:
    """out[m, n] = sum_k x[m, k] * w[n, k]; one CTA per expert row n."""

    def __init__(self, m: int, k: int, block_size: int = 128, pdl: bool = False):
        m = int(m)
        k = int(k)
        block_size = int(block_size)
        if not 1 <= m <= 16:
            raise ValueError(f"RouterGemmDotProduct: m must be in [1, 16], got {m}")
        if k <= 0 or k % _VEC != 0:
            raise ValueError(
                f"RouterGemmDotProduct: k must be a positive multiple of {_VEC}, got {k}"
            )
        if block_size % _WARP != 0 or not _WARP <= block_size <= 1024:
            raise ValueError(
                "RouterGemmDotProduct: block_size must be a multiple of 32 in "
                f"[32, 1024], got {block_size}"
            )
        self.m = m
        self.k = k
        self.block_size = block_size
        self.pdl = bool(pdl)
        self.num_warps = block_size // _WARP

        # ---- static K schedule -------------------------------------------
        # main part: full rounds in which every thread loads one 8-wide chunk
        self.main_rounds = k // (_VEC * block_size)
        k_main = self.main_rounds * _VEC * block_size
        # tail: [k_main, k) in 4-wide chunks, chunk j -> thread j % bs,
        # round j // bs; the last round is predicated when partial.
        k_tail = k - k_main
        assert k_tail % _VEC_TAIL == 0  # follows from k % 8 == 0
        self.k_main = k_main
        self.tail_chunks = k_tail // _VEC_TAIL
        self.tail_full_rounds = self.tail_chunks // block_size
        self.tail_partial = self.tail_chunks % block_size  # threads in last round

    # ------------------------------------------------------------------ host
    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        w: cute.Tensor,
        out: cute.Tensor,
        stream: cuda.CUstream,
    ):
        # x: (M, K):(K, 1) bf16; w: (N, K):(K, 1) bf16; out: (M, N):(N, 1) fp32
        num_experts = cute.size(w, mode=[0])
        self.kernel(x, w, out).launch(
            grid=[num_experts, 1, 1],
            block=[self.block_size, 1, 1],
            stream=stream,
            use_pdl=self.pdl,
            # `.minnctapersm 1`: without a launch bound ptxas -O3 aims at 64
            # registers and spills at M=16 (measured); with it ptxas keeps all
            # accumulators in registers and hoists the weight loads.
            min_blocks_per_mp=1,
        )

    # ---------------------------------------------------------------- device
    @cute.jit
    def _load_vec(self, row: cute.Tensor, chunk, dst: cute.Tensor, width: cutlass.Constexpr):
        """dst[0:width] = row[chunk*width : (chunk+1)*width] as ONE vector load.

        ``row`` is a 16-byte aligned (K,):(1,) bf16 row; chunk*width*2 bytes is a
        multiple of width*2, so the load is 128-bit (width 8) or 64-bit (width 4).
        """
        cute.autovec_copy(cute.local_tile(row, (width,), (chunk,)), dst)

    @cute.jit
    def _fma_rows(
        self,
        acc: cute.Tensor,
        wf,
        x: cute.Tensor,
        chunk,
        width: cutlass.Constexpr,
    ):
        """acc[m] += sum_{j<width} x[m, chunk*width + j] * wf[j] for every token row m.

        ``wf`` holds w[n, chunk*width : (chunk+1)*width] already converted to fp32.
        """
        for mi in cutlass.range_constexpr(self.m):
            x_vec = cute.make_rmem_tensor((width,), BFloat16)
            self._load_vec(x[mi, None], chunk, x_vec, width)
            xf = x_vec.load().to(Float32)
            a = acc[mi]
            for j in cutlass.range_constexpr(width):
                a = cute.math.fma(xf[j], wf[j], a)
            acc[mi] = a

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor):
        M = self.m
        BS = self.block_size
        NW = self.num_warps
        R = self.main_rounds
        TR = self.tail_full_rounds

        tidx, _, _ = cute.arch.thread_idx()
        n, _, _ = cute.arch.block_idx()  # expert row handled by this CTA
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()

        smem = cutlass.utils.SmemAllocator()
        # red[wi, mi]: warp wi's partial sum for token row mi
        red = smem.allocate_tensor(
            Float32, cute.make_layout((NW, M), stride=(M, 1)), byte_alignment=16
        )

        acc = cute.make_rmem_tensor((M,), Float32)
        acc.fill(0.0)

        if cutlass.const_expr(self.pdl):
            # x (and possibly w / out) belong to the previous kernel in the stream
            cute.arch.griddepcontrol_wait()

        w_row = w[n, None]  # (K,):(1,), 16-byte aligned since K % 8 == 0

        # ---- issue every (unpredicated) weight load of this thread first -----
        # main rounds: 8-wide chunk index tidx + r*BS, elements [8c, 8c+8)
        if cutlass.const_expr(R > 0):
            w_main = cute.make_rmem_tensor(cute.make_layout((_VEC, R)), BFloat16)
            for r in cutlass.range_constexpr(R):
                self._load_vec(w_row, tidx + r * BS, w_main[None, r], _VEC)
        # tail rounds: 4-wide chunk index tail0 + tidx + r*BS; 4*tail0 == k_main
        tail0 = self.k_main // _VEC_TAIL
        if cutlass.const_expr(TR > 0):
            w_tail = cute.make_rmem_tensor(cute.make_layout((_VEC_TAIL, TR)), BFloat16)
            for r in cutlass.range_constexpr(TR):
                self._load_vec(w_row, tail0 + tidx + r * BS, w_tail[None, r], _VEC_TAIL)

        # ---- FMAs (x loads are L1/L2 hits: every CTA reads the same x) ------
        for r in cutlass.range_constexpr(R):
            wf = w_main[None, r].load().to(Float32)
            self._fma_rows(acc, wf, x, tidx + r * BS, _VEC)
        for r in cutlass.range_constexpr(TR):
            wf = w_tail[None, r].load().to(Float32)
            self._fma_rows(acc, wf, x, tail0 + tidx + r * BS, _VEC_TAIL)
        if cutlass.const_expr(self.tail_partial > 0):
            # last, partial tail round: only the first tail_partial threads
            if tidx < self.tail_partial:
                c = tail0 + tidx + TR * BS
                w_last = cute.make_rmem_tensor((_VEC_TAIL,), BFloat16)
                self._load_vec(w_row, c, w_last, _VEC_TAIL)
                self._fma_rows(acc, w_last.load().to(Float32), x, c, _VEC_TAIL)

        if cutlass.const_expr(self.pdl):
            # this thread's global reads are done; the next kernel may launch
            # (it still waits for this grid to complete before reading `out`)
            cute.arch.griddepcontrol_launch_dependents()

        # ---- reduction ---------------------------------------------------------
        # 1) butterfly inside each warp: afterwards every lane holds the warp sum
        for mi in cutlass.range_constexpr(M):
            acc[mi] = cute.arch.warp_reduction_sum(acc[mi])
        # 2) lane 0 of each warp publishes its M partials
        if lane == 0:
            for mi in cutlass.range_constexpr(M):
                red[warp, mi] = acc[mi]
        cute.arch.sync_threads()
        # 3) thread mi < M sums the NW warp partials (fixed order) -> out[mi, n]
        if tidx < M:
            total = red[0, tidx]
            for wi in cutlass.range_constexpr(1, NW):
                total = total + red[wi, tidx]
            out[tidx, n] = total


def compile_dot_product(m: int, k: int, block_size: int, pdl: bool, arch: str):
    """Cross-compile for ``arch`` (e.g. "sm_90a", "sm_100a", "sm_103a") with
    TVM-FFI; returns the ``cute.compile`` result.

    The compiled function takes ``(x, w, out)`` (torch tensors via TVM-FFI /
    DLPack) and launches on the caller's current CUDA stream:
    x (m, k) bf16, w (N, k) bf16, out (m, N) fp32, all row-major contiguous and
    16-byte aligned; N is a runtime size.
    """
    op = RouterGemmDotProduct(m, k, block_size=block_size, pdl=pdl)
    n = cute.sym_int()
    x = cute.runtime.make_fake_tensor(BFloat16, (m, k), (k, 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(BFloat16, (n, k), (k, 1), assumed_align=16)
    out = cute.runtime.make_fake_tensor(Float32, (m, n), (n, 1), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(
        op, x, w, out, stream, options=f"--gpu-arch {arch} --enable-tvm-ffi"
    )
