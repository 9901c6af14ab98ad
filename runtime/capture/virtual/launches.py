"""What a stubbed launch did to the values a virtual GPU knows: it may have written any memory
it was handed, so every CUDA tensor among its arguments holds values nobody computed. A
tensor-like argument that cannot be traced to its torch tensor (a DLPack capsule, a tensor of
another framework) may alias any of them: then nothing known is trusted any longer."""

from __future__ import annotations

from cute_aot.runtime.capture.virtual import known_values

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def wrote(args, kwargs) -> None:
    """Forget the values of everything a launch with these arguments could have written."""
    import torch

    pending = [*args, *kwargs.values()]
    while pending:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            if value.device.type == "cuda":
                known_values.forget(value)
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif hasattr(value, "__dlpack__") or hasattr(value, "__dlpack_device__"):
            known_values.forget_all()
            return
        elif not isinstance(value, _PLAIN) and _holds_memory(value):
            known_values.forget_all()
            return


def _holds_memory(value) -> bool:
    """Whether an argument of a compiled function can point at device memory (cute tensors
    and pointers do; streams, numbers and layouts do not)."""
    name = type(value).__name__.lower()
    return "tensor" in name or "pointer" in name or "ptr" in name
