"""The gated delta rule, one decode step, in fp32 torch (the GDN family's reference).

Per batch row b and value head j (q/k head i = j // (HV / H)), with K-major state S [K, V]:
    g    = exp(-exp(A_log[j]) * softplus(a[b, j] + dt_bias[j]))    decay
    beta = sigmoid(b[b, j])                                         write strength
    q, k = l2norm(q[b, i]) * scale, l2norm(k[b, i])                 (l2norm when asked)
    S    = g * S
    S   += outer(k, beta * (v[b, j] - k @ S))                       delta rule
    o    = q @ S
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale=None, use_qk_l2norm=True):
    """q, k [B, 1, H, K]; v [B, 1, HV, V]; state [B, HV, K, V] fp32; A_log, dt_bias [HV];
    a, b [B, 1, HV]. Returns (output [B, 1, HV, V] bf16, new state [B, HV, K, V] fp32)."""
    batch, _, heads, dim_k = q.shape
    value_heads = v.shape[2]
    scale = dim_k**-0.5 if scale is None else scale
    repeat = value_heads // heads
    q = q[:, 0].float().repeat_interleave(repeat, dim=1)  # [B, HV, K]
    k = k[:, 0].float().repeat_interleave(repeat, dim=1)
    if use_qk_l2norm:
        q = F.normalize(q, dim=-1, eps=1e-6)
        k = F.normalize(k, dim=-1, eps=1e-6)
    q = q * scale
    decay = torch.exp(-torch.exp(A_log.float()) * F.softplus(a[:, 0].float() + dt_bias.float()))
    beta = torch.sigmoid(b[:, 0].float())  # [B, HV]
    new_state = state.float() * decay[..., None, None]
    predicted = torch.einsum("bhk,bhkv->bhv", k, new_state)
    delta = beta[..., None] * (v[:, 0].float() - predicted)
    new_state = new_state + k[..., :, None] * delta[..., None, :]
    output = torch.einsum("bhk,bhkv->bhv", q, new_state)
    return output[:, None].to(torch.bfloat16), new_state


def example_inputs(problem, device="cuda", seed: int = 0) -> dict:
    """Random arguments of gated_delta_rule_decode for a GDN problem (GdnProblem fields), as a
    model's decode step would pass them: unit-scale activations, a decaying state."""
    generator = torch.Generator(device=device).manual_seed(seed)
    batch, t, heads, value_heads, dim_k, dim_v = problem[:6]
    dtypes = [getattr(torch, name) for name in problem[6]]
    state_dtype, a_log_dtype, a_dtype, dt_bias_dtype, q_dtype, k_dtype, v_dtype, b_dtype, _ = dtypes

    def randn(*shape, dtype):
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    return {
        "q": randn(batch, t, heads, dim_k, dtype=q_dtype),
        "k": randn(batch, t, heads, dim_k, dtype=k_dtype),
        "v": randn(batch, t, value_heads, dim_v, dtype=v_dtype),
        "state": randn(batch, value_heads, dim_k, dim_v, dtype=state_dtype) * 0.1,
        "A_log": randn(value_heads, dtype=a_log_dtype) * 0.5,
        "a": randn(batch, t, value_heads, dtype=a_dtype),
        "dt_bias": randn(value_heads, dtype=dt_bias_dtype),
        "b": randn(batch, t, value_heads, dtype=b_dtype),
    }
