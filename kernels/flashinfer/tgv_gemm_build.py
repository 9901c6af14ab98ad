"""Compile FlashInfer's TGV BF16 GEMM on a CPU-only machine (imports flashinfer, cutlass).

FlashInfer compiles `_bmm_no_bias` / `_bmm_bias` of `tgv_gemm_cute_ext` from real CUDA tensors
(`from_dlpack(t, assumed_align=32).mark_layout_dynamic(leading_dim)`; the bias
`from_dlpack(bias.as_strided((L, N, M), (0, 1, 0)), assumed_align=2)`) and an explicit stream,
without TVM-FFI. We compile the same entry points and the same kernel class from placeholders of
exactly the types those tensors give (checked against from_dlpack of CPU tensors of the same
layouts, tests/test_flashinfer_tgv.py): 3-D, every extent symbolic, 64-bit symbolic strides but
a stride of 1 at the leading dimension, 32-byte aligned; the bias with the static strides
(0, 1, 0), 2-byte aligned.

The stream is TVM-FFI's environment stream: the exported function takes no stream argument, and
TVM-FFI sets it, for each call with torch tensors, to torch's current stream on the tensors'
device (the stream FlashInfer's own launch passes), so CUDA graph capture records the launch.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
from flashinfer.gemm.kernels import tgv_gemm_cute_ext as flashinfer_tgv

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.flashinfer.tgv_gemm import OPERAND_ALIGN, TgvGemmFamily, TgvGemmKey

DSL_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
BIAS_ALIGN = 2  # FlashInfer's from_dlpack(bias_3d, assumed_align=2)


def _operand(dtype: str, leading: int):
    """What from_dlpack(t, assumed_align=32).mark_layout_dynamic(leading) gives for a 3-D view."""
    shape = tuple(cute.sym_int() for _ in range(3))
    stride = tuple(1 if dim == leading else cute.sym_int(width=64) for dim in range(3))
    return make_fake_tensor(DSL_TYPES[dtype], shape, stride=stride, assumed_align=OPERAND_ALIGN)


def _bias(dtype: str):
    """The per-output-feature bias broadcast over L and the kernel's N (PyTorch's M)."""
    shape = tuple(cute.sym_int() for _ in range(3))
    return make_fake_tensor(DSL_TYPES[dtype], shape, stride=(0, 1, 0), assumed_align=BIAS_ALIGN)


def compile(key: TgvGemmKey, arch: str):
    if arch not in TgvGemmFamily.archs:
        raise UnsupportedProblemError(f"{key.FAMILY} is built for sm_100a and sm_103a, not {arch}")
    if key.dtype not in DSL_TYPES:
        raise UnsupportedProblemError(f"{key.FAMILY}: no {key.dtype} kernel")
    gemm = flashinfer_tgv.TgvGemmCuteExtKernel(
        acc_dtype=cutlass.Float32,
        cta_m=key.cta_m,
        cta_n=key.cta_n,
        cta_k=key.cta_k,
        num_ab_stage=key.num_ab_stage,
        use_2cta=key.use_2cta,
        use_pdl=key.use_pdl,
        has_bias=key.has_bias,
        arch=key.smem_arch,
    )
    tensors = [
        _operand(key.dtype, key.a_leading),
        _operand(key.dtype, key.b_leading),
        _operand(key.dtype, key.c_leading),
    ]
    if key.has_bias:
        tensors.append(_bias(key.dtype))
    entry = flashinfer_tgv._bmm_bias if key.has_bias else flashinfer_tgv._bmm_no_bias
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    options = (cute.GPUArch(arch), cute.EnableTVMFFI(True))
    return cute.compile[options](entry, gemm, *tensors, stream)
