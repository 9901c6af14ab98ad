"""RMSNorm as a cute-aot kernel family, pure-Python part: key, dispatch rule, reference.

    out[M, N] bf16 = x[M, N] * rsqrt(mean_j x[m, j]^2 + eps) * weight[N],  fp32 math.

One kernel (kernel.py): N, eps and the block size are compiled in, M is symbolic, so a bundle
holds one key per hidden size and serves every token count. This module never imports cutlass
(a server imports it on its call path) and imports torch only inside `reference`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from cute_aot.artifacts.core.errors import InputError, UnsupportedProblemError
from cute_aot.kernels.arch import normalize_arch
from cute_aot.kernels.contract import Dispatch, KernelFamily, TensorArg, parse_ints
from cute_aot.kernels.keys import KernelKey

FAMILY = "rmsnorm"
# Bump when the kernel's code generation changes in a way the key's other fields do not show.
FAMILY_VERSION = 1

DTYPE = "bfloat16"
ALIGN_BYTES = 16  # base addresses; N % 8 keeps every row 16-byte aligned too
N_DIVISOR = 8  # bf16 elements per 128-bit access
# The op takes no eps argument: the family serves one, the common one of Llama-style models.
EPS = 1e-6
# Registers hold a thread's share of the row (x and weight): at most this many 16-byte chunks.
MAX_CHUNKS_PER_THREAD = 4
WARP = 32
MAX_BLOCK = 1024
MAX_N = MAX_BLOCK * N_DIVISOR * MAX_CHUNKS_PER_THREAD  # 32768

# Hidden sizes of the default bundles: Llama-3-8B / Qwen3-8B class, DeepSeek-V3.
DEFAULT_SHAPES: tuple[tuple[int], ...] = ((4096,), (7168,))


@dataclass(frozen=True)
class RMSNormKey(KernelKey):
    """Everything that changes an RMSNorm binary (M is symbolic: not part of it)."""

    FAMILY = FAMILY

    n: int  # hidden size, compiled in
    eps: float
    block_size: int  # threads per CTA (one CTA per row)
    dtype: str = DTYPE  # of x, weight and out
    align_bytes: int = ALIGN_BYTES
    version: int = FAMILY_VERSION

    def describe(self) -> str:
        return f"n={self.n} block={self.block_size} eps={self.eps:g}"


class RMSNormProblem(NamedTuple):
    m: int
    n: int
    dtype: str = DTYPE


def check_problem(m: int, n: int, dtype: str = DTYPE) -> None:
    """Refuse what no RMSNorm kernel is built for, saying why."""
    if dtype != DTYPE:
        raise UnsupportedProblemError(f"{FAMILY} takes {DTYPE} x and weight, got {dtype}")
    if m < 1:
        raise UnsupportedProblemError(f"{FAMILY} needs M >= 1 rows, got M={m}")
    if n < N_DIVISOR or n % N_DIVISOR or n > MAX_N:
        raise UnsupportedProblemError(
            f"{FAMILY} needs N % {N_DIVISOR} == 0 and {N_DIVISOR} <= N <= {MAX_N}, got N={n}"
        )


def block_size_for(n: int) -> int:
    """The fewest whole warps that give each thread at most 4 chunks of the row."""
    chunks = n // N_DIVISOR
    warps = -(-chunks // (WARP * MAX_CHUNKS_PER_THREAD))
    return warps * WARP


@functools.lru_cache(maxsize=1024)
def _dispatch(n: int, dtype: str, arch: str) -> Dispatch:
    block = block_size_for(n)
    chunks = n // N_DIVISOR
    rounds = -(-chunks // block)
    tail = chunks % block
    last = f" (in the last, {tail} of {block} threads work)" if tail else ""
    reason = (
        f"N={n}: {chunks} chunks of 16 bytes per row; the fewest warps with <= "
        f"{MAX_CHUNKS_PER_THREAD} chunks per thread -> {block} threads, {rounds} rounds{last}; "
        f"M is symbolic (one kernel for every M); eps={EPS:g}; plain SIMT, same rule on {arch}"
    )
    return Dispatch(RMSNormKey(n, EPS, block, dtype), reason)


class RMSNormFamily(KernelFamily):
    """The family contract (cute_aot.kernels.contract) for RMSNorm."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = RMSNormKey
    archs = ("sm_90a", "sm_100a", "sm_103a")
    abi = (
        TensorArg("x", DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("weight", DTYPE, 1, align_bytes=ALIGN_BYTES),
        TensorArg("out", DTYPE, 2, align_bytes=ALIGN_BYTES, output=True),
    )
    builder = f"{__name__}.build"
    default_shapes = DEFAULT_SHAPES
    shape_syntax = "N"

    def problem(self, x, weight) -> RMSNormProblem:
        (m, n), (n_weight,) = x.shape, weight.shape
        if n != n_weight:
            raise InputError(f"{FAMILY}: x is [M, N={n}] but weight is [N={n_weight}]")
        if n % N_DIVISOR:
            raise InputError(f"{FAMILY}: N={n} must be a multiple of {N_DIVISOR}")
        if m == 0:
            raise InputError(f"{FAMILY}: x has no rows (shape {tuple(x.shape)})")
        return RMSNormProblem(m, n, str(x.dtype).removeprefix("torch."))

    def dispatch(self, problem, arch: str) -> Dispatch:
        problem = RMSNormProblem(*problem)
        arch = normalize_arch(arch)
        if arch not in self.archs:
            raise UnsupportedProblemError(f"{FAMILY} is not built for {arch}")
        check_problem(*problem)
        return _dispatch(problem.n, problem.dtype, arch)

    def problems(self, shape) -> Iterator[RMSNormProblem]:
        # M is symbolic: every token count dispatches to the same key, one M stands for all.
        (n,) = shape
        yield RMSNormProblem(1, n)

    def parse_shape(self, text: str) -> tuple[int]:
        (n,) = parse_ints(self, text, self.shape_syntax)
        check_problem(1, n)
        return (n,)

    def parse_problem(self, text: str, dtypes: str | None = None) -> RMSNormProblem:
        m, n = parse_ints(self, text, "M,N")
        dtype = (dtypes or DTYPE).split(",")[0].strip()
        return RMSNormProblem(m, n, dtype)

    def describe_problem(self, problem) -> dict[str, Any]:
        return RMSNormProblem(*problem)._asdict()

    def shapes_from_model(self, config: dict[str, Any]) -> list[tuple[int]]:
        """[(hidden_size,)] of a Hugging Face config; [] when it has none; refuses a hidden size
        no kernel of the family serves (the build should say so, not skip it)."""
        hidden = config.get("hidden_size")
        if not isinstance(hidden, int) or isinstance(hidden, bool):
            return []
        check_problem(1, hidden)
        return [(hidden,)]

    def shapes_from_torch_model(self, model) -> list[tuple[int]]:
        """(N,) of every RMSNorm layer of a loaded model (torch.nn.RMSNorm, Hugging Face
        *RMSNorm classes: found by class name) that this family can serve."""
        shapes = set()
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if not type(module).__name__.endswith("RMSNorm") or weight is None or weight.dim() != 1:
                continue
            n = weight.shape[0]
            if n % N_DIVISOR == 0 and N_DIVISOR <= n <= MAX_N:
                shapes.add((n,))
        return sorted(shapes)

    def input_shapes(self, problem) -> tuple[tuple[int, int], tuple[int]]:
        m, n = problem[0], problem[1]
        return (m, n), (n,)

    def output_shape(self, problem) -> tuple[int, int]:
        return problem[0], problem[1]

    def reference(self, x, weight):
        import torch

        xf = x.float()
        rstd = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + EPS)
        return (xf * rstd * weight.float()).to(torch.bfloat16)


family = RMSNormFamily()
Key = RMSNormKey
