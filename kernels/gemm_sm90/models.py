"""Hopper GEMM model shapes: the (N, K) of the dense layers the default bundles serve, and
those of a transformer read from its Hugging Face config (shapes_from_config, what
`shapes_from_model` answers).

Dispatch only: neither kernel.py nor build.py imports it. This module never imports cutlass or
torch.
"""

from __future__ import annotations

from typing import Any

from cute_aot.kernels.gemm_sm90.keys import FP8_FAMILY, GemmProblem, check_problem
from cute_aot.kernels.gemm_sm90.resources import BF16_DTYPE, FP8_DTYPE

# (N, K) of the dense layers the default bundles serve (fused QKV and gate-up as served).
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = (
    # Llama-3-8B: hidden 4096, 32 q / 8 kv heads of 128, intermediate 14336
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    # Llama-3-70B: hidden 8192, 64 q / 8 kv heads of 128, intermediate 28672
    (10240, 8192),
    (8192, 8192),
    (57344, 8192),
    (8192, 28672),
    # Qwen3-32B: hidden 5120, 64 q / 8 kv heads of 128, intermediate 25600
    (10240, 5120),
    (5120, 8192),
    (51200, 5120),
    (5120, 25600),
    # DeepSeek-V3 dense MLP (first 3 layers): hidden 7168, intermediate 18432; shared expert
    # (intermediate 2048); MLA projections (q_lora 1536, kv_lora 512, 128 heads of 128 + 64 rope)
    (36864, 7168),
    (7168, 18432),
    (4096, 7168),
    (7168, 2048),
    (1536, 7168),
    (24576, 1536),
    (576, 7168),
    (32768, 512),
    (7168, 16384),
)


def shapes_from_config(config: dict[str, Any], family: str) -> list[tuple[int, int]]:
    """(N, K) of a transformer's dense projections: attention (QKV and O, or MLA's low-rank
    projections), the dense MLP (gate-up, down) and shared experts (gate-up, down)."""
    hidden = config.get("hidden_size")
    if not _positive(hidden):
        return []
    shapes = _attention_shapes(config, hidden)
    for width in (
        config.get("intermediate_size"),
        _product(config.get("n_shared_experts"), config.get("moe_intermediate_size")),
    ):
        if _positive(width):
            shapes += [(2 * width, hidden), (hidden, width)]
    dtype = FP8_DTYPE if family == FP8_FAMILY else BF16_DTYPE
    unique = list(dict.fromkeys(shapes))
    for n, k in unique:
        check_problem(GemmProblem(1, n, k, dtype), family)
    return unique


def _attention_shapes(config: dict[str, Any], hidden: int) -> list[tuple[int, int]]:
    heads = config.get("num_attention_heads")
    if not _positive(heads):
        return []
    kv_rank, q_rank = config.get("kv_lora_rank"), config.get("q_lora_rank")
    if _positive(kv_rank):  # multi-head latent attention (DeepSeek-V2/V3)
        nope, rope = config.get("qk_nope_head_dim"), config.get("qk_rope_head_dim")
        v_dim = config.get("v_head_dim")
        if not all(_positive(v) for v in (nope, rope, v_dim)):
            return []
        q_head = heads * (nope + rope)
        shapes = [(q_rank, hidden), (q_head, q_rank)] if _positive(q_rank) else [(q_head, hidden)]
        return shapes + [
            (kv_rank + rope, hidden),  # kv_a (with the shared rope key)
            (heads * (nope + v_dim), kv_rank),  # kv_b
            (hidden, heads * v_dim),  # o
        ]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    if not all(_positive(v) for v in (kv_heads, head_dim)):
        return []
    q = heads * head_dim
    return [(q + 2 * kv_heads * head_dim, hidden), (hidden, q)]


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _product(*values):
    return values[0] * values[1] if all(_positive(v) for v in values) else None
