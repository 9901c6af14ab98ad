"""resources.py against the compiled Hopper GEMM kernels: the shared memory each one launches
with, over a sample that covers every tactic kind.

The model is the one that sizes keys (stages_for) and the kernel's struct (launch.py); here it
is compared with what the compiler produced, never with itself: the dynamic shared memory is
read from the compiled host code's launch configuration, the static shared memory from the
cubin with the build's binary info reader (cuobjdump), as the manifest's `gpu_binary` records it.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from cute_aot.aot import binary_info
from cute_aot.artifacts.export import export_object
from cute_aot.kernels.gemm_sm90 import family, fp8_family
from cute_aot.kernels.gemm_sm90.resources import (
    MAX_STAGES,
    SMEM_CAPACITY,
    shared_bytes,
    stages_for,
    stores_by_tma,
)

ARCH = "sm_90a"
HAS_CUOBJDUMP = binary_info.find_tool("cuobjdump") is not None

# One key per tactic kind: the epilogue strategies (staged, split-K, TMA store, registers), the
# main loops (plain, persistent cooperative, ping-pong, promoted fp8), multicast and bias.
KINDS = {
    "plain staged": lambda k: not k.persistent and not k.swap_ab and k.split_k == 1,
    "swap-AB": lambda k: k.swap_ab and k.split_k == 1,
    "split-K": lambda k: k.split_k > 1,
    "cooperative TMA store": lambda k: k.persistent and not k.pingpong and k.tile_m > 64,
    "ping-pong": lambda k: k.pingpong,
    "cluster multicast": lambda k: k.cluster_m * k.cluster_n > 1,
    "bias": lambda k: k.has_bias and k.persistent,
    "fp8 promoted": lambda k: k.promote,
}


def _sample():
    keys = family.enumerate_keys(ARCH) + fp8_family.enumerate_keys(ARCH)
    chosen = {kind: next(k for k in keys if wanted(k)) for kind, wanted in KINDS.items()}
    # No default shape has N % 8 != 0: an any-N key (register epilogue) of a plain tactic.
    chosen["any N"] = dataclasses.replace(chosen["plain staged"], aligned_n=False)
    return chosen


_CONFIG = r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32\)>"


def launch_shared_bytes(host_ir: str) -> int:
    """The dynamic shared memory of the one cudaLaunchKernelEx in the lowered host code: the
    constant stored into field 2 of its cudaLaunchConfig_t (grid, block, dynamicSmemBytes,
    stream, attributes, count)."""
    functions = host_ir.split("\n  llvm.func ")
    (function,) = [f for f in functions if "llvm.call @_cudaLaunchKernelEx(" in f]
    (field,) = re.findall(rf"(%\d+) = llvm\.getelementptr %\d+\[0, 2\] : .*{_CONFIG}", function)
    (value,) = re.findall(rf"llvm\.store (%\d+), {field} : i64", function)
    (size,) = re.findall(rf"{value} = llvm\.mlir\.constant\((\d+) : i64\)", function)
    return int(size)


def _model(key, stages: int) -> int:
    return shared_bytes(
        key.dtype,
        key.tile_m,
        key.tile_n,
        stages,
        key.persistent,
        key.pingpong,
        key.swap_ab,
        key.aligned_n,
    )


def test_sample_covers_every_kind():
    sample = _sample()
    assert set(sample) == {*KINDS, "any N"}
    assert any(stores_by_tma(k.tile_n, k.persistent, k.swap_ab) for k in sample.values())
    assert {k.dtype for k in sample.values()} == {"bfloat16", "float8_e4m3fn"}


def test_launch_shared_bytes_reads_the_config_field():
    host = (
        "\n  llvm.func @f() {\n    %5 = llvm.mlir.constant(4096 : i64) : i64\n"
        "    %6 = llvm.mlir.constant(7 : i64) : i64\n"
        "    %9 = llvm.getelementptr %8[0, 2] : (!llvm.ptr) -> !llvm.ptr, "
        "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>\n"
        "    llvm.store %5, %9 : i64, !llvm.ptr\n"
        "    %10 = llvm.call @_cudaLaunchKernelEx(%1, %2, %3)\n  }\n"
        "  llvm.func @_cudaLaunchKernelEx(!llvm.ptr)"
    )
    assert launch_shared_bytes(host) == 4096


@pytest.mark.slow
@pytest.mark.skipif(not HAS_CUOBJDUMP, reason="cuobjdump (nvidia-cuda-cuobjdump) not installed")
@pytest.mark.parametrize("kind", [*KINDS, "any N"])
def test_resource_model_is_the_compiled_kernels(kind, tmp_path):
    key = _sample()[kind]
    fam = fp8_family if key.dtype == "float8_e4m3fn" else family
    compiled = fam.compile(key, ARCH)
    dynamic = launch_shared_bytes(str(compiled.ir_module))
    exported = export_object(compiled, key, tmp_path)
    (kernel,) = binary_info.inspect_object(exported["object"])["kernels"]
    # The key's stages are the model's, and the kernel allocates exactly the model's struct
    # for them; no other stage count gives that size, so the compiled stages are the key's.
    assert key.stages == stages_for(
        key.dtype, key.tile_m, key.tile_n, key.persistent, key.pingpong, key.swap_ab
    )
    assert dynamic == _model(key, key.stages)
    assert [s for s in range(2, MAX_STAGES + 1) if _model(key, s) == dynamic] == [key.stages]
    # The CTA's whole footprint (the cubin's static part too) fits what an sm_90 CTA may use.
    assert kernel["shared"] + dynamic <= SMEM_CAPACITY
