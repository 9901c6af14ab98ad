"""Router GEMM family, pure-Python part: key, dispatch rule, tuned tables, key enumeration.

out[M, N] fp32 = x[M, K] bf16 @ w[N, K]^T bf16, M = 1..16 tokens, N = experts. Two kernels:
``dot`` (one CTA per expert, M and K compiled in) and ``splitk`` (cluster split-K, all sizes
symbolic). This module never imports cutlass: the server imports it on every call path.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources

from cute_aot.artifacts.errors import UnsupportedProblemError
from cute_aot.kernels.arch import arch_family, normalize_arch
from cute_aot.kernels.keys import KernelKey

FAMILY = "router_gemm"
# Bump when a kernel's code generation changes in a way the other key fields do not capture.
FAMILY_VERSION = 1

X_DTYPE, W_DTYPE, OUT_DTYPE = "bfloat16", "bfloat16", "float32"
ALIGN_BYTES = 16  # every tensor's base address; K % 8 keeps every row 16-byte aligned too
K_DIVISOR = 8
MAX_TOKENS = 16

# (K, N) of the models the default bundles serve: DeepSeek-V3/V3.2, DeepSeek-V4-Pro,
# DeepSeek-V4-Flash, GLM-5.2.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((7168, 256), (7168, 384), (4096, 256), (6144, 256))


@dataclass(frozen=True)
class RouterGemmKey(KernelKey):
    """Everything that changes a router GEMM binary. Unused fields are 0 for a backend."""

    FAMILY = FAMILY

    backend: str  # "dot" | "splitk"
    m: int  # dot: tokens compiled in; splitk: 0 (symbolic)
    k: int  # dot: hidden size compiled in; splitk: 0 (symbolic, K % 8 == 0)
    block_size: int  # dot: threads per CTA; splitk: 0
    split_k: int  # splitk: CTAs per cluster along K; dot: 0
    num_stages: int  # splitk: shared-memory pipeline depth; dot: 0
    pdl: bool
    x_dtype: str = X_DTYPE
    w_dtype: str = W_DTYPE
    out_dtype: str = OUT_DTYPE
    align_bytes: int = ALIGN_BYTES
    version: int = FAMILY_VERSION

    def describe(self) -> str:
        if self.backend == "dot":
            return f"dot m={self.m} k={self.k} block={self.block_size} pdl={int(self.pdl)}"
        return f"splitk split_k={self.split_k} stages={self.num_stages} pdl={int(self.pdl)}"


@functools.cache
def tuned_tables() -> dict:
    text = resources.files(__package__).joinpath("tuned.json").read_text()
    return json.loads(text)


def _override(entries: list[dict], m: int, k: int, n: int) -> dict | None:
    for entry in entries:
        if entry["k"] == k and entry["n"] == n and m in entry["m"]:
            return entry
    return None


def check_problem(m: int, k: int, n: int, x_dtype: str = X_DTYPE, w_dtype: str = W_DTYPE) -> None:
    """Refuse problems no router GEMM kernel is built for, with the reason."""
    if (x_dtype, w_dtype) != (X_DTYPE, W_DTYPE):
        raise UnsupportedProblemError(
            f"router_gemm takes {X_DTYPE} x and w, got x {x_dtype} and w {w_dtype}"
        )
    if not 1 <= m <= MAX_TOKENS:
        raise UnsupportedProblemError(f"router_gemm serves 1..{MAX_TOKENS} tokens, got M={m}")
    if k < K_DIVISOR or k % K_DIVISOR:
        raise UnsupportedProblemError(
            f"router_gemm needs K % {K_DIVISOR} == 0 and K > 0, got K={k}"
        )
    if n < 1:
        raise UnsupportedProblemError(f"router_gemm needs N >= 1 experts, got N={n}")


@functools.lru_cache(maxsize=4096)
def dispatch(
    m: int, k: int, n: int, arch: str, x_dtype: str = X_DTYPE, w_dtype: str = W_DTYPE
) -> RouterGemmKey:
    """The one rule mapping a problem to a key. Build-time enumeration calls this too."""
    check_problem(m, k, n, x_dtype, w_dtype)
    tables = tuned_tables()
    defaults = tables["defaults"]
    table = tables[arch_family(arch)]
    pdl = bool(defaults["pdl"])
    if m <= defaults["dot_max_m"] or k < defaults["dot_below_k"]:
        entry = _override(table["dot_block_size"], m, k, n)
        block_size = entry["block_size"] if entry else defaults["block_size"]
        return RouterGemmKey("dot", m, k, block_size, 0, 0, pdl)
    entry = _override(table["split_k"], m, k, n) or defaults
    return RouterGemmKey("splitk", 0, 0, 0, entry["split_k"], entry["num_stages"], pdl)


def problems(shapes: Iterable[tuple[int, int]] = DEFAULT_SHAPES) -> Iterator[tuple[int, int, int]]:
    """Every (M, K, N) a server can ask for with these (K, N) weight shapes."""
    for k, n in shapes:
        for m in range(1, MAX_TOKENS + 1):
            yield m, k, n


def enumerate_keys(
    arch: str, shapes: Iterable[tuple[int, int]] = DEFAULT_SHAPES
) -> list[RouterGemmKey]:
    """The distinct keys that dispatch yields for these shapes: exactly what a server will ask for."""
    arch = normalize_arch(arch)
    keys = {dispatch(m, k, n, arch) for m, k, n in problems(shapes)}
    return sorted(keys, key=lambda key: key.canonical_json())


Key = RouterGemmKey  # the family contract: every family names its key class `Key`
