"""A kernel object whose state holds classes, as FlashInfer's GDN prefill kernels do: their
compile key (KeyedCompileMixin.manual_cache_key) starts with the class's MRO."""

import cutlass
import cutlass.cute as cute


class KeyedScale:
    def __init__(self, block: int):
        self.block = block
        self._compile_key = (type(self).__mro__, ("block", block))

    def __call__(self, x: cute.Tensor, n: cutlass.Int32):  # described only, never traced here
        raise NotImplementedError


class StateScale:
    """A kernel object of plain state and a dtype class, as FlashInfer's norm kernels are."""

    def __init__(self, block: int, eps: float, dtype=cutlass.Float32):
        self.block, self.eps, self.dtype = block, eps, dtype

    def __call__(self, x: cute.Tensor, n: cutlass.Int32):  # described only, never traced here
        raise NotImplementedError
