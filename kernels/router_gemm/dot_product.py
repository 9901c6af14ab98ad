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
* K tail, the k_tail = K mod (8*block_size) elements left after the full
  rounds (a multiple of 8, since K % 8 == 0 is required for 16-byte row
  alignment):
  - k_tail == 4*block_size (e.g. K=7168 at 256 threads): one more full,
    unpredicated round of 4-element (64-bit) chunks, every thread busy;
  - otherwise: one predicated round of 8-element (128-bit) chunks done by the
    first k_tail/8 threads.
  No scalar remainder can occur because K % 8 == 0.
* Reduction of each accumulator: butterfly shuffle inside each warp, one
  partial per (warp, m) in shared memory, then thread m (< M) sums the
  per-warp partials in a fixed order and writes out[m, n].  The result is
  deterministic (no atomics).
* PDL: with ``pdl=True`` the kernel executes ``griddepcontrol.wait`` before
  it touches global memory, signals ``griddepcontrol.launch_dependents`` once
  its K loop (all of its global reads) is done, and the launch sets
  programmatic stream serialization (``use_pdl=True``).  With ``pdl=False``
  neither instruction is emitted and the attribute is off.

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
        # register cap 65536 / (block_size * min_ctas_per_sm) == 128 (64 at 1024)
        self.min_ctas_per_sm = max(1, 512 // block_size)

        # ---- static K schedule (all compile-time) --------------------------
        # main part [0, k_main): full rounds r = 0..R-1 in which thread t loads
        # the 8-wide chunk c = t + r*block_size, i.e. elements [8c, 8c+8)
        self.main_rounds = k // (_VEC * block_size)
        self.k_main = self.main_rounds * _VEC * block_size
        k_tail = k - self.k_main  # 0 <= k_tail < 8*block_size, k_tail % 8 == 0
        # tail [k_main, k): either one full round of 4-wide chunks
        # (thread t: elements [k_main + 4t, k_main + 4t + 4)) ...
        self.tail4 = k_tail == _VEC_TAIL * block_size
        # ... or one round of 8-wide chunks c = R*block_size + t for the first
        # tail8_threads threads (elements [k_main + 8t, k_main + 8t + 8))
        self.tail8_threads = 0 if self.tail4 else k_tail // _VEC
        assert k_tail == (_VEC_TAIL * block_size if self.tail4 else _VEC * self.tail8_threads)
        assert self.tail8_threads < block_size

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
            # Launch bound `.minnctapersm`.  Without one, ptxas -O3 aims at 64
            # registers: it then spills at M=16 and issues few loads ahead.
            # With it ptxas hoists the (unrolled) loads; the bound caps the
            # registers at 65536 / (block_size * min_ctas) = 128, so >= 2 CTAs
            # of 256 or 4 CTAs of 128 threads fit on an SM.
            min_blocks_per_mp=self.min_ctas_per_sm,
            # Must be set whenever min_blocks_per_mp > 1, or the DSL queries
            # the (absent, when cross-compiling) GPU for its shared memory
            # size.  -1 = CU_SHAREDMEM_CARVEOUT_DEFAULT ("no preference"): a
            # no-op hint; the TVM-FFI export does not even carry it.
            preferred_smem_carveout=-1,
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

        tidx, _, _ = cute.arch.thread_idx()
        n, _, _ = cute.arch.block_idx()  # expert row handled by this CTA
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()

        smem = cutlass.memory.SmemAllocator()
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

        # ---- issue every unpredicated weight load of this thread first -----
        # main rounds: 8-wide chunk c = tidx + r*BS, elements [8c, 8c+8)
        if cutlass.const_expr(R > 0):
            w_main = cute.make_rmem_tensor(cute.make_layout((_VEC, R)), BFloat16)
            for r in cutlass.range_constexpr(R):
                self._load_vec(w_row, tidx + r * BS, w_main[None, r], _VEC)
        # full 4-wide tail round: 4-wide chunk c4 = k_main/4 + tidx,
        # elements [k_main + 4*tidx, k_main + 4*tidx + 4)
        c4 = self.k_main // _VEC_TAIL + tidx
        if cutlass.const_expr(self.tail4):
            w_t4 = cute.make_rmem_tensor((_VEC_TAIL,), BFloat16)
            self._load_vec(w_row, c4, w_t4, _VEC_TAIL)

        # ---- FMAs (x loads are L1/L2 hits: every CTA reads the same x) ------
        for r in cutlass.range_constexpr(R):
            wf = w_main[None, r].load().to(Float32)
            self._fma_rows(acc, wf, x, tidx + r * BS, _VEC)
        if cutlass.const_expr(self.tail4):
            self._fma_rows(acc, w_t4.load().to(Float32), x, c4, _VEC_TAIL)
        if cutlass.const_expr(self.tail8_threads > 0):
            # partial 8-wide tail round: chunk c8 = R*BS + tidx, elements
            # [k_main + 8*tidx, k_main + 8*tidx + 8), first tail8_threads threads
            if tidx < self.tail8_threads:
                c8 = R * BS + tidx
                w_t8 = cute.make_rmem_tensor((_VEC,), BFloat16)
                self._load_vec(w_row, c8, w_t8, _VEC)
                self._fma_rows(acc, w_t8.load().to(Float32), x, c8, _VEC)

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
    return cute.compile(op, x, w, out, stream, options=f"--gpu-arch {arch} --enable-tvm-ffi")
