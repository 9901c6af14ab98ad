"""cute.compile calls of the user kernel as a CPU can make them: tensors typed as CUDA tensors
(a DLPack capsule over no memory), compiled for sm_90a with TVM-FFI, or with the DSL's own
calling convention (a CUDA stream argument, no TVM-FFI) where the spec ends in `:c`.

    python -m tests.user_kernels.compile_calls N:BLOCK[:c] ...   # prints one JSON line per call
"""

import json
import sys

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack, make_fake_stream

from cute_aot.kernels.recorded.replay import MetadataTensor
from tests.user_kernels.scale import scale


def arguments(n: int, align: int = 16, dtype: str = "float32"):
    def tensor():
        return from_dlpack(
            MetadataTensor((n,), (1,), dtype), assumed_align=align
        ).mark_layout_dynamic()

    return tensor(), tensor(), 2.0, make_fake_stream(use_tvm_ffi_env_stream=True)


def compile_scale(n: int, block: int, tvm_ffi: bool = True):
    if not tvm_ffi:
        x, y, factor, _ = arguments(n)
        return cute.compile[cute.GPUArch("sm_90a")](
            scale, x, y, factor, cuda.CUstream(0), block=block
        )
    return cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)](
        scale, *arguments(n), block=block
    )


def main(specs: list[str]) -> None:
    from cute_aot.runtime import compile_hook, counters

    compile_hook.install_hook()
    for spec in specs:
        n, block, *abi = spec.split(":")
        try:
            compiled = compile_scale(int(n), int(block), tvm_ffi=abi != ["c"])
            outcome = {"type": type(compiled).__name__}
        except Exception as exc:
            outcome = {"error": type(exc).__name__, "message": str(exc)}
        print(
            json.dumps(
                {
                    "spec": spec,
                    **outcome,
                    "compiles": compile_hook.executed(),
                    "counters": counters(),
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1:])
