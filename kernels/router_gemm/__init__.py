"""Router GEMM family, pure-Python part: key, dispatch rule, tuned tables, key enumeration.

out[M, N] fp32 = x[M, K] bf16 @ w[N, K]^T bf16, M = 1..16 tokens, N = experts. Two kernels:
``dot`` (one CTA per expert, M and K compiled in) and ``splitk`` (cluster split-K, all sizes
symbolic). This module never imports cutlass: the server imports it on every call path.

A weight shape is (N, K), w's shape, and a problem (M, N, K), the order of the math, in every
command (`N,K`, `M,N,K`) and every Python API (`RouterProblem`, `dispatch`, `preload` tuples).
Positional dims with N > K are the older (K, N) / (M, K, N) order and are refused with the fix,
never reinterpreted (`older_order`); a router with more experts than hidden size is named.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import NamedTuple

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.arch import arch_family, normalize_arch
from cute_aot.kernels.contract import (
    Dispatch,
    KernelFamily,
    TensorArg,
    Tuner,
    named_spelling,
    parse_ints,
)
from cute_aot.kernels.keys import KernelKey
from cute_aot.kernels.tables import Table, packaged_tables

FAMILY = "router_gemm"
# Bump when a kernel's code generation changes in a way the other key fields do not capture.
FAMILY_VERSION = 1

X_DTYPE, W_DTYPE, OUT_DTYPE = "bfloat16", "bfloat16", "float32"
ALIGN_BYTES = 16  # every tensor's base address; K % 8 keeps every row 16-byte aligned too
K_DIVISOR = 8
MAX_TOKENS = 16

# Weight shapes (N, K) = w's [experts, hidden] of the models the default bundles serve:
# DeepSeek-V3/V3.2, DeepSeek-V4-Pro, DeepSeek-V4-Flash, GLM-5.2.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((256, 7168), (384, 7168), (256, 4096), (256, 6144))
SHAPE_SYNTAX, PROBLEM_SYNTAX = "N,K", "M,N,K"


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


def check_problem(m: int, n: int, k: int, x_dtype: str = X_DTYPE, w_dtype: str = W_DTYPE) -> None:
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


def default_table(arch: str) -> Table:
    """The table this package dispatches with on `arch`: the one aot-tune measured (tables.json)
    where it ships one, else tuned.json's section for the architecture family."""
    return packaged_tables(__name__).get((FAMILY, normalize_arch(arch))) or handwritten_table(arch)


@functools.cache
def handwritten_table(arch: str) -> Table:
    """tuned.json for `arch`'s architecture family, as one table: the default rule and rows that
    override it for one (K, N) and listed M, each naming its backend."""
    tables = tuned_tables()
    section = tables[arch_family(arch)]
    rows = [
        {"k": r["k"], "n": r["n"], "m": r["m"], "backend": "dot", "block_size": r["block_size"]}
        for r in section["dot_block_size"]
    ] + [
        {
            "k": r["k"],
            "n": r["n"],
            "m": r["m"],
            "backend": "splitk",
            "split_k": r["split_k"],
            "num_stages": r["num_stages"],
        }
        for r in section["split_k"]
    ]
    provenance = {"source": "package defaults (router_gemm/tuned.json)", "about": tables["about"]}
    return Table(
        FAMILY, normalize_arch(arch), {"defaults": tables["defaults"], "rows": rows}, provenance
    )


def _row(table: Table, m: int, n: int, k: int) -> dict | None:
    return next(
        (r for r in table.data["rows"] if r["k"] == k and r["n"] == n and m in r["m"]), None
    )


def dispatch(
    m: int,
    n: int,
    k: int,
    arch: str,
    x_dtype: str = X_DTYPE,
    w_dtype: str = W_DTYPE,
    table: Table | None = None,
) -> RouterGemmKey:
    """The key of problem (M, N, K) on `arch`. Positional, so N > K is refused as the older
    (M, K, N) order; a router with N > K goes through `family.dispatch(RouterProblem(m=, n=, k=))`.
    """
    check_problem(m, n, k, x_dtype, w_dtype)  # what no kernel serves is said as such first
    refuse_older_tuple((m, n, k))
    return _dispatch(m, n, k, x_dtype, w_dtype, arch, table)


@functools.lru_cache(maxsize=4096)
def _dispatch(
    m: int, n: int, k: int, x_dtype: str, w_dtype: str, arch: str, table: Table | None
) -> RouterGemmKey:
    """The one rule mapping a problem to a key. Build-time enumeration calls this too.

    A table row for (K, N, M) decides; otherwise the default rule: the dot-product kernel when
    M <= dot_max_m or K < dot_below_k, else cluster split-K, with the defaults' parameters.
    """
    check_problem(m, n, k, x_dtype, w_dtype)
    table = table or default_table(arch)
    defaults = table.data["defaults"]
    pdl = bool(defaults["pdl"])
    row = _row(table, m, n, k)
    backend = row["backend"] if row else None
    if backend is None:
        dot = m <= defaults["dot_max_m"] or k < defaults["dot_below_k"]
        backend = "dot" if dot else "splitk"
    if backend == "dot":
        block_size = row["block_size"] if row else defaults["block_size"]
        return RouterGemmKey("dot", m, k, block_size, 0, 0, pdl)
    entry = row or defaults
    return RouterGemmKey("splitk", 0, 0, 0, entry["split_k"], entry["num_stages"], pdl)


def problems(shapes: Iterable[tuple[int, int]] = DEFAULT_SHAPES) -> Iterator[RouterProblem]:
    """Every (M, N, K) a server can ask for with these (N, K) weight shapes."""
    for n, k in shapes:
        for m in range(1, MAX_TOKENS + 1):
            yield RouterProblem(m=m, n=n, k=k)  # named: a named N > K shape stays what it is


def enumerate_keys(
    arch: str, shapes: Iterable[tuple[int, int]] = DEFAULT_SHAPES
) -> list[RouterGemmKey]:
    """The distinct keys that dispatch yields for these shapes: exactly what a server will ask
    for."""
    arch = normalize_arch(arch)
    keys = {_dispatch(*problem, arch, None) for problem in problems(shapes)}
    return sorted(keys, key=lambda key: key.canonical_json())


def dispatch_reason(
    m: int, n: int, k: int, arch: str, key: RouterGemmKey, table: Table | None = None
) -> str:
    """Why `dispatch` chose `key`, in terms of the table (what `aot-cache explain` says)."""
    table = table or default_table(arch)
    defaults = table.data["defaults"]
    row = _row(table, m, n, k)
    if row:
        rule = f"table row (K={k}, N={n}, M in {row['m']})"
        rule += f": {row['why']}" if row.get("why") else ""
    elif key.backend == "dot":
        rule = (
            f"M={m} <= dot_max_m={defaults['dot_max_m']}"
            if m <= defaults["dot_max_m"]
            else f"K={k} < dot_below_k={defaults['dot_below_k']}"
        )
        rule += f", no table row for (K={k}, N={n}, M={m}): default block"
    else:
        rule = (
            f"M={m} > dot_max_m={defaults['dot_max_m']} and K={k} >= dot_below_k="
            f"{defaults['dot_below_k']}, no table row for (K={k}, N={n}, M={m}): defaults"
        )
    if key.backend == "dot":
        tactic = f"dot-product kernel (M, K compiled in), block {key.block_size}"
    else:
        tactic = (
            f"cluster split-K kernel (sizes symbolic), split_k={key.split_k}, "
            f"stages={key.num_stages}"
        )
    return f"{rule} -> {tactic} [{table.describe()}]"


def tune_candidates(m: int, n: int, k: int, arch: str) -> list[RouterGemmKey]:
    """Keys worth timing for (M, N, K): dot-product with 128 and 256 threads, and cluster
    split-K with 2..8 CTAs per cluster and 2..5 stages."""
    check_problem(m, n, k)
    pdl = bool(tuned_tables()["defaults"]["pdl"])
    dot = [RouterGemmKey("dot", m, k, block, 0, 0, pdl) for block in (128, 256)]
    split = [
        RouterGemmKey("splitk", 0, 0, 0, split_k, stages, pdl)
        for split_k in range(2, 9)
        for stages in range(2, 6)
    ]
    return dot + split


def tuned_table(arch: str, winners: list, provenance: dict) -> Table:
    """The default rule plus one row per measured (K, N, M): the fastest correct kernel."""
    base = handwritten_table(arch)
    rows = []
    for problem, key, timings in sorted(winners, key=lambda w: (w[0].k, w[0].n, w[0].m)):
        ranked = sorted(timings.values())
        row = {
            "k": problem.k,
            "n": problem.n,
            "m": [problem.m],
            "backend": key.backend,
            "us": round(timings[key.id], 3),
            "runner_up_us": round(ranked[1], 3) if len(ranked) > 1 else None,
            "why": f"fastest of {len(timings)} measured",
        }
        if key.backend == "dot":
            row["block_size"] = key.block_size
        else:
            row.update(split_k=key.split_k, num_stages=key.num_stages)
        rows.append(row)
    return Table(FAMILY, base.arch, {"defaults": base.data["defaults"], "rows": rows}, provenance)


def older_order(syntax: str, values: Sequence[int]) -> tuple[str, tuple[int, ...]] | None:
    """The one rule for positional router dims, text and numbers alike: N > K is the older order.
    Before N,K the router read K,N (and M,K,N): an old pair has N > K (hidden sizes are
    thousands, expert counts hundreds), and read in today's order it would build, explain or
    serve the wrong problem without a word. A router with N > K is written named, which no order
    can confuse. Returns (the older order's dims, `values` rewritten in `syntax`) or None."""
    dims = dict(zip(syntax.split(","), values, strict=True))
    if dims["N"] <= dims["K"]:
        return None
    swap = {"N": "K", "K": "N"}
    return ",".join(swap.get(d, d) for d in dims), tuple(dims[swap.get(d, d)] for d in dims)


def refuse_older_order(text: str, syntax: str, values: tuple[int, ...]) -> None:
    """Refuse positional text in the older order (`older_order`); named text is taken as written."""
    older = None if "=" in text else older_order(syntax, values)
    if older is None:
        return
    dims = dict(zip(syntax.split(","), values, strict=True))
    raise UnsupportedProblemError(
        f"{FAMILY}: {text!r} reads as N={dims['N']} experts > K={dims['K']} hidden, the older "
        f"{older[0]} order; the order is {syntax} (w is [N, K]): write "
        f"{','.join(map(str, older[1]))}, or {named_spelling(syntax, values)} if N > K is meant"
    )


def refuse_older_tuple(values: Sequence) -> None:
    """Refuse a positional problem (M, N, K[, dtypes]) in the older (M, K, N) order, by the rule
    text follows: `preload([(12, 7168, 256)])` meant K=7168, N=256, never N=7168 experts."""
    older = older_order(PROBLEM_SYNTAX, values[:3])
    if older is None:
        return
    m, n, k = values[:3]
    raise UnsupportedProblemError(
        f"{FAMILY}: problem {tuple(values)} reads as N={n} experts > K={k} hidden, the older "
        f"({older[0].replace(',', ', ')}) order; the order is (M, N, K) (w is [N, K]): write "
        f"{(*older[1], *values[3:])}, or name the dims if N > K is meant: "
        f"RouterProblem(m={m}, n={n}, k={k}), or in preload {{'M': {m}, 'N': {n}, 'K': {k}}} "
        f"or '{named_spelling(PROBLEM_SYNTAX, (m, n, k))}'"
    )


class _RouterDims(NamedTuple):
    m: int
    n: int
    k: int
    x_dtype: str = X_DTYPE
    w_dtype: str = W_DTYPE


class RouterProblem(_RouterDims):
    """out[M, N] = x[M, K] @ w[N, K]^T, its fields in the order of the math. Given positionally,
    N > K is the older (M, K, N) order and refused (`refuse_older_tuple`); named, as written."""

    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        if len(args) >= 3:
            refuse_older_tuple(args)
        return super().__new__(cls, *args, **kwargs)

    def __reduce__(self):  # copies and pickles of a named N > K problem skip the positional rule
        return type(self)._make, (tuple(self),)


def as_problem(problem) -> RouterProblem:
    """A RouterProblem as it is; a bare tuple read positionally as (M, N, K[, dtypes])."""
    return problem if isinstance(problem, RouterProblem) else RouterProblem(*problem)


class RouterGemmFamily(KernelFamily, Tuner):
    """The family contract for router GEMM (kernels/contract.py)."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = RouterGemmKey
    archs = ("sm_90a", "sm_100a", "sm_103a")
    abi = (
        TensorArg("x", X_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("w", W_DTYPE, 2, align_bytes=ALIGN_BYTES),
        TensorArg("out", OUT_DTYPE, 2, align_bytes=ALIGN_BYTES, output=True),
    )
    builder = f"{__name__}.build"
    default_shapes = DEFAULT_SHAPES
    shape_syntax = SHAPE_SYNTAX
    unprefixed_shapes = True  # a plain `aot-build --shape N,K` means the router, as it always has

    def problem(self, x, w) -> RouterProblem:
        from cute_aot.artifacts.core.errors import InputError

        (m, k), (n, k_w) = x.shape, w.shape
        if k != k_w:
            raise InputError(f"{FAMILY}: x is [M, K={k}] but w is [N, K={k_w}]")
        if 0 in (m, n, k):
            raise InputError(f"{FAMILY}: empty problem x {tuple(x.shape)}, w {tuple(w.shape)}")
        if k % K_DIVISOR:
            raise InputError(f"{FAMILY}: K={k} must be a multiple of {K_DIVISOR}")
        x_dtype, w_dtype = (str(t.dtype).removeprefix("torch.") for t in (x, w))
        return RouterProblem(m=m, n=n, k=k, x_dtype=x_dtype, w_dtype=w_dtype)  # the tensors' own

    def dispatch(self, problem: RouterProblem, arch: str, table: Table | None = None) -> Dispatch:
        problem = as_problem(problem)
        key = _dispatch(*problem, arch, table)
        return Dispatch(key, dispatch_reason(*problem[:3], arch, key, table))

    def default_table(self, arch: str) -> Table:
        return default_table(arch)

    def tune_candidates(self, problem, arch: str) -> list[RouterGemmKey]:
        return tune_candidates(*as_problem(problem)[:3], arch)

    def tuned_table(self, arch: str, winners: list, provenance: dict) -> Table:
        return tuned_table(arch, winners, provenance)

    def problems(self, shape) -> Iterator[RouterProblem]:
        return problems([tuple(shape)])

    def parse_shape(self, text: str) -> tuple[int, int]:
        """`N,K` (w's shape) with N <= K, or named (`N=256,K=7168`) for any N."""
        n, k = parse_ints(self, text, SHAPE_SYNTAX)
        refuse_older_order(text, SHAPE_SYNTAX, (n, k))
        check_problem(1, n, k)
        return n, k

    def parse_problem(self, text: str, dtypes: str | None = None) -> RouterProblem:
        """`M,N,K` with N <= K, or named (`M=12,N=256,K=7168`) for any N."""
        m, n, k = parse_ints(self, text, PROBLEM_SYNTAX)
        refuse_older_order(text, PROBLEM_SYNTAX, (m, n, k))
        x_dtype, w_dtype = (dtypes or f"{X_DTYPE},{W_DTYPE}").split(",", 1)
        return RouterProblem(m=m, n=n, k=k, x_dtype=x_dtype.strip(), w_dtype=w_dtype.strip())

    def describe_problem(self, problem) -> dict:
        return as_problem(problem)._asdict()

    def shapes_from_model(self, config: dict) -> list[tuple[int, int]]:
        """The MoE router's (N = routed experts, K = hidden_size); [] for a dense model."""
        hidden = config.get("hidden_size")
        experts = next(
            (config[f] for f in EXPERT_FIELDS if isinstance(config.get(f), int) and config[f] > 0),
            None,
        )
        if not isinstance(hidden, int) or experts is None:
            return []
        check_problem(1, experts, hidden)
        return [(experts, hidden)]

    def shapes_from_torch_model(self, model) -> list[tuple[int, int]]:
        """(N, K) of every MoE gate (its weight's shape): 2-D bf16 weights named like a router."""
        import torch

        shapes = []
        for name, parameter in model.named_parameters():
            if (
                _GATE_NAME.search(name)
                and parameter.dim() == 2
                and parameter.dtype == torch.bfloat16
                and parameter.shape[1] % K_DIVISOR == 0
            ):
                shape = (int(parameter.shape[0]), int(parameter.shape[1]))
                if shape not in shapes:
                    shapes.append(shape)
        return shapes

    def input_shapes(self, problem) -> tuple[tuple[int, int], tuple[int, int]]:
        m, n, k = as_problem(problem)[:3]
        return (m, k), (n, k)

    def output_shape(self, problem) -> tuple[int, int]:
        m, n, _ = as_problem(problem)[:3]
        return m, n

    def reference(self, x, w):
        import torch

        return torch.mm(x.float(), w.float().t())


# MoE router weights: DeepSeek/Qwen/Mixtral `...mlp.gate.weight`, gpt-oss `...router.weight`,
# DeepSeek-V3 `gate.weight`; never the dense MLP's `gate_proj` / `gate_up_proj`.
_GATE_NAME = re.compile(r"(^|\.)(gate|router)\.weight$")

# Where Hugging Face configs keep the routed expert count (DeepSeek/Kimi/GLM; Qwen-MoE;
# Mixtral/gpt-oss; ERNIE).
EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")

family = RouterGemmFamily()
Key = RouterGemmKey
