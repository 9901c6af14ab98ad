"""One process, every GPU: a kernel runs on its tensors' device, on that device's current stream,
and leaves the caller's current device alone.

Written for any number of GPUs: tests that need two skip on one, saying so. Root cause of the
"empty CUDA graph" once seen here: torch.cuda.graph's default capture stream is process-wide and
lives on whichever device was current at the first capture, so a capture for another device must
pass `stream=` a stream of that device; torch's own ops behave the same way (see docs/serving.md).
"""

import threading

import pytest

torch = pytest.importorskip("torch")

from tests.test_router_gemm_gpu import _bundles_loaded, _check  # noqa: E402

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 100_000_000  # ~50 ms of GPU time on the producer stream


def _devices():
    return list(range(torch.cuda.device_count()))


def _needs_two():
    if len(_devices()) < 2:
        pytest.skip(f"needs two GPUs, this machine has {len(_devices())}")


def _on(device, m=8, k=7168, n=256, seed=0):
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(seed + 31 * m + device)
    x = torch.randn(m, k, device=f"cuda:{device}", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device=f"cuda:{device}", generator=gen) * 0.05).to(torch.bfloat16)
    return x, w


def _current_devices():
    """(torch's current device, the CUDA driver's current context's device): a call that leaves
    another device current would break every later torch call on this thread."""
    from cuda.bindings import driver

    _, context = driver.cuCtxGetCurrent()
    context_device = None
    if int(context):
        _, context_device = driver.cuCtxGetDevice()
        context_device = int(context_device)
    return torch.cuda.current_device(), context_device


def test_alternating_devices_give_right_answers_and_keep_the_current_device():
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    for round_ in range(3):
        for device in _devices():
            for m in (1, 4, 8, 16):
                x, w = _on(device, m=m, seed=round_)
                before = _current_devices()
                out = router_gemm(x, w)
                assert _current_devices() == before
                assert out.device == x.device
                torch.cuda.synchronize(device)
                _check(out, x, w)


@pytest.mark.parametrize("m", [2, 12], ids=["dot", "splitk"])
def test_launch_is_ordered_on_the_devices_current_stream(m):
    """A producer writes x on a side stream; the op follows on that stream; only that stream is
    synchronized. A launch on any other stream would read x before the producer wrote it."""
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    for device in _devices():
        x, w = _on(device, m=m)
        fresh = _on(device, m=m, seed=1)[0]
        torch.cuda.synchronize(device)
        side = torch.cuda.Stream(device=device)
        with torch.cuda.device(device), torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.copy_(fresh)
            out = router_gemm(x, w)
        side.synchronize()
        _check(out, fresh, w)


def test_current_device_differs_from_the_tensors_device():
    """torch.cuda.set_device(0), tensors on another GPU whose current stream is a side stream:
    the kernel runs on that GPU, on that stream, and device 0 stays current."""
    from cute_aot.runtime import router_gemm

    _needs_two()
    _bundles_loaded()
    for device in _devices()[1:]:
        x, w = _on(device, m=12)
        fresh = _on(device, m=12, seed=2)[0]
        torch.cuda.synchronize(device)
        side = torch.cuda.Stream(device=device)
        try:
            torch.cuda.set_stream(side)  # makes `device` current, with `side` its stream
            torch.cuda._sleep(SLEEP_CYCLES)
            x.copy_(fresh)
            torch.cuda.set_device(0)  # device 0 current again; `device` keeps `side`
            assert torch.cuda.current_stream(device) == side
            before = _current_devices()
            assert before == (0, 0)
            out = router_gemm(x, w)
            assert _current_devices() == before
            side.synchronize()
            _check(out, fresh, w)
        finally:
            torch.cuda.set_stream(torch.cuda.default_stream(device))
            torch.cuda.set_device(0)


def test_cuda_graph_capture_and_bitwise_replay_on_each_device():
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    for device in _devices():
        with torch.cuda.device(device):
            x, w = _on(device, m=12)
            eager = router_gemm(x, w)
            out = torch.empty_like(eager)
            # warm up on a side stream, as torch's graph docs ask
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                router_gemm(x, w, out=out)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # A capture stream of this device: torch's default one is shared by the process
            # and lives on the device current at the first capture.
            with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
                router_gemm(x, w, out=out)
            out.zero_()
            graph.replay()
            torch.cuda.synchronize(device)
            assert torch.equal(out, eager)


def test_threads_on_every_device():
    from cute_aot.runtime import router_gemm

    _bundles_loaded()
    devices = _devices()
    targets = [devices[i % len(devices)] for i in range(max(2, len(devices)))]
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
            assert _current_devices() == (device, device)
        except Exception as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(device,)) for device in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_tensors_on_two_devices_are_refused():
    from cute_aot.artifacts.core.errors import InputError
    from cute_aot.runtime import router_gemm

    _needs_two()
    _bundles_loaded()
    x, _ = _on(0)
    _, w = _on(1)
    with pytest.raises(InputError, match="x is on cuda:0, w is on cuda:1"):
        router_gemm(x, w)
