"""The torch operations real workloads perform, one after another, on a virtual GPU: run it under
CUTE_AOT_VIRTUAL on each build of torch (the CPU build, a CUDA build with no driver) and compare
the lines. Each line says what the operation gave, or which error it raised; nothing stops it.

    CUTE_AOT_VIRTUAL=h200 python benchmarks/virtual_torch_ops.py
"""

import torch


def probes():
    lens = torch.tensor([3, 5, 7], dtype=torch.int32, device="cuda")
    yield "integer device", lambda: [str(torch.randn(2).to(0).device), str(torch.device(0))]
    yield "contiguous view", lambda: torch.randn(4, 8, device="cuda")[:, :4].contiguous().shape
    yield "backward", backward
    yield "item of host-made", lambda: [lens.max().item(), torch.cumsum(lens, 0).tolist()]
    yield "control flow", lambda: bool((lens > 4).any())
    yield "nonzero of host-made", lambda: torch.nonzero(lens > 4).shape
    yield "copy to host", lambda: torch.arange(5, device="cuda").cpu()
    yield "random on device", lambda: torch.randint(0, 9, (3,), device="cuda")[0].item()
    yield "float read", lambda: torch.ones(3, device="cuda").sum().item()
    yield (
        "assert_close of unknown",
        lambda: torch.testing.assert_close(
            torch.randn(3, device="cuda"), torch.randn(3, device="cuda")
        ),
    )
    yield "graph capture", capture
    yield "stream", lambda: _on_stream(lens)


def backward():
    x = torch.randn(4, 8, device="cuda", requires_grad=True)
    (x * 2).sum().backward()
    return [list(x.grad.shape), str(x.grad.device)]


def capture():
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capturing = torch.cuda.is_current_stream_capturing()
    graph.replay()
    return capturing


def _on_stream(lens):
    with torch.cuda.stream(torch.cuda.Stream()):
        return (lens + 1).tolist()


def main():
    print(f"torch {torch.__version__}")
    for name, probe in probes():
        try:
            print(f"{name}: {probe()}")
        except Exception as exc:
            print(f"{name}: {type(exc).__name__}: {str(exc)[:100]}")


if __name__ == "__main__":
    main()
