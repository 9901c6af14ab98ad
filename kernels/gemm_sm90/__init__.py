"""Hopper GEMM family (wgmma + TMA), pure-Python part: the family classes and their tactic space.

    out[M, N] bf16 = x[M, K] @ w[N, K]^T (+ bias[N]), K-major operands, fp32 accumulation, sm_90a.

The package, one job a module (this one re-exports their names, as it held them all before):

* resources.py: the one shared-memory, stage, register and SM model. kernel.py allocates by it
  and keys' stages are its stages_for, so it is inside the family's source hash.
* keys.py: the problem, the key (each field a compile-time choice of the kernel) and the
  checks that refuse either.
* cost.py: the wave and cost model (tiles, waves, k-tiles, split-K, measured tile costs).
* dispatch.py: table dispatch (hand-written rule, tuned and borrowed rows, fp8 accumulation
  policy) and aot-tune's tuned tables.
* models.py: the default shapes and a model config's layer shapes.
* kernel.py (the CuTe DSL kernel, composing scheduler.py, mainloop.py, epilogue.py and
  launch.py) and build.py (its compile): build machines and JIT only.
* here: the tactic space and the family classes.

The family's source hash (kernels/__init__.py: source_hash) covers build.py, kernel.py and what
they import of the package (the kernel's modules and resources.py), never this module, keys.py,
dispatch.py, cost.py or models.py: a table or cost tweak changes which key a problem asks
for, never a key's binary.

Registered under the `cute_aot.families` entry points as ``gemm_sm90`` and ``gemm_sm90_fp8``
(pyproject.toml), exactly as another project's family would be.

Dispatch reads a table (kernels/tables.py): per-(N, K, M range) rows measured by `aot-tune` on
an H200, shipped in tables.json (a shape with no row of its own takes: up to M = 64 the nearest
tuned shape's row; up to 511 the tuned tactic with the least measured cost scaled to its waves
and k-tiles; from 512 the wave model's persistent tile), else the hand-written rule
(dispatch.TACTICS: swap-AB with K split for decode-sized M, 128 x 128 split until ~72 CTAs for
mid M, 128 x 256 multicast tiles for large M, narrower where they would leave SMs idle). Bundles
record the table they were built with.

A tactic is the kernel's compile-time choice (kernel.py): tile and cluster shape, raster group,
swap-AB, split-K, persistent grid, fp8 promotion; each is a field of the key.

Two families share one kernel (kernel.py) because their exported functions' ABIs differ:

* ``gemm_sm90`` (bf16): ``fn(x bf16 [M, K], w bf16 [N, K], bias bf16 [N], out bf16 [M, N])``.
  bias is always passed; the key's ``has_bias`` decides whether the kernel reads it.
* ``gemm_sm90_fp8`` (float8_e4m3fn, per-tensor scales): ``fn(x fp8 [M, K], w fp8 [N, K],
  x_scale fp32 [1], w_scale fp32 [1], bias bf16 [N], out bf16 [M, N])`` computing
  ``bf16(acc * x_scale * w_scale + bias)``. The scales are device scalars (read by the kernel,
  never synchronised to the host), so a CUDA graph may capture calls whose scales change.

bias is optional in the op (None): `problem` then reports has_bias=False, which dispatches to a
key whose kernel never reads bias, and `bind` hands the exported function out's first row in its
place. Both variants are enumerated for every shape so a bundle holds both.

The package's pure-Python modules (all but kernel.py and build.py) never import cutlass or torch
at module level: servers import them on every call path.

"""

from __future__ import annotations

from collections.abc import Iterator

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.contract import Dispatch, KernelFamily, TensorArg, parse_ints
from cute_aot.kernels.gemm_sm90.cost import (
    BORROWED_MIN_K_TILES_PER_SPLIT,
    CTA_FILL_K_TILES,
    FILL_WAVE_TILE_COST,
    MIN_K_TILES_PER_SPLIT,
    PINGPONG_MAX_K_TILES,
    SPLIT_MAX_CTAS,
    SPLIT_WAVE_TILE_COST,
    WAVE_TILE_COST,
    auto_split,
    k_tiles_of,
    split_fits,
    tiles_of,
    wave_model_tactic,
)
from cute_aot.kernels.gemm_sm90.dispatch import (
    DECODE_MAX_M,
    M_BUCKETS,
    TACTIC_DEFAULTS,
    TACTIC_FIELDS,
    TACTICS,
    WAVE_MODEL_MIN_M,
    WIDE_TILE_MIN_N,
    Tactic,
    bucket_of,
    choose,
    default_table,
    dispatch_problem,
    fast_accumulation_row,
    handwritten_table,
    tuned_table,
)
from cute_aot.kernels.gemm_sm90.keys import (
    ALIGN_BYTES,
    ARCHS,
    FAMILY,
    FAMILY_VERSION,
    FP8_FAMILY,
    K_DIVISOR,
    OUT_DTYPE,
    PDL,
    RASTER_M,
    SWAP_TILE_N,
    GemmProblem,
    GemmSm90Fp8Key,
    GemmSm90Key,
    check_key,
    check_problem,
    swap_tile_n,
    tactic_refusal,
)
from cute_aot.kernels.gemm_sm90.models import DEFAULT_SHAPES, shapes_from_config
from cute_aot.kernels.gemm_sm90.resources import (
    BARRIER_RESERVE,
    BF16_DTYPE,
    ELEMENT_BYTES,
    EPI_BUFFERS,
    EPI_COLS,
    FP8_DTYPE,
    MAX_ACC_PER_THREAD,
    MAX_STAGES,
    OUT_PAD,
    OUT_VECTOR,
    SMEM_CAPACITY,
    SMS,
    SPLITS,
    TILE_K,
    accumulator_budget,
    accumulators_per_thread,
    can_promote,
    epilogue_bytes,
    stages_for,
    stores_by_tma,
    strip_cols,
)
from cute_aot.kernels.tables import Table

# What this module held before the split, re-exported: importers keep importing it from here.
__all__ = [
    "FAMILY",
    "FP8_FAMILY",
    "FAMILY_VERSION",
    "BF16_DTYPE",
    "FP8_DTYPE",
    "OUT_DTYPE",
    "ALIGN_BYTES",
    "ELEMENT_BYTES",
    "K_DIVISOR",
    "ARCHS",
    "SMEM_CAPACITY",
    "BARRIER_RESERVE",
    "MAX_STAGES",
    "TILE_K",
    "M_BUCKETS",
    "SWAP_TILE_N",
    "FILL_TILE_N",
    "SPLITS",
    "SPLIT_WIDE_TILE_N",
    "SPLIT_DECODE_TILE_N",
    "SMS",
    "SPLIT_MAX_CTAS",
    "MIN_K_TILES_PER_SPLIT",
    "BORROWED_MIN_K_TILES_PER_SPLIT",
    "CTA_FILL_K_TILES",
    "OUT_PAD",
    "EPI_COLS",
    "EPI_BUFFERS",
    "MAX_ACC_PER_THREAD",
    "Tactic",
    "TACTICS",
    "WIDE_TILE_MIN_N",
    "PDL",
    "OUT_VECTOR",
    "RASTER_M",
    "BLOCK_ORDER",
    "accumulators_per_thread",
    "accumulator_budget",
    "can_promote",
    "swap_tile_n",
    "k_tiles_of",
    "tiles_of",
    "split_fits",
    "auto_split",
    "stores_by_tma",
    "strip_cols",
    "epilogue_bytes",
    "stages_for",
    "GemmSm90Key",
    "GemmSm90Fp8Key",
    "check_key",
    "tactic_refusal",
    "GemmProblem",
    "check_problem",
    "handwritten_table",
    "default_table",
    "WAVE_TILE_COST",
    "FILL_WAVE_TILE_COST",
    "SPLIT_WAVE_TILE_COST",
    "WAVE_MODEL_MIN_M",
    "PINGPONG_MAX_K_TILES",
    "wave_model_tactic",
    "DECODE_MAX_M",
    "TACTIC_FIELDS",
    "TACTIC_DEFAULTS",
    "fast_accumulation_row",
    "bucket_of",
    "choose",
    "dispatch_problem",
    "tuned_table",
    "DEFAULT_SHAPES",
    "shapes_from_config",
    "GemmSm90Family",
    "GemmSm90Fp8Family",
    "family",
    "fp8_family",
    "Key",
]

# Tile widths between the powers of two: where N / 128 tiles leave a wave part-empty (ncu on the
# H200: cuBLAS ran M=256 N=5120 with 80-wide tiles on 128 SMs while our 128 wide took 80).
FILL_TILE_N: tuple[int, ...] = (80, 96, 112, 144, 160, 192)
# Wider 128-row tiles split 2 or 4 ways, for mid M with small N and long K (M = 1024, N = 576,
# K = 7168: 8 x 4 tiles of 128 x 144 leave 100 SMs idle, split 4 ways they fill 128).
SPLIT_WIDE_TILE_N: tuple[int, ...] = FILL_TILE_N + (256,)
# And 64-row tiles of these widths, for decode sizes whose swap-AB tiles land just past a wave
# (M = 2, N = 5120: 80 swap-AB tiles x split 2 = 160 CTAs; 64 tiles of 64 x 80 x 2 = 128), and
# for mid M with N = 576 (M = 1024: 16 x 4 tiles of 64 x 144, split 2 ways, fill 128 SMs).
SPLIT_DECODE_TILE_N: tuple[int, ...] = (80, 96, 112, 144)
BLOCK_ORDER = 1 << 16  # a raster group taller than any grid: plain block order, M tiles fastest


class GemmSm90Family(KernelFamily):
    """The family contract for the bf16 Hopper GEMM (kernels/contract.py)."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = GemmSm90Key
    archs = ARCHS
    dtype = BF16_DTYPE
    abi = (
        TensorArg("x", BF16_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("w", BF16_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("bias", BF16_DTYPE, 1, align_bytes=ALIGN_BYTES, optional=True),
        TensorArg("out", OUT_DTYPE, 2, align_bytes=ALIGN_BYTES, output=True),
    )
    builder = "cute_aot.kernels.gemm_sm90.build"
    default_shapes = DEFAULT_SHAPES
    shape_syntax = "N,K"

    def problem(self, x, w, bias, *scales) -> GemmProblem:
        from cute_aot.artifacts.core.errors import InputError

        (m, k), (n, k_w) = x.shape, w.shape
        if k != k_w:
            raise InputError(f"{self.name}: x is [M, K={k}] but w is [N, K={k_w}]")
        if bias is not None and tuple(bias.shape) != (n,):
            raise InputError(f"{self.name}: bias must be [N={n}], got {list(bias.shape)}")
        for scale in scales:
            if tuple(scale.shape) != (1,):
                raise InputError(f"{self.name}: scales must be [1], got {list(scale.shape)}")
        if 0 in (m, n, k):
            raise InputError(f"{self.name}: empty problem x {tuple(x.shape)}, w {tuple(w.shape)}")
        dtype = str(x.dtype).removeprefix("torch.")
        if str(w.dtype).removeprefix("torch.") != dtype:
            raise InputError(f"{self.name}: x is {dtype} but w is {w.dtype}")
        if k % K_DIVISOR.get(dtype, 1):
            raise InputError(f"{self.name}: K={k} must be a multiple of {K_DIVISOR[dtype]}")
        return GemmProblem(m, n, k, dtype, bias is not None)

    def dispatch(self, problem, arch: str, table: Table | None = None) -> Dispatch:
        return dispatch_problem(problem, arch, self.name, table)

    def default_table(self, arch: str) -> Table | None:
        return default_table(self.name, arch)

    def tune_problems(self, shape) -> Iterator[GemmProblem]:
        """One problem per M bucket, with bias: the tactic does not depend on it."""
        n, k = shape
        for m in M_BUCKETS:
            yield GemmProblem(m, n, k, self.dtype, True)

    def tune_candidates(self, problem, arch: str) -> list[GemmSm90Key]:
        """The tactics worth timing at this M: swap-AB (tile fitted to M) and 64-row tiles for
        decode sizes; every tile up to 128 x 128 split or not, and the wide ones, for mid M;
        every tile (fill widths, clusters, rasters, splits, persistent) above."""
        problem = GemmProblem(*problem)
        check_problem(problem, self.name)
        aligned_n = problem.n % OUT_VECTOR == 0
        m = problem.m

        def wanted(key: GemmSm90Key) -> bool:
            if key.swap_ab:
                return m <= 256 and key.tile_n == swap_tile_n(m)
            if m <= 64:
                return key.tile_m == 64 and key.tile_n <= 128 and key.cluster_m == key.cluster_n
            if m <= 256:
                return not key.persistent
            # Fill widths too: a width whose tiles land on whole waves (N = 576 in 4 tiles of
            # 144, N = 5120 in 32 of 160) beats the padded or wave-split power-of-two tiles;
            # and split tiles of both heights (M = 1024, N = 576: 64 x 144 split 2 ways, 128).
            return True

        return [
            key
            for key in self.tactic_space(arch, aligned=(aligned_n,))
            if key.has_bias == problem.has_bias and wanted(key)
        ]

    def tuned_table(self, arch: str, winners: list, provenance: dict, base=None) -> Table:
        return tuned_table(self.name, arch, winners, provenance, base)

    def problems(self, shape) -> Iterator[GemmProblem]:
        n, k = shape
        for m in M_BUCKETS:
            for has_bias in (False, True):
                yield GemmProblem(m, n, k, self.dtype, has_bias)

    def parse_shape(self, text: str) -> tuple[int, int]:
        n, k = parse_ints(self, text, self.shape_syntax)
        check_problem(GemmProblem(1, n, k, self.dtype), self.name)
        return n, k

    def parse_problem(self, text: str, dtypes: str | None = None) -> GemmProblem:
        """`M,N,K` (bias read) or `M,N,K,0` (no bias), the dims also named (`M=7,N=6144,K=4096`);
        --dtype names x and w's dtype."""
        values = text.split(",")
        has_bias = True
        if len(values) == 4:
            flag = values.pop().strip().lower().removeprefix("bias=")
            if flag not in ("0", "1", "false", "true"):  # not a dim misread as a bias flag
                raise UnsupportedProblemError(f"{self.name}: {text!r} is not M,N,K[,0|1]")
            has_bias = flag in ("1", "true")
        m, n, k = parse_ints(self, ",".join(values), "M,N,K")
        return GemmProblem(m, n, k, (dtypes or self.dtype).split(",")[0].strip(), has_bias)

    def describe_problem(self, problem) -> dict:
        return GemmProblem(*problem)._asdict()

    def shapes_from_model(self, config: dict) -> list[tuple[int, int]]:
        return shapes_from_config(config, self.name)

    def input_shapes(self, problem) -> tuple[tuple[int, ...] | None, ...]:
        m, n, k, _, has_bias = GemmProblem(*problem)
        return (m, k), (n, k), (n,) if has_bias else None

    def bind(self, function, problem):
        """Without a bias the key's kernel never reads one; the exported function still takes
        a bf16 [N] tensor, so it gets out's first row (no allocation, right device)."""
        if GemmProblem(*problem).has_bias:
            return function
        return lambda x, w, bias, out: function(x, w, out[0], out)

    def tactic_space(self, arch: str, aligned: tuple[bool, ...] = (True,)) -> list[GemmSm90Key]:
        """Every tile and cluster shape the kernel builds, with and without bias; for the tiles
        large M uses, also other raster groups (BLOCK_ORDER: M tiles fastest, no grouping).
        `aligned`: which epilogues (N % 8 == 0, or any N); default shapes all have N % 8 == 0."""
        if arch not in ARCHS:
            return []
        promotes = (False, True) if self.dtype == FP8_DTYPE else (False,)
        # Three consumer warpgroups (192 rows) for large M: 192 x 128 and 192 x 192.
        wide_m = [(192, 128), (192, 192)]
        unsplit = [
            (tile_m, tile_n, cluster_m, cluster_n, raster_m, False, 1, False, False)
            for tile_m, tile_n in [(m, n) for m in (64, 128) for n in (64, 128, 256)] + wide_m
            for cluster_m, cluster_n in ((1, 1), (2, 1), (1, 2))
            for raster_m in (
                (RASTER_M, 2 * RASTER_M, BLOCK_ORDER)
                if tile_m * tile_n >= 128 * 128
                else (RASTER_M,)
            )
        ]
        persistent = [
            (tile_m, tile_n, cluster_m, cluster_n, RASTER_M, False, 1, True, pingpong)
            for tile_m, tile_n in [(m, n) for m in (64, 128) for n in (128, 256)] + wide_m
            for cluster_m, cluster_n in ((1, 1), (2, 1), (1, 2))
            for pingpong in (False, True)
        ]
        filling = [
            (tile_m, tile_n, cluster_m, 1, RASTER_M, False, 1, False, False)
            for tile_m in (64, 128)
            for tile_n in FILL_TILE_N
            for cluster_m in (1, 2)
        ]
        split = (
            [
                (tile_m, tile_n, 1, 1, RASTER_M, False, split_k, False, False)
                for tile_m in (64, 128)
                for tile_n in (64, 128)
                for split_k in SPLITS[1:]
            ]
            + [
                (128, tile_n, 1, 1, RASTER_M, False, split_k, False, False)
                for tile_n in SPLIT_WIDE_TILE_N
                for split_k in SPLITS[1:3]
            ]
            + [
                (64, tile_n, 1, 1, RASTER_M, False, split_k, False, False)
                for tile_n in SPLIT_DECODE_TILE_N
                for split_k in SPLITS[1:3]
            ]
        )
        swapped = [
            (tile_m, tile_n, 1, 1, RASTER_M, True, split_k, False, False)
            for tile_m in (64, 128)
            for tile_n in SWAP_TILE_N
            for split_k in SPLITS
        ]
        keys = [
            self.Key(
                self.dtype,
                has_bias,
                tile_m,
                tile_n,
                cluster_m,
                cluster_n,
                stages_for(self.dtype, tile_m, tile_n, walks, pingpong, swap_ab),
                PDL,
                raster_m,
                aligned_n,
                swap_ab,
                split_k,
                promote,
                walks,
                pingpong,
            )
            for (
                tile_m,
                tile_n,
                cluster_m,
                cluster_n,
                raster_m,
                swap_ab,
                split_k,
                walks,
                pingpong,
            ) in unsplit + filling + persistent + split + swapped
            for promote in promotes
            for has_bias in (False, True)
            for aligned_n in aligned
        ]
        return [key for key in keys if tactic_refusal(key) is None]

    def output_shape(self, problem) -> tuple[int, int]:
        return problem[0], problem[1]

    def reference(self, x, w, bias=None):
        """F.linear in fp32, cast to bf16."""
        import torch.nn.functional as F

        return F.linear(x.float(), w.float(), None if bias is None else bias.float()).bfloat16()


class GemmSm90Fp8Family(GemmSm90Family):
    """fp8 e4m3 x and w with per-tensor fp32 device scales: its own ABI, so its own family."""

    name = FP8_FAMILY
    Key = GemmSm90Fp8Key
    dtype = FP8_DTYPE
    abi = (
        TensorArg("x", FP8_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("w", FP8_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("x_scale", "float32", 1, align_bytes=4),
        TensorArg("w_scale", "float32", 1, align_bytes=4),
        TensorArg("bias", BF16_DTYPE, 1, align_bytes=ALIGN_BYTES, optional=True),
        TensorArg("out", OUT_DTYPE, 2, align_bytes=ALIGN_BYTES, output=True),
    )

    def problem(self, x, w, x_scale, w_scale, bias) -> GemmProblem:
        return super().problem(x, w, bias, x_scale, w_scale)

    def input_shapes(self, problem) -> tuple[tuple[int, ...] | None, ...]:
        m, n, k, _, has_bias = GemmProblem(*problem)
        return (m, k), (n, k), (1,), (1,), (n,) if has_bias else None

    def bind(self, function, problem):
        if GemmProblem(*problem).has_bias:
            return function
        return lambda x, w, x_scale, w_scale, bias, out: function(
            x, w, x_scale, w_scale, out[0], out
        )

    def reference(self, x, w, x_scale, w_scale, bias=None):
        """fp32 product of the dequantised operands, scaled, plus bias, cast to bf16."""
        import torch.nn.functional as F

        acc = F.linear(x.float(), w.float()) * (x_scale.float() * w_scale.float())
        return (acc if bias is None else acc + bias.float()).bfloat16()


family = GemmSm90Family()
fp8_family = GemmSm90Fp8Family()
Key = GemmSm90Key
