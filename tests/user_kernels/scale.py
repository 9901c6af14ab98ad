"""y[i] = x[i] * factor over a 1-D fp32 tensor: a user's kernel, one thread per element."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute


@cute.kernel
def _scale_kernel(x: cute.Tensor, y: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32,
                  block: cutlass.Constexpr):  # fmt: skip
    thread, _, _ = cute.arch.thread_idx()
    cta, _, _ = cute.arch.block_idx()
    i = cta * block + thread
    if i < n:
        y[i] = x[i] * factor


@cute.jit
def scale(x: cute.Tensor, y: cute.Tensor, factor: cutlass.Float32, stream: cuda.CUstream,
          block: cutlass.Constexpr = 128):  # fmt: skip
    n = cute.size(x, mode=[0])
    _scale_kernel(x, y, factor, n, block).launch(
        grid=[(n + block - 1) // block, 1, 1], block=[block, 1, 1], stream=stream
    )


@cute.jit
def scale_on_every_sm(
    x: cute.Tensor, y: cute.Tensor, factor: cutlass.Float32, stream: cuda.CUstream
):
    """The same kernel, one CTA per SM: its trace asks the GPU how many SMs it has (a hardware
    query a replay on a CPU must answer from the record)."""
    sm_count = cutlass.utils.HardwareInfo().get_device_multiprocessor_count()
    n = cute.size(x, mode=[0])
    _scale_kernel(x, y, factor, n, 128).launch(
        grid=[sm_count, 1, 1], block=[128, 1, 1], stream=stream
    )
