"""Warm-up: resolve kernels before serving, so a miss compiles at start-up, not mid-request."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from cute_aot.kernels.router_gemm import MAX_TOKENS
from cute_aot.runtime.ops import resolve_router_gemm

# MoE router weights: DeepSeek/Qwen/Mixtral `...mlp.gate.weight`, gpt-oss `...router.weight`,
# DeepSeek-V3 `gate.weight`; never the dense MLP's `gate_proj` / `gate_up_proj`.
_GATE_NAME = re.compile(r"(^|\.)(gate|router)\.weight$")


def preload(problems: Iterable[tuple[int, int, int]], device: int | None = None) -> int:
    """Resolve router_gemm for each (M, K, N) on `device` (default: current); returns the count."""
    device = torch.cuda.current_device() if device is None else device
    count = 0
    for m, k, n in problems:
        resolve_router_gemm(m, k, n, device)
        count += 1
    return count


def router_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(K, N) of every MoE gate in `model`: 2-D bf16 weights named like a router."""
    shapes = []
    for name, parameter in model.named_parameters():
        if (
            _GATE_NAME.search(name)
            and parameter.dim() == 2
            and parameter.dtype == torch.bfloat16
            and parameter.shape[1] % 8 == 0
        ):
            shape = (int(parameter.shape[1]), int(parameter.shape[0]))
            if shape not in shapes:
                shapes.append(shape)
    return shapes


def preload_model(model: torch.nn.Module, max_tokens: int = MAX_TOKENS, device=None) -> list:
    """Preload every router shape of `model` for 1..max_tokens tokens; [] when it has no gates."""
    shapes = router_shapes(model)
    preload(((m, k, n) for k, n in shapes for m in range(1, max_tokens + 1)), device)
    return shapes
