"""Router GEMM, "cluster split-K" backend (CuTe DSL, SM90 / SM100 / SM103).

    out[M, N] (fp32) = x[M, K] (bf16) @ w[N, K]^T (bf16), fp32 accumulation.

M, K and N are all runtime (symbolic) sizes: one binary serves every shape with
K % 8 == 0 and 16-byte aligned, row-major, contiguous tensors.

Design
------
* CTA tile 16 (M) x 16 (N) x 256 (K).  grid = (ceil(M/16), ceil(N/16), split_k);
  the split_k CTAs along z form one thread-block cluster of shape (1, 1, split_k).
* K split: the ceil(K/256) k-tiles are dealt out in contiguous, balanced ranges:
  cluster rank r owns tiles [floor(r*T/split_k), floor((r+1)*T/split_k)).  A range
  may be empty (small K); such a CTA contributes a zero partial.
* 256 threads, warp-specialised:
    - warps 4..7 (loaders): every thread issues 8 ``cp.async.cg`` 16-byte copies
      per k-tile (4 for the x tile, 4 for the w tile) into a ``num_stages``-deep
      shared-memory ring.  Chunks outside the matrix (row >= M for x, row >= N
      for w, column >= K for both) are zero-filled with the src-size operand of
      cp.async (src-size 0), so every stage is fully defined on every use.
      Completion is signalled with ``cp.async.mbarrier.arrive.noinc`` on the
      stage's "full" mbarrier (arrival count 128).
    - warps 0..3 (MMA): warp q owns k columns [64q, 64q+64) of each 256-wide tile:
      per 16-wide k-block one ``ldmatrix.x4`` for x (A, 16x16), one for w
      (B, 16(n)x16(k)), then two ``mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32``
      (n 0..7 and 8..15).  After the ldmatrix of a stage every MMA thread
      arrives on the stage's "empty" mbarrier (arrival count 128), then issues
      the MMAs.
  Shared-memory rows are 512 bytes (256 bf16); the 16-byte chunk c of row r is
  stored at chunk position c ^ (r & 7) (XOR swizzle inside each 128-byte
  segment), which makes both the cp.async writes and the ldmatrix row reads
  bank-conflict free.
* Cross-warp reduction: each MMA warp stores its 16x16 fp32 partial to shared
  memory, __syncthreads, thread t (of 256) sums the 4 partials of element
  (t / 16, t % 16) into the CTA partial buffer.
* Cross-CTA (split-K) reduction through distributed shared memory: cluster
  barrier (``barrier.cluster.arrive`` (release) / ``wait`` (acquire), the
  NON-aligned forms, executed unconditionally by every thread), then cluster
  rank 0 reads every rank's partial with ``mapa`` + ``ld.shared::cluster`` in
  fixed rank order (deterministic), writes out[m, n] for m < M, n < N, and a
  final cluster barrier keeps every CTA (and its shared memory) alive until
  rank 0 has finished reading.
* PDL (``pdl=True``): the loaders issue the weight tiles of the first
  min(num_stages, #tiles) stages, then ``griddepcontrol.wait`` (x may be
  written by the previous kernel; w may not), then the x tiles.  The MMA warps
  also execute ``griddepcontrol.wait`` before anything else (so every thread
  that later writes ``out`` has waited).  ``griddepcontrol.launch_dependents``
  is issued after the main loop.  The launch sets programmatic stream
  serialization (``use_pdl=True``).

This module imports cutlass at import time; it is only imported at build time
or for JIT.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

__all__ = ["RouterGemmSplitK", "compile_split_k"]

_TILE_M = 16
_TILE_N = 16
_TILE_K = 256
_THREADS = 256
_MMA_WARPS = 4  # warps 0..3
_LOAD_THREADS = 128  # warps 4..7
_ROW_BYTES = _TILE_K * 2  # 512 bytes per smem row (bf16)
_STAGE_BYTES = _TILE_M * _ROW_BYTES  # 8 KiB per operand per stage (16 rows)
_CHUNKS_PER_ROW = _ROW_BYTES // 16  # 32 16-byte chunks per row
_ROWS_PER_PASS = _LOAD_THREADS // _CHUNKS_PER_ROW  # 4 rows per pass of the loaders
_PASSES = _TILE_M // _ROWS_PER_PASS  # 4 copies per operand per thread per tile
_K_PER_WARP = _TILE_K // _MMA_WARPS  # 64
_KBLOCKS_PER_WARP = _K_PER_WARP // 16  # 4


# ---------------------------------------------------------------------------
# Inline-PTX helpers (straight-line code, traced inside the kernel).
# Every instruction that touches memory is marked side-effecting and clobbers
# "memory", so LLVM can neither hoist it above an mbarrier / cluster wait nor
# sink it below an arrive.
# ---------------------------------------------------------------------------


def _cp_async_16_zfill(smem_addr: Int32, gmem_addr: Int64, src_bytes: Int32) -> None:
    """cp.async.cg 16 bytes gmem -> smem; bytes [src_bytes, 16) are zero-filled."""
    llvm.inline_asm(
        None,
        [
            Int32(smem_addr).ir_value(),
            Int64(gmem_addr).ir_value(),
            Int32(src_bytes).ir_value(),
        ],
        "cp.async.cg.shared.global [$0], [$1], 16, $2;",
        "r,l,r,~{memory}",
        has_side_effects=True,
    )


def _ldmatrix_x4(smem_addr: Int32):
    """ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices -> 4 x b32."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32(), T.i32(), T.i32(), T.i32()]),
        [Int32(smem_addr).ir_value()],
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r,~{memory}",
        has_side_effects=True,
    )
    return [Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(4)]


def _mma_16816_bf16(a, b0, b1, c):
    """D = A(16x16, row) * B(16x8, col) + C, bf16 inputs, fp32 accumulators."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32(), T.f32(), T.f32()]),
        [
            a[0].ir_value(),
            a[1].ir_value(),
            a[2].ir_value(),
            a[3].ir_value(),
            b0.ir_value(),
            b1.ir_value(),
            Float32(c[0]).ir_value(),
            Float32(c[1]).ir_value(),
            Float32(c[2]).ir_value(),
            Float32(c[3]).ir_value(),
        ],
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3",
        has_side_effects=False,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(4)]


def _ld_dsmem_f32(smem_addr: Int32, cta_rank: Int32) -> Float32:
    """Read one fp32 from the shared memory of CTA `cta_rank` of this cluster
    (mapa + ld.shared::cluster) at the address that `smem_addr` has locally."""
    res = llvm.inline_asm(
        T.f32(),
        [Int32(smem_addr).ir_value(), Int32(cta_rank).ir_value()],
        "{\n\t.reg .b32 remote_addr;\n\t"
        "mapa.shared::cluster.u32 remote_addr, $1, $2;\n\t"
        "ld.shared::cluster.f32 $0, [remote_addr];\n\t}",
        "=f,r,r,~{memory}",
        has_side_effects=True,
    )
    return Float32(res)


def _swizzled_chunk_offset(row, chunk):
    """Byte offset of logical 16-byte chunk `chunk` (0..31) of smem row `row` (0..15)."""
    return row * _ROW_BYTES + ((chunk ^ (row & 7)) << 4)


def _issue_tile_loads(g_base, row_ok, row_off, s_off, s_stage_base, k_tile, chunk, K):
    """One loader thread's share (4 x 16-byte cp.async) of one 16 x 256 operand tile."""
    kcol = k_tile * _TILE_K + chunk * 8
    k_ok = kcol < K
    for j in range(_PASSES):  # trace-time unrolled (plain Python helper)
        valid = row_ok[j] & k_ok
        # Out-of-range chunks read nothing (src-size 0 -> 16 zero bytes) from a
        # clamped, always-valid address (the tensor base).
        g_off = Int64(cutlass.select_(valid, row_off[j] + Int64(kcol), Int64(0)))
        nbytes = Int32(cutlass.select_(valid, Int32(16), Int32(0)))
        _cp_async_16_zfill(s_stage_base + s_off[j], g_base + g_off * 2, nbytes)


class RouterGemmSplitK:
    """out = x @ w^T with a (1, 1, split_k) cluster splitting K, reduced over DSMEM."""

    def __init__(self, split_k: int = 6, num_stages: int = 4, pdl: bool = False):
        split_k = int(split_k)
        num_stages = int(num_stages)
        if not 1 <= split_k <= 8:
            raise ValueError(f"RouterGemmSplitK: split_k must be in [1, 8], got {split_k}")
        if not 1 <= num_stages <= 8:
            raise ValueError(f"RouterGemmSplitK: num_stages must be in [1, 8], got {num_stages}")
        self.split_k = split_k
        self.num_stages = num_stages
        self.pdl = bool(pdl)

    # ------------------------------------------------------------------ host
    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        w: cute.Tensor,
        out: cute.Tensor,
        stream: cuda.CUstream,
    ):
        m = x.shape[0]
        n = w.shape[0]
        grid_m = (m + (_TILE_M - 1)) // _TILE_M
        grid_n = (n + (_TILE_N - 1)) // _TILE_N
        self.kernel(x, w, out).launch(
            grid=[grid_m, grid_n, self.split_k],
            block=[_THREADS, 1, 1],
            cluster=[1, 1, self.split_k],
            stream=stream,
            use_pdl=self.pdl,
        )

    # ---------------------------------------------------------------- device
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor):
        S = self.num_stages
        SPLIT = self.split_k

        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())

        M = mX.shape[0]
        K = mX.shape[1]
        N = mW.shape[0]
        x_row_stride = Int64(mX.layout.stride[0])
        w_row_stride = Int64(mW.layout.stride[0])
        m0 = bidx * _TILE_M
        n0 = bidy * _TILE_N

        # ---- this CTA's contiguous share of the k-tiles (may be empty) ----
        num_k_tiles = (K + (_TILE_K - 1)) // _TILE_K
        kt_begin = (rank * num_k_tiles) // SPLIT
        kt_end = ((rank + 1) * num_k_tiles) // SPLIT
        n_local = kt_end - kt_begin

        # ---- shared memory ----
        smem = cutlass.memory.SmemAllocator()
        bars = smem.allocate_array(Int64, 2 * S, byte_alignment=8)
        full_bar = bars  # [S], arrival count 128 (cp.async noinc arrivals)
        empty_bar = bars + S  # [S], arrival count 128 (MMA threads)
        sx_ptr = smem.allocate_array(BFloat16, S * _TILE_M * _TILE_K, byte_alignment=128)
        sw_ptr = smem.allocate_array(BFloat16, S * _TILE_N * _TILE_K, byte_alignment=128)
        sP = smem.allocate_tensor(
            Float32,
            cute.make_layout((_MMA_WARPS, _TILE_M, _TILE_N), stride=(256, 16, 1)),
            byte_alignment=16,
        )
        red_ptr = smem.allocate_array(Float32, _TILE_M * _TILE_N, byte_alignment=16)
        sRed = cute.make_tensor(red_ptr, cute.make_layout((_TILE_M, _TILE_N), stride=(16, 1)))
        sx_base = sx_ptr.toint()  # 32-bit shared-window addresses
        sw_base = sw_ptr.toint()
        red_base = red_ptr.toint()

        if tidx == 0:
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(full_bar + s, _LOAD_THREADS)
                cute.arch.mbarrier_init(empty_bar + s, _MMA_WARPS * 32)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp >= _MMA_WARPS:
            # ================= loader warps (4..7) =================
            ltid = tidx - _LOAD_THREADS
            chunk = ltid % _CHUNKS_PER_ROW  # 16-byte chunk within the 512-byte row
            row_lo = ltid // _CHUNKS_PER_ROW  # 0..3; rows row_lo + 4*j
            x_gbase = mX.iterator.toint()
            w_gbase = mW.iterator.toint()

            # Per-pass constants (row validity, global row offsets, smem offsets).
            x_row_ok = []
            w_row_ok = []
            x_row_off = []
            w_row_off = []
            s_off = []
            for j in cutlass.range_constexpr(_PASSES):
                r = row_lo + _ROWS_PER_PASS * j
                x_row_ok.append(m0 + r < M)
                w_row_ok.append(n0 + r < N)
                x_row_off.append(Int64(m0 + r) * x_row_stride)
                w_row_off.append(Int64(n0 + r) * w_row_stride)
                s_off.append(_swizzled_chunk_offset(r, chunk))

            if cutlass.const_expr(self.pdl):
                # Weights never depend on the previous kernel: put the first
                # stages' weight tiles in flight before waiting on it.
                n_pre = cutlass.min(n_local, S)
                for i in cutlass.range(n_pre):
                    _issue_tile_loads(
                        w_gbase,
                        w_row_ok,
                        w_row_off,
                        s_off,
                        sw_base + i * _STAGE_BYTES,
                        kt_begin + i,
                        chunk,
                        K,
                    )
                cute.arch.griddepcontrol_wait()

            for i in cutlass.range(n_local):
                stage = i % S
                phase = (i // S) & 1
                # Wait until the MMA warps released this stage (use i//S - 1).
                # On a fresh barrier parity 1 is already complete: the first
                # S iterations pass straight through.
                cute.arch.mbarrier_wait(empty_bar + stage, phase ^ 1)
                if cutlass.const_expr(self.pdl):
                    if i >= S:
                        _issue_tile_loads(
                            w_gbase,
                            w_row_ok,
                            w_row_off,
                            s_off,
                            sw_base + stage * _STAGE_BYTES,
                            kt_begin + i,
                            chunk,
                            K,
                        )
                else:
                    _issue_tile_loads(
                        w_gbase,
                        w_row_ok,
                        w_row_off,
                        s_off,
                        sw_base + stage * _STAGE_BYTES,
                        kt_begin + i,
                        chunk,
                        K,
                    )
                _issue_tile_loads(
                    x_gbase,
                    x_row_ok,
                    x_row_off,
                    s_off,
                    sx_base + stage * _STAGE_BYTES,
                    kt_begin + i,
                    chunk,
                    K,
                )
                # Arrives (without a pending-count increment) once ALL prior
                # cp.async of this thread have landed, i.e. also the prologue
                # weight tiles in the PDL case.
                cute.arch.cp_async_mbarrier_arrive_noinc(full_bar + stage)
        else:
            # ================= MMA warps (0..3) =================
            if cutlass.const_expr(self.pdl):
                # These threads write `out` (rank 0): order them after the
                # previous grid as well.
                cute.arch.griddepcontrol_wait()
            wq = warp  # this warp's quarter of the 256-wide k tile
            g = lane // 4
            t4 = lane % 4
            # ldmatrix.x4 row addresses (lane -> (row, logical chunk)):
            #  A (x, 16 m x 16 k): lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at k 8-15
            #    -> regs a0 (m0-7,k0-7) a1 (m8-15,k0-7) a2 (m0-7,k8-15) a3 (m8-15,k8-15)
            #  B (w, 16 n x 16 k): lanes 0-7 n0-7 k0-7, 8-15 n0-7 k8-15, 16-23 n8-15 k0-7,
            #    24-31 n8-15 k8-15
            #    -> regs b0,b1 of n-block 0, b0,b1 of n-block 1
            a_row = lane % 16
            a_chunk0 = wq * (_K_PER_WARP // 8) + lane // 16
            b_row = lane % 8 + (lane // 16) * 8
            b_chunk0 = wq * (_K_PER_WARP // 8) + (lane // 8) % 2
            a_off = []
            b_off = []
            for kb in cutlass.range_constexpr(_KBLOCKS_PER_WARP):
                a_off.append(_swizzled_chunk_offset(a_row, a_chunk0 + 2 * kb))
                b_off.append(_swizzled_chunk_offset(b_row, b_chunk0 + 2 * kb))

            # acc[4*j + 2*h + e] = C[g + 8h, 8j + 2*t4 + e]
            acc = cute.make_rmem_tensor(cute.make_layout(8), Float32)
            acc.fill(0.0)

            for i in cutlass.range(n_local):
                stage = i % S
                phase = (i // S) & 1
                cute.arch.mbarrier_wait(full_bar + stage, phase)
                x_stage = sx_base + stage * _STAGE_BYTES
                w_stage = sw_base + stage * _STAGE_BYTES
                frag_a = []
                frag_b = []
                for kb in cutlass.range_constexpr(_KBLOCKS_PER_WARP):
                    frag_a.append(_ldmatrix_x4(x_stage + a_off[kb]))
                    frag_b.append(_ldmatrix_x4(w_stage + b_off[kb]))
                # This thread's reads of the stage are done: release it.
                cute.arch.mbarrier_arrive(empty_bar + stage)
                for kb in cutlass.range_constexpr(_KBLOCKS_PER_WARP):
                    a = frag_a[kb]
                    b = frag_b[kb]
                    d0 = _mma_16816_bf16(a, b[0], b[1], [acc[0], acc[1], acc[2], acc[3]])
                    d1 = _mma_16816_bf16(a, b[2], b[3], [acc[4], acc[5], acc[6], acc[7]])
                    for e in cutlass.range_constexpr(4):
                        acc[e] = d0[e]
                        acc[4 + e] = d1[e]

            # This warp's 16x16 partial -> sP[wq]
            for j in cutlass.range_constexpr(2):
                for h in cutlass.range_constexpr(2):
                    for e in cutlass.range_constexpr(2):
                        sP[wq, g + 8 * h, 8 * j + 2 * t4 + e] = acc[4 * j + 2 * h + e]

        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()

        # ---- cross-warp reduction: thread t owns element (t // 16, t % 16) ----
        cute.arch.sync_threads()
        em = tidx // _TILE_N
        en = tidx % _TILE_N
        part = sP[0, em, en] + sP[1, em, en]
        part = part + sP[2, em, en]
        part = part + sP[3, em, en]
        sRed[em, en] = part

        # ---- split-K reduction over the cluster (DSMEM) ----
        # Non-aligned barrier.cluster.arrive (release) / wait (acquire); every
        # thread of every CTA executes exactly two arrive/wait pairs.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        if rank == 0:
            my_addr = red_base + tidx * 4
            total = _ld_dsmem_f32(my_addr, Int32(0))
            for r in cutlass.range_constexpr(1, SPLIT):
                total = total + _ld_dsmem_f32(my_addr, Int32(r))
            gm = m0 + em
            gn = n0 + en
            if gm < M:
                if gn < N:
                    mOut[gm, gn] = total
        # Keep every CTA's shared memory alive until rank 0 has read it.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()


def compile_split_k(split_k: int, num_stages: int, pdl: bool, arch: str):
    """Cross-compile for arch ("sm_90a" | "sm_100a" | "sm_103a") with TVM-FFI; returns the
    cute.compile result.

    The compiled function takes (x, w, out) torch tensors and launches on the
    caller's current torch stream.
    """
    m = cute.sym_int()
    k = cute.sym_int(divisibility=8)
    n = cute.sym_int()
    x = cute.runtime.make_fake_tensor(BFloat16, (m, k), (k, 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(BFloat16, (n, k), (k, 1), assumed_align=16)
    out = cute.runtime.make_fake_tensor(Float32, (m, n), (n, 1), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    op = RouterGemmSplitK(split_k, num_stages, pdl)
    return cute.compile(op, x, w, out, stream, options=f"--gpu-arch {arch} --enable-tvm-ffi")
