"""Compile FlashInfer's MXFP8 GEMM kernels on a CPU-only machine (imports flashinfer, cutlass).

FlashInfer's `_make_blockscaled_gemm_compile_fn` compiles its kernel classes' `wrapper` from
placeholders (no GPU tensors) but takes the target architecture from CUTE_DSL_ARCH or the
GPU. We give the same placeholders and arguments to the same `wrapper` of the same kernel
objects and name the architecture explicitly (cute.GPUArch), with the options FlashInfer's
option string sets (opt level 2, TVM-FFI): on sm_100a and sm_103a the exported objects are
byte-identical to FlashInfer's own compile under CUTE_DSL_ARCH (checked for a 128x128 key).

The function takes (mA, mB, mC, sf_m, sf_n, sf_k, a_sf_ptr, b_sf_ptr, alpha) and launches on
TVM-FFI's environment stream: exactly what CuteDSLMxfp8GemmRunner.forward passes.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_ptr
from flashinfer.gemm.kernels.dense_blockscaled_gemm_sm100 import (
    Sm100BlockScaledPersistentDenseGemmKernel,
)
from flashinfer.gemm.kernels.dense_blockscaled_gemm_sm100_splitk import (
    Sm100BlockScaledSplitKGemmKernel,
)

from cute_aot.kernels.flashinfer.mxfp8_gemm import ARCHS, Mxfp8GemmKey

OUT_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
AB_TYPE = cutlass.Float8E4M3FN
SF_TYPE = cutlass.Float8E8M0FNU
AB_ALIGN = 16  # FlashInfer's ab_assumed_align for mxfp8
BATCH = 1


def gemm_kernel(key: Mxfp8GemmKey):
    """The kernel object FlashInfer's runner makes for this key (its make_kernel)."""
    tile = (key.tile_m, key.tile_n)
    if key.split_k_slices > 1:
        return Sm100BlockScaledSplitKGemmKernel(
            key.sf_vec_size, tile, key.split_k_slices, key.enable_pdl
        )
    return Sm100BlockScaledPersistentDenseGemmKernel(
        key.sf_vec_size, tile, (key.cluster_m, key.cluster_n), key.use_prefetch, key.enable_pdl
    )


def compile(key: Mxfp8GemmKey, arch: str):
    if arch not in ARCHS:
        raise ValueError(f"{key.FAMILY} builds for {', '.join(ARCHS)}, not {arch}")
    m, k, n = cute.sym_int(), cute.sym_int(), cute.sym_int()
    a = make_fake_compact_tensor(AB_TYPE, (m, k), stride_order=(1, 0), assumed_align=AB_ALIGN)
    b = make_fake_compact_tensor(AB_TYPE, (n, k), stride_order=(1, 0), assumed_align=AB_ALIGN)
    out_type = OUT_TYPES[key.out_dtype]
    if key.swap_ab:  # the runner passes out.as_strided((M, N), (1, M)) viewed as (N, M)
        c = make_fake_compact_tensor(out_type, (n, m), stride_order=(0, 1), assumed_align=16)
    else:
        c = make_fake_compact_tensor(out_type, (m, n), stride_order=(1, 0), assumed_align=16)
    a_sf = make_ptr(SF_TYPE, 16, cute.AddressSpace.gmem, 16)
    b_sf = make_ptr(SF_TYPE, 16, cute.AddressSpace.gmem, 16)
    alpha = make_fake_compact_tensor(cutlass.Float32, (1,), assumed_align=4)
    options = (cute.GPUArch(arch), cute.OptLevel(2), cute.EnableTVMFFI(True))
    return cute.compile[options](
        gemm_kernel(key).wrapper,
        a,
        b,
        c,
        1,  # sf_m, sf_n, sf_k: runtime values; these stand-ins are FlashInfer's first call's
        1,
        1,
        BATCH,
        a_sf,
        b_sf,
        alpha,
        key.max_active_clusters,
        make_fake_stream(use_tvm_ffi_env_stream=True),
        key.swap_ab,
    )
