"""FlashInfer's gated-delta-rule decode (GDN, the linear attention of Qwen3-Next) on Hopper, as a
cute-aot family serving `flashinfer.gdn_decode.gated_delta_rule_decode`.

FlashInfer compiles one CuTe DSL kernel per key of
`gdn_decode_nontranspose._get_compiled_decode_kernel_nontranspose(target_key, use_small_batch,
T, H, HV, K, V, dtype_key, scale, use_qk_l2norm)` on first use (1.25-1.5 s each on the H200) and
keeps it in that function's cache entry under "compiled". Our key holds the same fields (the
device index aside: the binary does not depend on it; the architecture is the bundle's). The
patch wraps that lookup: when an entry has no compiled kernel yet, the bundle's function goes
in, and FlashInfer's own code calls it exactly as it would call its own compile's result
(explicit stream argument, 12 arguments).

Batch size enters only through FlashInfer's rule B < 32 -> the small-batch kernel (grid
B*HV*8 CTAs of 128 threads), else the big-batch one (B*HV CTAs of 256 threads); every other size
is symbolic. `scale` is compared exactly: K**-0.5 (FlashInfer's default, 0.08838834764831845 at
K=128) and 1/sqrt(K) (...843) are different keys.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.arch import normalize_arch
from cute_aot.kernels.contract import (
    Dispatch,
    KernelFamily,
    Patch,
    TensorArg,
    ValueArg,
    parse_ints,
)
from cute_aot.kernels.flashinfer import REQUIRES, dtype_name
from cute_aot.kernels.keys import KernelKey

FAMILY = "flashinfer_gdn_decode"
FAMILY_VERSION = 1
SMALL_BATCH_BELOW = 32  # FlashInfer's SMALL_BATCH_THRESHOLD_NT
KERNEL_MODULE = "flashinfer/gdn_kernels/gdn_decode_nontranspose.py"
CACHE_FUNCTION = "_get_compiled_decode_kernel_nontranspose"

# FlashInfer's cache-key parameters, in order: the patch refuses a FlashInfer whose differ.
FLASHINFER_KEY = (
    "target_key",
    "use_small_batch",
    "T",
    "H",
    "HV",
    "K",
    "V",
    "dtype_key",
    "scale",
    "use_qk_l2norm",
)
# The operands whose dtypes make up FlashInfer's dtype_key, in its order, with our field names.
DTYPE_FIELDS = (
    ("h0_source", "state_dtype"),
    ("A_log", "a_log_dtype"),
    ("a", "a_dtype"),
    ("dt_bias", "dt_bias_dtype"),
    ("q", "q_dtype"),
    ("k", "k_dtype"),
    ("v", "v_dtype"),
    ("b", "b_dtype"),
    ("output", "out_dtype"),
)
# What a Qwen3-Next-style server passes: fp32 state and A_log, bf16 activations, bf16 output
# (FlashInfer allocates bf16 when no output is given); dt_bias is the model's (bf16) or fp32.
DEFAULT_DTYPES = ("float32", "float32", "bfloat16", "float32") + ("bfloat16",) * 5
DT_BIAS_DTYPES = ("float32", "bfloat16")
Q_DTYPES = ("bfloat16", "float16")

# Qwen3-Next-80B-A3B: 16 q/k heads, 32 v heads, K = V = 128; per GPU at tensor parallel 1..8.
QWEN3_NEXT = (16, 32, 128, 128)
TENSOR_PARALLEL = (1, 2, 4, 8)


@dataclass(frozen=True)
class GdnDecodeKey(KernelKey):
    """FlashInfer's nontranspose GDN decode cache key, field for field (see FLASHINFER_KEY)."""

    FAMILY = FAMILY

    small_batch: bool  # B < 32
    t: int
    h: int  # q/k heads
    hv: int  # v heads
    k: int  # key head dim
    v: int  # value head dim
    state_dtype: str
    a_log_dtype: str
    a_dtype: str
    dt_bias_dtype: str
    q_dtype: str
    k_dtype: str
    v_dtype: str
    b_dtype: str
    out_dtype: str
    scale: float  # compared exactly, as FlashInfer does
    use_qk_l2norm: bool
    version: int = FAMILY_VERSION

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(getattr(self, field) for _, field in DTYPE_FIELDS)

    def describe(self) -> str:
        batch = "B<32" if self.small_batch else "B>=32"
        return (
            f"{batch} H={self.h} HV={self.hv} K={self.k} V={self.v} q {self.q_dtype} "
            f"dt_bias {self.dt_bias_dtype} out {self.out_dtype} scale={self.scale!r}"
            f"{' l2norm' if self.use_qk_l2norm else ''}"
        )


class GdnProblem(NamedTuple):
    batch: int
    t: int
    h: int
    hv: int
    k: int
    v: int
    dtypes: tuple[str, ...] = DEFAULT_DTYPES  # FlashInfer's dtype_key order (DTYPE_FIELDS)
    scale: float | None = None  # None: FlashInfer's default K**-0.5
    use_qk_l2norm: bool = True


def check_problem(problem: GdnProblem) -> None:
    """FlashInfer's own checks of gated_delta_rule_decode, so that a refusal says why."""
    dtypes = dict(zip((name for name, _ in DTYPE_FIELDS), problem.dtypes, strict=True))
    if problem.t != 1:
        raise UnsupportedProblemError(f"{FAMILY}: decode takes T=1, got T={problem.t}")
    if problem.k < 128 or problem.v < 128 or problem.v % 32:
        raise UnsupportedProblemError(
            f"{FAMILY}: needs K >= 128, V >= 128, V % 32 == 0; got K={problem.k} V={problem.v}"
        )
    if problem.hv % problem.h:
        raise UnsupportedProblemError(
            f"{FAMILY}: HV={problem.hv} is not a multiple of H={problem.h}"
        )
    if dtypes["h0_source"] != "float32" or dtypes["A_log"] != "float32":
        raise UnsupportedProblemError(f"{FAMILY}: state and A_log must be float32")
    if dtypes["q"] not in Q_DTYPES or dtypes["dt_bias"] not in DT_BIAS_DTYPES:
        raise UnsupportedProblemError(
            f"{FAMILY}: q takes {'/'.join(Q_DTYPES)}, dt_bias {'/'.join(DT_BIAS_DTYPES)}; got "
            f"q {dtypes['q']}, dt_bias {dtypes['dt_bias']}"
        )


@functools.lru_cache(maxsize=1024)
def _dispatch(problem: GdnProblem, arch: str) -> Dispatch:
    check_problem(problem)
    scale = problem.k**-0.5 if problem.scale is None else problem.scale
    small = problem.batch < SMALL_BATCH_BELOW
    key = GdnDecodeKey(
        small,
        problem.t,
        problem.h,
        problem.hv,
        problem.k,
        problem.v,
        *problem.dtypes,
        scale,
        problem.use_qk_l2norm,
    )
    if small:
        grid = f"B={problem.batch} < {SMALL_BATCH_BELOW}: FlashInfer's small-batch kernel"
    else:
        grid = f"B={problem.batch} >= {SMALL_BATCH_BELOW}: FlashInfer's big-batch kernel"
    reason = (
        f"{grid}; H, HV, K, V, dtypes, scale={scale!r} and l2norm compiled in, the batch "
        f"symbolic (FlashInfer's own cache key, device index aside), built for {arch}"
    )
    return Dispatch(key, reason)


def key_from_flashinfer(cache_key: tuple) -> tuple[str, GdnDecodeKey]:
    """(architecture, our key) of a FlashInfer cache key (its FLASHINFER_KEY fields)."""
    target_key, small, t, h, hv, k, v, dtype_key, scale, l2norm = cache_key
    _device_index, arch = target_key
    dtypes = tuple(dtype_name(dtype) for dtype in dtype_key)
    if len(dtypes) != len(DTYPE_FIELDS):
        raise UnsupportedProblemError(f"{FAMILY}: FlashInfer's dtype_key has {len(dtypes)} dtypes")
    key = GdnDecodeKey(bool(small), t, h, hv, k, v, *dtypes, float(scale), bool(l2norm))
    return normalize_arch(arch), key


def flashinfer_key(key: GdnDecodeKey, arch: str, device_index: int = 0) -> tuple:
    """FlashInfer's cache key of our key (tests compare the two)."""
    from cute_aot.kernels.flashinfer import torch_dtype

    return (
        (device_index, arch),
        key.small_batch,
        key.t,
        key.h,
        key.hv,
        key.k,
        key.v,
        tuple(torch_dtype(name) for name in key.dtypes),
        key.scale,
        key.use_qk_l2norm,
    )


def check_flashinfer(cache_function) -> None:
    """Refuse a FlashInfer whose cache key has other fields than the ones we mirror."""
    found = tuple(inspect.signature(cache_function).parameters)
    if found != FLASHINFER_KEY:
        raise TypeError(
            f"FlashInfer's {CACHE_FUNCTION}{found} is not the key {FLASHINFER_KEY} that "
            f"{FAMILY} mirrors"
        )


def serving_lookup(original, serving):
    """FlashInfer's cache-entry lookup, filling a new entry's "compiled" from the bundle."""

    def lookup(*cache_key):
        entry = original(*cache_key)
        if "compiled" not in entry:
            try:
                arch, key = key_from_flashinfer(cache_key)
            except UnsupportedProblemError:
                return entry  # an architecture we build nothing for: FlashInfer's own business
            if arch in GdnDecodeFamily.archs:
                function = serving.function(key, arch, _problem_details(key))
                if function is not None:
                    entry["compiled"] = function
        return entry

    lookup.__wrapped__ = original
    return lookup


def _problem_details(key: GdnDecodeKey) -> dict[str, Any]:
    return {
        "batch": "B<32" if key.small_batch else "B>=32",
        "H": key.h,
        "HV": key.hv,
        "K": key.k,
        "V": key.v,
        "q": key.q_dtype,
        "dt_bias": key.dt_bias_dtype,
    }


def _tensor(
    name: str,
    dtype: str,
    rank: int,
    align: int = 16,
    layout: str = "row-major",
    output: bool = False,
) -> TensorArg:
    return TensorArg(name, dtype, rank, layout=layout, align_bytes=align, output=output)


class GdnDecodeFamily(KernelFamily):
    """The family contract for FlashInfer's GDN decode (K-major state)."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = GdnDecodeKey
    archs = ("sm_90a",)  # FlashInfer's CuTe DSL GDN decode "requires SM90"
    serves = "flashinfer.gdn_decode.gated_delta_rule_decode"
    requires = REQUIRES
    foreign_sources = tuple(
        ("flashinfer-python", f"flashinfer/gdn_kernels/{name}.py")
        for name in ("gdn_decode_nontranspose", "device_target", "cute_dsl_cache_naming")
    )
    # What FlashInfer's launch passes (run_nontranspose_decode), in order. dtypes per key.
    abi = (
        _tensor("cu_seqlens", "int32", 1),
        _tensor("q", "key q_dtype", 4, layout="strided, last dimension contiguous"),
        _tensor("k", "key k_dtype", 4, layout="strided, last dimension contiguous"),
        _tensor("v", "key v_dtype", 4, layout="strided, last dimension contiguous"),
        _tensor("a", "key a_dtype", 3, align=2, layout="strided, last dimension contiguous"),
        _tensor("b", "key b_dtype", 3, align=2, layout="strided, last dimension contiguous"),
        _tensor("A_log", "key a_log_dtype", 1, align=4),
        _tensor("dt_bias", "key dt_bias_dtype", 1, align=2),
        _tensor("h0_source", "key state_dtype", 3, layout="[B*HV, K, V], updated in place"),
        _tensor("h0_indices", "int32", 1),
        _tensor(
            "output", "key out_dtype", 4, layout="strided, last dimension contiguous", output=True
        ),
        ValueArg("stream", "stream"),
    )
    builder = "cute_aot.kernels.flashinfer.gdn_decode_build"
    default_shapes = tuple(
        (QWEN3_NEXT[0] // tp, QWEN3_NEXT[1] // tp, *QWEN3_NEXT[2:]) for tp in TENSOR_PARALLEL
    )
    shape_syntax = "H,HV,K,V"

    def dispatch(self, problem, arch: str) -> Dispatch:
        problem = GdnProblem(*problem)
        return _dispatch(problem, self.check_arch(arch))

    def problems(self, shape) -> Iterator[GdnProblem]:
        """Both batch kernels, with fp32 or bf16 dt_bias, at FlashInfer's default scale."""
        h, hv, k, v = shape
        for batch in (1, SMALL_BATCH_BELOW):
            for dt_bias in DT_BIAS_DTYPES:
                dtypes = DEFAULT_DTYPES[:3] + (dt_bias,) + DEFAULT_DTYPES[4:]
                yield GdnProblem(batch, 1, h, hv, k, v, dtypes)

    def parse_shape(self, text: str) -> tuple[int, ...]:
        shape = parse_ints(self, text, self.shape_syntax)
        check_problem(GdnProblem(1, 1, *shape))
        return shape

    def parse_problem(self, text: str, dtypes: str | None = None) -> GdnProblem:
        """ "B,H,HV,K,V" and optionally the nine dtypes of FlashInfer's dtype_key."""
        batch, h, hv, k, v = parse_ints(self, text, "B,H,HV,K,V")
        found = tuple(part.strip() for part in dtypes.split(",")) if dtypes else DEFAULT_DTYPES
        if len(found) != len(DTYPE_FIELDS):
            names = ",".join(name for name, _ in DTYPE_FIELDS)
            raise UnsupportedProblemError(f"{FAMILY}: --dtype takes nine dtypes: {names}")
        return GdnProblem(batch, 1, h, hv, k, v, found)

    def describe_problem(self, problem) -> dict[str, Any]:
        problem = GdnProblem(*problem)
        details = problem._asdict()
        details["dtypes"] = dict(
            zip((name for name, _ in DTYPE_FIELDS), problem.dtypes, strict=True)
        )
        return details

    def shapes_from_model(self, config: dict[str, Any]) -> list[tuple[int, ...]]:
        """Qwen3-Next-style configs (linear_num_key_heads, ...), per GPU at TP 1, 2, 4, 8."""
        names = (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        )
        if not all(name in config for name in names):
            return []
        h, hv, k, v = (int(config[name]) for name in names)
        return [(h // tp, hv // tp, k, v) for tp in TENSOR_PARALLEL if h % tp == 0 and hv % tp == 0]

    def input_shapes(self, problem) -> tuple[tuple[int, ...], ...]:
        p = GdnProblem(*problem)
        return (
            (p.batch + 1,),
            (p.batch, p.t, p.h, p.k),
            (p.batch, p.t, p.h, p.k),
            (p.batch, p.t, p.hv, p.v),
            (p.batch, p.t, p.hv),
            (p.batch, p.t, p.hv),
            (p.hv,),
            (p.hv,),
            (p.batch * p.hv, p.k, p.v),
            (p.batch,),
        )

    def output_shape(self, problem) -> tuple[int, ...]:
        p = GdnProblem(*problem)
        return (p.batch, p.t, p.hv, p.v)

    def reference(self, q, k, v, state, A_log, a, dt_bias, b, scale=None, use_qk_l2norm=True):
        """gated_delta_rule_decode in fp32 torch: (output [B, 1, HV, V] bf16, new state)."""
        from cute_aot.kernels.flashinfer.gdn_reference import gdn_decode_reference

        return gdn_decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale, use_qk_l2norm)

    def patches(self, serving) -> list[Patch]:
        from flashinfer.gdn_kernels import gdn_decode_nontranspose as module

        check_flashinfer(getattr(module, CACHE_FUNCTION))
        return [Patch(module, CACHE_FUNCTION, lambda original: serving_lookup(original, serving))]


family = GdnDecodeFamily()
