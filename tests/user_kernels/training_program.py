"""An unmodified program of the kind real test suites are: integer devices, views made contiguous,
an autograd Function whose forward and backward each launch the user kernel
(tests/user_kernels/scale.py; block 128 forward, 256 backward), host reads of index tensors, a
numeric check mid-way followed by a kernel (block 64), an `assert torch.equal` of launch outputs
followed by a kernel (block 32), a CUDA-graph capture that launches the kernel (block 512), a
`torch.compile(fullgraph=True)` region that calls it as a custom op (block 1024), and an op whose
CUDA kernel is registered with `Library.impl`, as vLLM registers its ops (block 384). It imports
nothing of cute-aot. Each case prints one JSON line,
{"case": ..., "ok": true, ...} or {"case": ..., "ok": false, "error": type, "message": ...};
a failing case does not stop the rest.

    python -m tests.user_kernels.training_program
"""

import json
import sys
import traceback

import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream

from tests.user_kernels.scale import scale


def launch(x: torch.Tensor, block: int) -> torch.Tensor:
    """y = x * 0.5 by the user kernel (TVM-FFI, torch tensors, the current stream)."""
    y = torch.empty_like(x)
    compiled = cute.compile[cute.EnableTVMFFI(True)](
        scale,
        cute.runtime.from_dlpack(x, assumed_align=16).mark_layout_dynamic(),
        cute.runtime.from_dlpack(y, assumed_align=16).mark_layout_dynamic(),
        1.0,
        make_fake_stream(use_tvm_ffi_env_stream=True),
        block=block,
    )
    compiled(x, y, 0.5)
    return y


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return launch(x.detach(), 128)

    @staticmethod
    def backward(ctx, grad):
        return launch(grad.contiguous(), 256)


def integer_device():
    x, y = torch.randn(4, 8).to(0), torch.randn(4, 8, device=0)
    return {"devices": [str(x.device), str(y.device), str(torch.device(0))]}


def contiguous_view():
    q = torch.randn(2, 8, 4, device="cuda").transpose(0, 1)
    c = q.contiguous()
    return {"shape": list(c.shape), "contiguous": [q.is_contiguous(), c.is_contiguous()]}


def backward():
    x = torch.randn(1024, device="cuda", requires_grad=True)
    Scale.apply(x).sum().backward()
    return {"grad": [list(x.grad.shape), str(x.grad.device)]}


def host_made_index():
    seq_lens = torch.tensor([3, 9, 4], dtype=torch.int32, device="cuda")
    offsets = torch.nn.functional.pad(torch.cumsum(seq_lens, 0, dtype=torch.int32), (1, 0))
    return {
        "max": seq_lens.max().item(),
        "offsets": offsets.tolist(),
        "any_long": bool((seq_lens > 8).any()),
    }


def stub_output():
    counts = torch.zeros(1024, dtype=torch.int32, device="cuda")
    launch(counts.float(), 128)
    return {"read": launch(counts.view(torch.float32), 128).view(torch.int32)[0].item()}


def check_then_next_kernel():
    y = launch(torch.randn(1024, device="cuda"), 128)
    torch.testing.assert_close(y, torch.zeros_like(y))  # numbers nobody computed
    assert (y - 0.5 * y).abs().max() < 1e-3  # an assert statement on them
    launch(torch.randn(2048, device="cuda"), 64)
    return {"after_the_check": True}


def equal_check_then_next_kernel():
    x = torch.randn(1024, device="cuda")
    assert torch.equal(launch(x, 128), launch(x, 128))  # a check of values nobody computed
    launch(x, 32)
    return {"after_the_check": True}


@torch.library.custom_op("cute_aot_training::halve", mutates_args=())
def halve(x: torch.Tensor) -> torch.Tensor:
    return launch(x, 1024)


@halve.register_fake
def _(x):
    return torch.empty_like(x)


def compiled_region():
    compiled = torch.compile(lambda x: halve(x + 1) * 2, fullgraph=True)
    y = compiled(torch.randn(4096, device="cuda"))
    return {"shape": list(y.shape), "device": str(y.device)}


# vLLM's way (direct_register_custom_op): a library fragment, the op's CUDA kernel and its fake
SERVING = torch.library.Library("cute_aot_serving", "FRAGMENT")
SERVING.define("quarter(Tensor x) -> Tensor")
SERVING.impl("quarter", lambda x: launch(x, 384), "CUDA")
torch.library.register_fake("cute_aot_serving::quarter", torch.empty_like, lib=SERVING)


def library_kernel():
    y = torch.ops.cute_aot_serving.quarter(torch.randn(4096, device="cuda"))
    return {"shape": list(y.shape), "device": str(y.device)}


def graph_capture():
    x = torch.randn(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capturing = torch.cuda.is_current_stream_capturing()
        launch(x, 512)
    graph.replay()
    return {"capturing": capturing, "after": torch.cuda.is_current_stream_capturing()}


CASES = [
    integer_device,
    contiguous_view,
    backward,
    host_made_index,
    stub_output,
    check_then_next_kernel,
    equal_check_then_next_kernel,
    graph_capture,
    compiled_region,
    library_kernel,
]


def main(argv: list[str]) -> None:
    for case in CASES:
        try:
            line = {"case": case.__name__, "ok": True, **case()}
        except Exception as exc:
            traceback.print_exc()
            line = {"case": case.__name__, "ok": False}
            line.update(error=type(exc).__name__, message=str(exc)[:400])
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
