"""An unmodified program that runs the user kernel (tests/user_kernels/scale.py) on torch CUDA
tensors, as benchmarks/recorded_flashinfer.py's user-kernel calls do on a real GPU: compiled with
TVM-FFI (called on torch tensors) and without (cute tensors from from_dlpack and a CUDA stream),
for blocks 128 and 256, each then called. It imports nothing of cute-aot, so under
CUTE_AOT_VIRTUAL it runs on a virtual GPU of the profile; on a real GPU it runs for real.

    python -m tests.user_kernels.torch_program             # the four kernels
    python -m tests.user_kernels.torch_program --every-sm  # also scale_on_every_sm (asks SMs)
    python -m tests.user_kernels.torch_program --ask       # then questions no GPU profile answers

Prints one JSON line per call: {"call": ..., "returned": repr of what the kernel returned}, and
for --ask one per question: {"question": ..., "error": type, "message": ...}.
"""

import json
import sys
import threading

import cuda.bindings.driver as cuda
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack, make_fake_stream

from tests.user_kernels.scale import scale, scale_on_every_sm


def run_user_kernel(n: int, block: int, abi: str):
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    if abi == "tvm_ffi":
        compiled = cute.compile[cute.EnableTVMFFI(True)](
            scale,
            from_dlpack(x, assumed_align=16).mark_layout_dynamic(),
            from_dlpack(y, assumed_align=16).mark_layout_dynamic(),
            1.0,
            make_fake_stream(use_tvm_ffi_env_stream=True),
            block=block,
        )
        return compiled(x, y, 0.5)
    tensors = [from_dlpack(t, assumed_align=16).mark_layout_dynamic() for t in (x, y)]
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    compiled = cute.compile(scale, *tensors, 1.0, stream, block=block)
    return compiled(*tensors, 0.5, stream)


def run_on_every_sm():
    x = torch.randn(1 << 16, device="cuda")
    tensors = [from_dlpack(t, assumed_align=16).mark_layout_dynamic() for t in (x, x)]
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    return cute.compile(scale_on_every_sm, *tensors, 1.0, stream)(*tensors, 0.5, stream)


def questions():
    """What a virtual GPU cannot answer, each asked once."""
    x = torch.ones(4, device="cuda")
    yield "item", lambda: x.sum().item()
    yield "driver", lambda: cuda.cuModuleLoadData(b"")
    yield "timing", lambda: torch.cuda.Event(enable_timing=True).elapsed_time(torch.cuda.Event())
    yield "property", lambda: torch.cuda.get_device_properties(0).no_such_property


def main(argv: list[str]) -> None:
    for abi in ("tvm_ffi", "c"):
        for block in (128, 256):
            returned = run_user_kernel(1000, block, abi)
            print(json.dumps({"call": f"scale {abi} {block}", "returned": repr(returned)}))
    if "--every-sm" in argv:
        print(json.dumps({"call": "scale_on_every_sm", "returned": repr(run_on_every_sm())}))
    seen = {}
    worker = threading.Thread(target=lambda: seen.update(t=type(torch.empty(2, device="cuda"))))
    worker.start()
    worker.join()
    print(
        json.dumps(
            {
                "cpu": torch.arange(3).tolist(),
                "cuda_on_a_thread": seen["t"].__name__,
                "device": torch.cuda.get_device_name(),
                "capability": list(torch.cuda.get_device_capability(device=0)),
            }
        )
    )
    if "--ask" in argv:
        for question, ask in questions():
            try:
                ask()
                print(json.dumps({"question": question, "error": None}))
            except Exception as exc:
                print(
                    json.dumps(
                        {"question": question, "error": type(exc).__name__, "message": str(exc)}
                    )
                )


if __name__ == "__main__":
    main(sys.argv[1:])
