"""RMSNorm of bf16 rows (CuTe DSL, plain SIMT: runs on SM90, SM100 and SM103 alike).

    out[m, j] (bf16) = x[m, j] * rsqrt(mean_j' x[m, j']^2 + eps) * weight[j],  fp32 math.

Design
------
* One CTA per row: grid = (M, 1, 1), ``block_size`` threads. M is a runtime (symbolic) size, so
  one binary serves every token count; N (hidden size, a multiple of 8), eps and the block size
  are compile-time constants.
* Tiling: a row is cut into N/8 chunks of 8 bf16 = 16 bytes, one 128-bit load each. In round r
  thread t owns chunk c = t + r * block_size, so a warp reads 512 contiguous bytes per round
  (coalesced). rounds = ceil(N / 8 / block_size); every round but possibly the last is full and
  unpredicated; in a partial last round only threads with c < N/8 load and store. The block size
  (the family's dispatch: the fewest warps with <= 4 chunks per thread, N <= 32768) keeps
  rounds <= 4, so the row and its weights stay in registers (bf16, 4 registers per chunk each):
  x is read from global memory once.
* Order of work: every x and weight load of the thread is issued first; the weights are only
  needed after the reduction, so their latency hides behind it.
* Reduction of sum(x^2), deterministic (no atomics): each thread accumulates its chunks in round
  order, elements 0..7 within a chunk, with fp32 FMAs; then a butterfly of shfl.bfly with lane
  offsets 16, 8, 4, 2, 1 leaves the warp total in every lane; lane 0 of warp w writes it to
  shared memory slot w; after one barrier every thread adds the slots in order 0..warps-1 itself
  (a broadcast read), so no second barrier is needed.
* Epilogue: rstd = rsqrt(sum / N + eps) (div.rn.f32, then rsqrt.approx.f32: relative error
  below 2^-22, far under bf16 rounding); each chunk is (x * rstd) * weight in fp32, rounded once
  to bf16 and written with one 128-bit store.
* Launched on the caller's current stream (the exported function takes no stream argument: the
  ``cuda.CUstream`` parameter is compiled with ``make_fake_stream(use_tvm_ffi_env_stream=True)``).
  No PDL: the kernel reads what the previous kernel wrote straight away, so there is nothing to
  overlap before ``griddepcontrol.wait``.

This module imports cutlass: only builds and JIT import it (through ``cute_aot_rmsnorm.build``).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import BFloat16, Float32

__all__ = ["RMSNorm", "compile_rmsnorm"]

WARP = 32
VEC = 8  # bf16 elements per 128-bit access


class RMSNorm:
    """out[m, :] = x[m, :] * rsqrt(mean(x[m, :]^2) + eps) * weight; one CTA per row."""

    def __init__(self, n: int, eps: float, block_size: int):
        if n < VEC or n % VEC:
            raise ValueError(f"RMSNorm: n must be a positive multiple of {VEC}, got {n}")
        if block_size % WARP or not WARP <= block_size <= 1024:
            raise ValueError(
                f"RMSNorm: block_size must be a multiple of 32 in [32, 1024], got {block_size}"
            )
        if not eps > 0:
            raise ValueError(f"RMSNorm: eps must be positive, got {eps}")
        self.n = n
        self.eps = eps
        self.block_size = block_size
        self.num_warps = block_size // WARP
        self.chunks = n // VEC
        self.rounds = -(-self.chunks // block_size)
        # The last round is partial when the chunks do not fill it: it alone is predicated.
        self.full_rounds = self.chunks // block_size

    # -- host ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self, x: cute.Tensor, weight: cute.Tensor, out: cute.Tensor, stream: cuda.CUstream
    ):
        # x, out: (M, N):(N, 1) bf16; weight: (N,):(1,) bf16; all 16-byte aligned
        rows = cute.size(x, mode=[0])
        self.kernel(x, weight, out).launch(
            grid=[rows, 1, 1], block=[self.block_size, 1, 1], stream=stream
        )

    # -- device ----------------------------------------------------------------------------------
    @cute.jit
    def _chunk(self, row: cute.Tensor, chunk) -> cute.Tensor:
        """Elements [8 * chunk, 8 * chunk + 8) of a 16-byte aligned (N,):(1,) row."""
        return cute.local_tile(row, (VEC,), (chunk,))

    @cute.jit
    def _round_active(self, chunk, r: cutlass.Constexpr) -> bool:
        """Whether this thread's chunk of round r exists (always, in the full rounds)."""
        if cutlass.const_expr(r < self.full_rounds):
            return True
        return chunk < self.chunks

    @cute.jit
    def _block_sum(self, value: Float32, partials: cute.Tensor) -> Float32:
        """Sum of `value` over the CTA, in a fixed order; every thread gets the total."""
        # warp_idx() is a shfl.sync over the full warp: read it before the lane-0 branch, where
        # the other 31 lanes would never join it (a hang).
        warp = cute.arch.warp_idx()
        offset = WARP // 2
        while cutlass.const_expr(offset > 0):
            value = value + cute.arch.shuffle_sync_bfly(value, offset=offset)
            offset //= 2
        if cute.arch.lane_idx() == 0:
            partials[warp] = value
        cute.arch.sync_threads()
        total = partials[0]
        for w in cutlass.range_constexpr(1, self.num_warps):
            total = total + partials[w]
        return total

    @cute.kernel
    def kernel(self, x: cute.Tensor, weight: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        m, _, _ = cute.arch.block_idx()
        x_row, out_row = x[m, None], out[m, None]

        smem = cutlass.memory.SmemAllocator()
        partials = smem.allocate_tensor(
            Float32, cute.make_layout((self.num_warps,)), byte_alignment=16
        )

        # Registers for this thread's chunks; zeros where a partial round has no chunk, so the
        # sum of squares needs no predicate.
        x_regs = cute.make_rmem_tensor(cute.make_layout((VEC, self.rounds)), BFloat16)
        w_regs = cute.make_rmem_tensor(cute.make_layout((VEC, self.rounds)), BFloat16)
        if cutlass.const_expr(self.full_rounds < self.rounds):
            x_regs.fill(0.0)
        for r in cutlass.range_constexpr(self.rounds):
            chunk = tidx + r * self.block_size
            if self._round_active(chunk, r):
                cute.autovec_copy(self._chunk(x_row, chunk), x_regs[None, r])
        for r in cutlass.range_constexpr(self.rounds):
            chunk = tidx + r * self.block_size
            if self._round_active(chunk, r):
                cute.autovec_copy(self._chunk(weight, chunk), w_regs[None, r])

        squares = Float32(0.0)
        for r in cutlass.range_constexpr(self.rounds):
            xf = x_regs[None, r].load().to(Float32)
            for j in cutlass.range_constexpr(VEC):
                squares = cute.math.fma(xf[j], xf[j], squares)
        total = self._block_sum(squares, partials)
        rstd = cute.math.rsqrt(total / Float32(self.n) + Float32(self.eps))

        y_regs = cute.make_rmem_tensor((VEC,), BFloat16)
        for r in cutlass.range_constexpr(self.rounds):
            chunk = tidx + r * self.block_size
            if self._round_active(chunk, r):
                xf = x_regs[None, r].load().to(Float32)
                wf = w_regs[None, r].load().to(Float32)
                y_regs.store(((xf * rstd) * wf).to(BFloat16))
                cute.autovec_copy(y_regs, self._chunk(out_row, chunk))


def compile_rmsnorm(n: int, eps: float, block_size: int, arch: str):
    """Cross-compile for `arch` ("sm_90a", "sm_100a", "sm_103a") with TVM-FFI.

    The compiled function takes (x [M, n], weight [n], out [M, n]), bf16, row-major, 16-byte
    aligned; M is a runtime size; it launches on the caller's current CUDA stream.
    """
    op = RMSNorm(n, eps, block_size)
    m = cute.sym_int()
    x = cute.runtime.make_fake_tensor(BFloat16, (m, n), (n, 1), assumed_align=16)
    weight = cute.runtime.make_fake_tensor(BFloat16, (n,), (1,), assumed_align=16)
    out = cute.runtime.make_fake_tensor(BFloat16, (m, n), (n, 1), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(op, x, weight, out, stream, options=f"--gpu-arch {arch} --enable-tvm-ffi")
