"""Values a virtual GPU knows: what a CUDA tensor holds when the host put it there.

A fake CUDA tensor has a layout and no memory. Where its values come from the host
(`torch.tensor([...], device="cuda")`, `x.cuda()`, `torch.arange(n, device="cuda")`) or from torch
operations on such values, they are known exactly: the op runs a second time on CPU copies and the
result is kept beside the fake storage. So the metadata a workload reads back (lengths, offsets,
indices, masks: `.item()`, `.tolist()`, `if mask.any():`) answers as on a real GPU.

What stays unknown, so that reading it is still `Unanswerable`: anything a stubbed launch was
handed (it may have written any of its arguments), anything derived from an unknown value, the
contents of `torch.empty`, values drawn on the device (a CPU's generator is not the GPU's), what a
CUDA-graph capture writes (nothing is written until a replay, which launches nothing), and every
floating-point value: a CPU's rounding is not a GPU's, and what a recorder needs is metadata.

Memory stays bounded: values are kept per storage, only for integer and boolean storages of at
most `LIMIT_BYTES`, only while the fake storage lives (a weak table), and only where a tensor
covers its whole storage when it is first made known (so no byte of a kept storage is a guess).
"""

from __future__ import annotations

import threading

LIMIT_BYTES = 16 << 20  # per storage: a paged-KV page table of 4M int32 entries

_lock = threading.Lock()
_table = None  # fake UntypedStorage -> CPU UntypedStorage holding its bytes (weak keys)


def _storages():
    global _table
    if _table is None:
        from torch.utils.weak import WeakIdKeyDictionary

        _table = WeakIdKeyDictionary()
    return _table


def keepable(tensor) -> bool:
    """Whether values of this fake tensor's kind are kept at all."""
    dtype = tensor.dtype
    return not (dtype.is_floating_point or dtype.is_complex) and (
        tensor.untyped_storage().nbytes() <= LIMIT_BYTES
    )


def values(tensor):
    """The CPU tensor of `tensor`'s values (a view of its storage's copy), None if unknown."""
    import torch

    with _lock:
        host = _storages().get(tensor.untyped_storage())
    if host is None:
        return None
    return torch.empty(0, dtype=tensor.dtype).set_(
        host, tensor.storage_offset(), tensor.shape, tensor.stride()
    )


def known(tensor) -> bool:
    with _lock:
        return tensor.untyped_storage() in _storages()


def covers_storage(tensor) -> bool:
    """Whether `tensor`'s elements are exactly its storage's bytes (a fresh, dense tensor)."""
    return (
        tensor.storage_offset() == 0
        and tensor.numel() * tensor.element_size() == tensor.untyped_storage().nbytes()
        and _dense(tensor.shape, tensor.stride())
    )


def _dense(shape, strides) -> bool:
    """Whether a layout visits each element of a block of numel elements exactly once (a
    permutation of a contiguous layout)."""
    expected = 1
    for size, stride in sorted((s, t) for s, t in zip(shape, strides, strict=True) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def keep(fake, host) -> None:
    """Keep `host`'s values (a CPU tensor) as `fake`'s, where the rules above allow."""
    import torch

    if not (keepable(fake) and covers_storage(fake)) or host.shape != fake.shape:
        return
    storage = torch.UntypedStorage(fake.untyped_storage().nbytes())
    torch.empty(0, dtype=fake.dtype).set_(storage, 0, fake.shape, fake.stride()).copy_(host)
    with _lock:
        _storages()[fake.untyped_storage()] = storage


def start_blank(fake) -> bool:
    """Make `fake`'s storage known before an op overwrites all of it (`copy_`, `fill_`)."""
    import torch

    if not (keepable(fake) and covers_storage(fake)):
        return False
    with _lock:
        _storages()[fake.untyped_storage()] = torch.UntypedStorage(fake.untyped_storage().nbytes())
    return True


def forget(tensor) -> None:
    """`tensor`'s storage now holds values nobody computed (a launch or an unknown op wrote it)."""
    with _lock:
        _storages().pop(tensor.untyped_storage(), None)


def forget_all() -> None:
    """Something may have written any CUDA memory (a launch handed an untraceable tensor)."""
    with _lock:
        _storages().clear()
