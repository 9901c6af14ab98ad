"""Compile FlashInfer's GDN decode kernels on a CPU-only machine (imports flashinfer, cutlass).

FlashInfer compiles from real CUDA tensors (`from_dlpack`); we compile its same `@cute.jit`
launchers from placeholders of exactly the types those tensors give (checked against from_dlpack
of the same operands): q/k/v/output 16-byte aligned with dynamic shape and 64-bit strides, the
last dimension contiguous; a/b likewise at element alignment; A_log and dt_bias static [HV];
the state [?, K, V] compact; and a real stream argument, since FlashInfer passes its stream.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor
from flashinfer.gdn_kernels import gdn_decode_nontranspose as flashinfer_gdn

from cute_aot.kernels.flashinfer.gdn_decode import GdnDecodeKey

DSL_TYPES = {
    "float32": cutlass.Float32,
    "bfloat16": cutlass.BFloat16,
    "float16": cutlass.Float16,
}


def _strided(dtype: str, rank: int, align: int | None):
    """What from_dlpack(t, assumed_align).mark_layout_dynamic() gives for a tensor whose last
    dimension is contiguous."""
    shape = tuple(cute.sym_int() for _ in range(rank))
    stride = (*(cute.sym_int(width=64) for _ in range(rank - 1)), 1)
    return make_fake_tensor(DSL_TYPES[dtype], shape, stride=stride, assumed_align=align)


def _int32_vector():
    """cu_seqlens and h0_indices: dynamic 1-D int32, 16-byte aligned."""
    return make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=16)


def compile(key: GdnDecodeKey, arch: str):
    state = make_fake_tensor(
        DSL_TYPES[key.state_dtype],
        (cute.sym_int(), key.k, key.v),
        stride=(key.k * key.v, key.v, 1),
        assumed_align=16,
    )
    launcher = (
        flashinfer_gdn.run_gdn_decode_kernel_small_batch_nontranspose
        if key.small_batch
        else flashinfer_gdn.run_gdn_decode_kernel_big_batch_nontranspose
    )
    options = (cute.GPUArch(arch), cute.EnableTVMFFI(True))
    return cute.compile[options](
        launcher,
        _int32_vector(),  # cu_seqlens
        _strided(key.q_dtype, 4, 16),
        _strided(key.k_dtype, 4, 16),
        _strided(key.v_dtype, 4, 16),
        _strided(key.a_dtype, 3, None),
        _strided(key.b_dtype, 3, None),
        make_fake_compact_tensor(DSL_TYPES[key.a_log_dtype], (key.hv,)),
        make_fake_compact_tensor(DSL_TYPES[key.dt_bias_dtype], (key.hv,)),
        state,
        _int32_vector(),  # h0_indices
        _strided(key.out_dtype, 4, 16),
        softplus_beta=1.0,
        softplus_threshold=20.0,
        scale=key.scale,
        T=key.t,
        H=key.h,
        HV=key.hv,
        K=key.k,
        V=key.v,
        use_initial_state=True,
        use_qk_l2norm=key.use_qk_l2norm,
        stream=make_fake_stream(use_tvm_ffi_env_stream=False),
    )
