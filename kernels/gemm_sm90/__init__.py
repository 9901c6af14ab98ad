"""Hopper GEMM family (wgmma + TMA), pure-Python part: key, tactic table, dispatch, shapes.

    out[M, N] bf16 = x[M, K] @ w[N, K]^T (+ bias[N]), K-major operands, fp32 accumulation, sm_90a.

Registered under the `cute_aot.families` entry points as ``gemm_sm90`` and ``gemm_sm90_fp8``
(pyproject.toml), exactly as another project's family would be.

Dispatch reads a table (kernels/tables.py): the hand-written rule (TACTICS below: the tile and
cluster shape by M, narrower tiles for small N) plus per-(N, K, M range) rows measured by
`aot-tune` on an H200, shipped in tables.json; bundles record the table they were built with.

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

This module never imports cutlass or torch at module level: servers import it on every call path.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from cute_aot.artifacts.errors import UnsupportedProblemError
from cute_aot.kernels.contract import Dispatch, KernelFamily, TensorArg, parse_ints
from cute_aot.kernels.keys import KernelKey
from cute_aot.kernels.tables import Table, packaged_tables

FAMILY = "gemm_sm90"
FP8_FAMILY = "gemm_sm90_fp8"
# Bump when the kernel's code generation changes in a way the other key fields do not capture.
FAMILY_VERSION = 1

BF16_DTYPE = "bfloat16"
FP8_DTYPE = "float8_e4m3fn"
OUT_DTYPE = "bfloat16"
ALIGN_BYTES = 16  # TMA: every base address and every row (K * element size) 16-byte aligned
ELEMENT_BYTES = {BF16_DTYPE: 2, FP8_DTYPE: 1}
K_DIVISOR = {dtype: ALIGN_BYTES // size for dtype, size in ELEMENT_BYTES.items()}  # 8 / 16
ARCHS = ("sm_90a",)

# Shared memory (mirrors kernel.py, which re-checks it): 227 KiB per CTA less barriers.
SMEM_CAPACITY = 232448
BARRIER_RESERVE = 1024
MAX_STAGES = 8
TILE_K = {BF16_DTYPE: 64, FP8_DTYPE: 128}  # 128-byte rows either way

# M buckets a server's batch sizes fall into (each bucket's M is also its upper edge).
M_BUCKETS: tuple[int, ...] = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Tactic(NamedTuple):
    """One row of the tactic table: the largest M it serves and the CTA / cluster shape."""

    max_m: int  # inclusive; the last row has no bound (0)
    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    why: str


# The tactic table (data; the dispatch rule reads it top to bottom, first match wins).
TACTICS: tuple[Tactic, ...] = (
    Tactic(64, 64, 128, 1, 1, "decode-sized M: one consumer warpgroup, M tile 64 wastes least"),
    Tactic(256, 128, 128, 1, 1, "mid M: two consumer warpgroups, 128x128 keeps enough CTAs"),
    Tactic(0, 128, 256, 2, 1, "large M: 128x256 tiles, w tile multicast to a 2x1 cluster"),
)
# Below this N a 128x256 tile leaves too few CTAs; large M then keeps 128x128 (cluster 2x1).
WIDE_TILE_MIN_N = 2048
PDL = True
OUT_VECTOR = 8  # bf16 per 16-byte store (kernel.py); needs out rows 16-byte aligned
RASTER_M = 8  # a wave of ~132 CTAs covers 8 M tiles x ~16 N tiles (an L2-sized block)
BLOCK_ORDER = 1 << 16  # a raster group taller than any grid: plain block order, M tiles fastest


def stages_for(dtype: str, tile_m: int, tile_n: int) -> int:
    """As many pipeline stages as shared memory holds, at most MAX_STAGES."""
    per_stage = (tile_m + tile_n) * TILE_K[dtype] * ELEMENT_BYTES[dtype]
    return min(MAX_STAGES, (SMEM_CAPACITY - BARRIER_RESERVE) // per_stage)


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
    raster_m: int = RASTER_M  # M tiles per raster group (kernel.py: _tile_of_this_cta)
    aligned_n: bool = True  # N % 8 == 0: 16-byte stores of a tile staged in shared memory
    out_dtype: str = OUT_DTYPE
    align_bytes: int = ALIGN_BYTES
    version: int = FAMILY_VERSION

    def describe(self) -> str:
        return (
            f"{self.dtype} tile {self.tile_m}x{self.tile_n} cluster {self.cluster_m}x"
            f"{self.cluster_n} stages={self.stages} raster={self.raster_m} bias={int(self.has_bias)}"
            f" pdl={int(self.pdl)}{'' if self.aligned_n else ' any-N'}"
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


@functools.cache
def handwritten_table(family: str, arch: str) -> Table | None:
    """The hand-written rule as a table: TACTICS rows, no per-shape rows."""
    if arch not in ARCHS:
        return None
    data = {
        "rows": [tactic._asdict() for tactic in TACTICS],
        "wide_tile_min_n": WIDE_TILE_MIN_N,
        "raster_m": RASTER_M,
        "shape_rows": [],  # aot-tune's per-(N, K, M range) winners, checked first
    }
    return Table(family, arch, data, {"source": "package defaults (hand-written)"})


def default_table(family: str, arch: str) -> Table | None:
    """The table this package dispatches with: the tuned one it ships (tables.json, from
    aot-tune on an H200) where there is one, else the hand-written rule."""
    return packaged_tables(__name__).get((family, arch)) or handwritten_table(family, arch)


def _shape_row(data: dict, m: int, n: int, k: int) -> dict | None:
    for row in data.get("shape_rows", ()):
        low, high = row["m"]
        if row["n"] == n and row["k"] == k and low <= m and (high is None or m <= high):
            return row
    return None


@functools.lru_cache(maxsize=4096)
def choose(m: int, n: int, k: int, dtype: str, table: Table) -> tuple[dict, int, int, str]:
    """(tactic fields, stages, raster_m, why) for a problem under `table`: the one rule."""
    data = table.data
    row = _shape_row(data, m, n, k)
    if row is not None:
        low, high = row["m"]
        bound = f"M in [{low}, {high if high is not None else 'inf'}]"
        why = f"tuned row for N={n} K={k} {bound}: {row.get('why', '')}".rstrip(": ")
        tactic = {f: row[f] for f in ("tile_m", "tile_n", "cluster_m", "cluster_n")}
        stages = stages_for(dtype, tactic["tile_m"], tactic["tile_n"])
        return tactic, stages, row.get("raster_m", data["raster_m"]), why
    rows = data["rows"]
    row = next(r for r in rows if r["max_m"] == 0 or m <= r["max_m"])
    tactic = {f: row[f] for f in ("tile_m", "tile_n", "cluster_m", "cluster_n")}
    bound = f"M={m} <= {row['max_m']}" if row["max_m"] else f"M={m} > {rows[-2]['max_m']}"
    why = f"{bound}: {row['why']}"
    if tactic["tile_n"] > 128 and n < data["wide_tile_min_n"]:
        tactic["tile_n"] = 128
        why += f"; N={n} < {data['wide_tile_min_n']} narrows tile_n to 128"
    stages = stages_for(dtype, tactic["tile_m"], tactic["tile_n"])
    return tactic, stages, data["raster_m"], why


def dispatch_problem(
    problem: GemmProblem, arch: str, family: str, table: Table | None = None
) -> Dispatch:
    problem = GemmProblem(*problem)
    check_problem(problem, family)
    if arch not in ARCHS:
        raise UnsupportedProblemError(f"{family}: built for {', '.join(ARCHS)} only, not {arch}")
    table = table or default_table(family, arch)
    m, n, k, dtype, has_bias = problem
    tactic, stages, raster_m, why = choose(m, n, k, dtype, table)
    aligned_n = n % OUT_VECTOR == 0
    key_class = GemmSm90Fp8Key if family == FP8_FAMILY else GemmSm90Key
    key = key_class(
        dtype, bool(has_bias), tactic["tile_m"], tactic["tile_n"], tactic["cluster_m"],
        tactic["cluster_n"], stages, PDL, raster_m, aligned_n,
    )  # fmt: skip
    reason = (
        f"{why} -> tile {key.tile_m}x{key.tile_n}x{TILE_K[dtype]}, cluster {key.cluster_m}x"
        f"{key.cluster_n}, raster groups of {raster_m} M tiles; {stages} stages fill shared "
        f"memory; bias {'read' if has_bias else 'not read'}; pdl={int(PDL)}; "
        + (f"N % {OUT_VECTOR} == 0: 16-byte stores through shared memory" if aligned_n
           else f"N % {OUT_VECTOR} != 0: 2-byte stores")
        + f" [{table.describe()}]"
    )  # fmt: skip
    return Dispatch(key, reason)


def tuned_table(family: str, arch: str, winners: list, provenance: dict) -> Table:
    """The default rule plus one row per measured (N, K, M bucket): the fastest correct tactic,
    its time and the runner-up's. A bucket's row serves the M range up to its M."""
    data = dict(handwritten_table(family, arch).data)
    rows = []
    for problem, key, timings in sorted(winners, key=lambda w: (w[0].n, w[0].k, w[0].m)):
        m, n, k = problem.m, problem.n, problem.k
        lower = max((b for b in M_BUCKETS if b < m), default=0) + 1
        upper = None if m == M_BUCKETS[-1] else m
        ranked = sorted(timings.items(), key=lambda item: item[1])
        runner_up = ranked[1] if len(ranked) > 1 else None
        rows.append({
            "n": n, "k": k, "m": [lower, upper],
            "tile_m": key.tile_m, "tile_n": key.tile_n,
            "cluster_m": key.cluster_m, "cluster_n": key.cluster_n, "raster_m": key.raster_m,
            "us": round(timings[key.id], 3),
            "runner_up_us": round(runner_up[1], 3) if runner_up else None,
            "why": f"fastest of {len(timings)} measured at M={m}",
        })  # fmt: skip
    data["shape_rows"] = rows
    return Table(family, arch, data, provenance)


# (N, K) of the dense layers the default bundles serve (fused QKV and gate-up as served).
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = (
    # Llama-3-8B: hidden 4096, 32 q / 8 kv heads of 128, intermediate 14336
    (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
    # Llama-3-70B: hidden 8192, 64 q / 8 kv heads of 128, intermediate 28672
    (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672),
    # Qwen3-32B: hidden 5120, 64 q / 8 kv heads of 128, intermediate 25600
    (10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600),
    # DeepSeek-V3 dense MLP (first 3 layers): hidden 7168, intermediate 18432; shared expert
    # (intermediate 2048); MLA projections (q_lora 1536, kv_lora 512, 128 heads of 128 + 64 rope)
    (36864, 7168), (7168, 18432), (4096, 7168), (7168, 2048),
    (1536, 7168), (24576, 1536), (576, 7168), (32768, 512), (7168, 16384),
)  # fmt: skip


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
        from cute_aot.artifacts.errors import InputError

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
        problem = GemmProblem(*problem)
        check_problem(problem, self.name)
        aligned_n = problem.n % OUT_VECTOR == 0
        return [
            key for key in self.tactic_space(arch, aligned=(aligned_n,))
            if key.has_bias == problem.has_bias
        ]  # fmt: skip

    def tuned_table(self, arch: str, winners: list, provenance: dict) -> Table:
        return tuned_table(self.name, arch, winners, provenance)

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
        return [
            self.Key(self.dtype, has_bias, tile_m, tile_n, cluster_m, cluster_n,
                     stages_for(self.dtype, tile_m, tile_n), PDL, raster_m, aligned_n)
            for tile_m in (64, 128)
            for tile_n in (64, 128, 256)
            for cluster_m, cluster_n in ((1, 1), (2, 1), (1, 2))
            for has_bias in (False, True)
            for raster_m in ((RASTER_M, 2 * RASTER_M, BLOCK_ORDER) if tile_m * tile_n >= 128 * 128
                             else (RASTER_M,))
            for aligned_n in aligned
        ]  # fmt: skip

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
