"""Hopper GEMM keys: the problem a call asks for, the key its binary is built from (every field
a compile-time choice of kernel.py), and the checks that refuse either.

build.py refuses a key with check_key before compiling; dispatch.py and the family build keys
(stages from resources.stages_for). This module never imports cutlass or torch: servers import
it on every call path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.gemm_sm90.resources import (
    BF16_DTYPE,
    ELEMENT_BYTES,
    FP8_DTYPE,
    SPLITS,
    accumulator_budget,
    accumulators_per_thread,
    can_promote,
    stages_for,
)
from cute_aot.kernels.keys import KernelKey

FAMILY = "gemm_sm90"
FP8_FAMILY = "gemm_sm90_fp8"
# Bump when the kernel's code generation changes in a way the other key fields do not capture.
FAMILY_VERSION = 2  # 2: swap-AB, split-K in distributed smem, fp8 promotion, persistent grid
OUT_DTYPE = "bfloat16"
ALIGN_BYTES = 16  # TMA: every base address and every row (K * element size) 16-byte aligned
K_DIVISOR = {dtype: ALIGN_BYTES // size for dtype, size in ELEMENT_BYTES.items()}  # 8 / 16
ARCHS = ("sm_90a",)
# Swap-AB puts M on the wgmma's N side: the narrowest of these that holds M (kernel.py).
SWAP_TILE_N: tuple[int, ...] = (8, 16, 32, 64)
RASTER_M = 8  # a wave of ~132 CTAs covers 8 M tiles x ~16 N tiles (an L2-sized block)
PDL = True


def swap_tile_n(m: int) -> int:
    return next((t for t in SWAP_TILE_N if t >= m), SWAP_TILE_N[-1])


@dataclass(frozen=True)
class GemmSm90Key(KernelKey):
    """Everything that changes a Hopper GEMM binary; M, N and K are symbolic (not in the key)."""

    FAMILY = FAMILY

    dtype: str  # x and w: "bfloat16" | "float8_e4m3fn"
    has_bias: bool
    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    stages: int
    pdl: bool
    raster_m: int = RASTER_M  # M tiles per raster group (kernel.py: _tile_of)
    aligned_n: bool = True  # N % 8 == 0: 16-byte stores of a tile staged in shared memory
    swap_ab: bool = False  # the kernel computes out^T = w @ x^T: tile_m along N, tile_n along M
    split_k: int = 1  # CTAs (a 1x1xS cluster) per output tile, reduced in distributed smem
    promote: bool = False  # fp8: each k-tile's sum added to fp32 accumulators (kernel.py)
    persistent: bool = False  # at most 132 CTAs, each walking tiles; epilogue under next loads
    pingpong: bool = False  # persistent: two warpgroups own alternate tiles (kernel.py)
    out_dtype: str = OUT_DTYPE
    align_bytes: int = ALIGN_BYTES
    version: int = FAMILY_VERSION

    def describe(self) -> str:
        return (
            f"{self.dtype} tile {self.tile_m}x{self.tile_n} cluster {self.cluster_m}x"
            f"{self.cluster_n} stages={self.stages} raster={self.raster_m} "
            f"bias={int(self.has_bias)}"
            f" pdl={int(self.pdl)}{'' if self.aligned_n else ' any-N'}"
            f"{' swap-AB' if self.swap_ab else ''}"
            f"{f' split-K {self.split_k}' if self.split_k > 1 else ''}"
            f"{' promoted' if self.promote else ''}"
            f"{' persistent' if self.persistent else ''}"
            f"{' ping-pong' if self.pingpong else ''}"
        )


@dataclass(frozen=True)
class GemmSm90Fp8Key(GemmSm90Key):
    """The fp8 family's key: the same fields, its own family name (and so its own ids)."""

    FAMILY = FP8_FAMILY


def check_key(key: GemmSm90Key, arch: str) -> None:
    """Refuse a key the kernel cannot be built for (build.py calls this before compiling)."""
    if arch not in ARCHS:
        raise UnsupportedProblemError(f"{key.FAMILY}: built for {', '.join(ARCHS)}, not {arch}")
    if key.dtype not in ELEMENT_BYTES or key.out_dtype != OUT_DTYPE:
        raise UnsupportedProblemError(f"{key.FAMILY}: key {key.describe()} has unknown dtypes")
    if key.align_bytes != ALIGN_BYTES:
        raise UnsupportedProblemError(f"{key.FAMILY}: align_bytes must be {ALIGN_BYTES}")
    why = tactic_refusal(key)
    if why:
        raise UnsupportedProblemError(f"{key.FAMILY}: key {key.describe()}: {why}")


def tactic_refusal(key: GemmSm90Key) -> str | None:
    """Why the kernel cannot build this combination (kernel.py checks the same), or None."""
    if key.split_k not in SPLITS:
        return f"split_k must be one of {SPLITS}"
    if key.split_k > 1 and (key.cluster_m, key.cluster_n) != (1, 1):
        return "split-K takes the cluster for K: cluster must be 1x1"
    if (key.swap_ab or key.split_k > 1) and not key.aligned_n:
        return "swap-AB and split-K need N % 8 == 0"
    if key.swap_ab and key.tile_n not in SWAP_TILE_N:
        return f"swap-AB tiles M by one of {SWAP_TILE_N}"
    rows = key.tile_n if key.swap_ab else key.tile_m
    if rows % key.split_k:
        return f"split_k={key.split_k} must divide the out tile's {rows} rows"
    budget = accumulator_budget(key.tile_m, key.pingpong)
    if accumulators_per_thread(key.tile_m, key.tile_n, key.pingpong) > budget:
        return f"a consumer thread holds at most {budget} accumulators here"
    if key.promote and (
        key.dtype != FP8_DTYPE or not can_promote(key.tile_m, key.tile_n, key.pingpong)
    ):
        return "promotion is for fp8 tiles whose two accumulator sets fit in the registers"
    if key.persistent and key.split_k > 1:
        return "a persistent grid walks whole tiles: split_k must be 1"
    if key.pingpong and (not key.persistent or key.swap_ab or not key.aligned_n):
        return "ping-pong walks whole tiles of a persistent grid (no swap-AB, N % 8 == 0)"
    if key.stages != stages_for(
        key.dtype, key.tile_m, key.tile_n, key.persistent, key.pingpong, key.swap_ab
    ):
        return "stages must fill shared memory (stages_for)"
    return None


class GemmProblem(NamedTuple):
    m: int
    n: int
    k: int
    dtype: str = BF16_DTYPE
    has_bias: bool = True


def check_problem(problem: GemmProblem, family: str) -> None:
    """Refuse problems no kernel of `family` is built for, with the reason."""
    m, n, k, dtype, _ = problem
    wanted = FP8_DTYPE if family == FP8_FAMILY else BF16_DTYPE
    if dtype != wanted:
        other = FAMILY if dtype == BF16_DTYPE else FP8_FAMILY if dtype == FP8_DTYPE else None
        hint = f" (use {other})" if other else ""
        raise UnsupportedProblemError(f"{family} takes {wanted} x and w, got {dtype}{hint}")
    if min(m, n, k) < 1:
        raise UnsupportedProblemError(f"{family}: empty problem M={m} N={n} K={k}")
    divisor = K_DIVISOR[dtype]
    if k % divisor:
        raise UnsupportedProblemError(
            f"{family}: {dtype} rows must be {ALIGN_BYTES}-byte aligned for TMA, so K % "
            f"{divisor} == 0; got K={k}"
        )
