"""One process, every GPU: a bundle serves kernels on the tensor's device and its current stream.

Written for any number of GPUs: with one GPU these run the single-device path (explicit device
indices, two threads); with two or more, tensors alternate between devices.
"""

import threading

import pytest

torch = pytest.importorskip("torch")

from tests.test_router_gemm_gpu import _bundles_loaded, _check  # noqa: E402

pytestmark = pytest.mark.gpu


def _devices():
    return list(range(torch.cuda.device_count()))


def _on(device, m=8, k=7168, n=256, seed=0):
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(seed + 31 * m + device)
    x = torch.randn(m, k, device=f"cuda:{device}", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device=f"cuda:{device}", generator=gen) * 0.05).to(torch.bfloat16)
    return x, w


def test_alternating_devices_give_right_answers_on_each():
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    for round_ in range(3):
        for device in _devices():
            for m in (1, 4, 8, 16):
                x, w = _on(device, m=m, seed=round_)
                out = router_gemm(x, w)
                assert out.device == x.device
                torch.cuda.synchronize(device)
                _check(out, x, w)


def test_two_threads_on_devices():
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    devices = _devices()
    targets = [devices[i % len(devices)] for i in range(2)]
    errors = []

    def work(device):
        try:
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
            with torch.cuda.stream(stream):
                for m in range(1, 17):
                    x, w = _on(device, m=m)
                    out = router_gemm(x, w)
                    stream.synchronize()
                    _check(out, x, w)
        except Exception as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(device,)) for device in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_cuda_graph_on_each_device():
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    for device in _devices():
        with torch.cuda.device(device):
            x, w = _on(device, m=12)
            eager = router_gemm(x, w)
            out = torch.empty_like(eager)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                router_gemm(x, w, out=out)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                router_gemm(x, w, out=out)
            out.zero_()
            graph.replay()
            torch.cuda.synchronize(device)
            assert torch.equal(out, eager)


def test_tensors_on_two_devices_are_refused():
    from cute_aot.artifacts.errors import InputError
    from cute_aot.runtime import router_gemm

    if len(_devices()) < 2:
        pytest.skip("needs two GPUs")
    _bundles_loaded()
    x, _ = _on(0)
    _, w = _on(1)
    with pytest.raises(InputError, match="cuda:0 but w is on cuda:1"):
        router_gemm(x, w)
