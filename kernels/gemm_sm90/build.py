"""Hopper GEMM, CuTe DSL part: compile a key for an architecture (build machines and JIT only)."""

from __future__ import annotations

from cute_aot.kernels.gemm_sm90 import FP8_DTYPE, GemmSm90Key, check_key


def compile(key: GemmSm90Key, arch: str):
    """Cross-compile `key` for `arch` with TVM-FFI; the result exports with `export_to_c`.

    M, N and K are symbolic: K's divisibility is the key's alignment (align_bytes / element
    size), so every row of x and w starts 16-byte aligned, as TMA requires. The exported
    function takes (x, w, bias, out) for bf16 and (x, w, x_scale, w_scale, bias, out) for fp8,
    and launches on the caller's current torch stream.
    """
    import cutlass
    import cutlass.cute as cute

    from cute_aot.kernels.gemm_sm90.kernel import HopperGemm

    check_key(key, arch)
    ab_dtype = cutlass.Float8E4M3FN if key.dtype == FP8_DTYPE else cutlass.BFloat16
    elem_bytes = ab_dtype.width // 8
    m = cute.sym_int()
    n = cute.sym_int(divisibility=8) if key.aligned_n else cute.sym_int()
    k = cute.sym_int(divisibility=key.align_bytes // elem_bytes)
    align = key.align_bytes
    x = cute.runtime.make_fake_tensor(ab_dtype, (m, k), (k, 1), assumed_align=align)
    w = cute.runtime.make_fake_tensor(ab_dtype, (n, k), (k, 1), assumed_align=align)
    bias = cute.runtime.make_fake_tensor(cutlass.BFloat16, (n,), (1,), assumed_align=align)
    out = cute.runtime.make_fake_tensor(cutlass.BFloat16, (m, n), (n, 1), assumed_align=align)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    op = HopperGemm(
        ab_dtype,
        (key.tile_m, key.tile_n),
        (key.cluster_m, key.cluster_n),
        key.stages,
        key.has_bias,
        key.pdl,
        key.raster_m,
        key.aligned_n,
        key.swap_ab,
        key.split_k,
        key.promote,
        key.persistent,
        key.pingpong,
    )
    options = f"--gpu-arch {arch} --enable-tvm-ffi"
    if key.dtype == FP8_DTYPE:
        x_scale = cute.runtime.make_fake_tensor(cutlass.Float32, (1,), (1,), assumed_align=4)
        w_scale = cute.runtime.make_fake_tensor(cutlass.Float32, (1,), (1,), assumed_align=4)
        return cute.compile(
            op.call_scaled, x, w, x_scale, w_scale, bias, out, stream, options=options
        )
    return cute.compile(op, x, w, bias, out, stream, options=options)
