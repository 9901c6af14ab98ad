"""FlashInfer's TGV BF16 GEMM (`mm_bf16(backend="tgv")`, its CuTe DSL path) on Blackwell, as a
cute-aot family serving `flashinfer.mm_bf16`.

out[M, N] = a[M, K] @ b[K, N] (+ bias[N]), where b is the transpose of a row-major weight [N, K].
FlashInfer's `tgv_gemm_cute_ext.run_tgv_cute_ext(a, b, bias, out, pdl, tactic)` swaps A and B
(the kernel's A is b.T = the weight [L, N, K], its B is a.T [L, K, M], its C is out.T [L, N, M],
2-D calls lifted to L = 1), detects which dimension of each view has stride 1, and compiles on
first use one kernel per `_get_compiled_cute_ext_kernel(dtype, cta_m, cta_n, cta_k, num_ab_stage,
use_2cta, use_pdl, has_bias, a_leading, b_leading, c_leading, arch)`. That key is ours, field by
field, plus the code generation target (sm_100a or sm_103a: FlashInfer's key leaves it to the
machine that compiles; its own "arch" field only sizes the dynamic shared memory request). M, N,
K and the batch are runtime values: one binary serves every shape of its key.

Untuned, FlashInfer runs tactic 1 (64 x 8 x 128 tiles, 8 stages, 1 CTA) with the caller's PDL
flag; pdl=None (leave it to the autotuner) runs without PDL until a tuned entry says otherwise.
Under `flashinfer.autotune()` any of the 29 SM100/SM103 tactics may win, with or without PDL:
`aot-build --all-tactics` builds them all, `--flashinfer-tuned FILE` the ones a saved autotuning
chose.

The patch replaces `run_tgv_cute_ext` itself: FlashInfer's compile cache holds functions that
take CuTe DSL tensors and an explicit stream, which a TVM-FFI function does not, and TGVRunner
imports `run_tgv_cute_ext` from its module at every call. The replacement does what FlashInfer's
does up to its compile lookup (with FlashInfer's own helpers for the tactic table and the
leading-dimension rule), then calls the bundle's function with the swapped torch views. Anything
it does not serve (SM107 tactics, other GPUs, a miss in mode auto) goes to FlashInfer's original.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.arch import arch_for_capability, normalize_arch
from cute_aot.kernels.contract import (
    Dispatch,
    KernelFamily,
    Patch,
    TensorArg,
    Tuner,
    parse_ints,
)
from cute_aot.kernels.flashinfer import REQUIRES, dtype_name
from cute_aot.kernels.keys import KernelKey

FAMILY = "flashinfer_tgv_gemm"
FAMILY_VERSION = 1
KERNEL_MODULE = "flashinfer/gemm/kernels/tgv_gemm_cute_ext.py"
CACHE_FUNCTION = "_get_compiled_cute_ext_kernel"
PATCHED_FUNCTION = "run_tgv_cute_ext"

# FlashInfer's compile-cache key, in order (the parameters of CACHE_FUNCTION and the positions of
# the tuple it caches under), and the field of ours holding each.
FLASHINFER_KEY = (
    "dtype",
    "cta_m",
    "cta_n",
    "cta_k",
    "num_ab_stage",
    "use_2cta",
    "use_pdl",
    "has_bias",
    "a_leading",
    "b_leading",
    "c_leading",
    "arch",
)
OUR_FIELD = {name: name for name in FLASHINFER_KEY} | {"arch": "smem_arch"}
RUN_PARAMETERS = ("a", "b", "bias", "out", "pdl", "tactic")
# FlashInfer's helpers the replacement calls, so that its rules cannot drift from FlashInfer's.
HELPERS = (
    "_resolve_tactic",
    "_detect_leading_dim",
    "_TGV_CUTE_EXT_CTA_K",
    "_TGV_CUTE_EXT_FIRST_SM107_TACTIC",
    "_TGV_CUTE_EXT_TACTIC_CONFIGS",
)

# FlashInfer's `_TGV_CUTE_EXT_TACTIC_CONFIGS[:29]` (cta_m, cta_n, num_ab_stage, use_2cta), the
# tactics sized for the SM100/SM103 shared memory; ids 29-46 need SM107's. A test compares them.
TACTICS = (
    (64, 8, 6, False),
    (64, 8, 8, False),
    (64, 8, 10, False),
    (64, 8, 12, False),
    (64, 16, 6, False),
    (64, 16, 8, False),
    (64, 16, 11, False),
    (64, 32, 6, False),
    (64, 32, 9, False),
    (64, 64, 7, False),
    (64, 128, 4, False),
    (128, 8, 6, False),
    (128, 16, 6, False),
    (128, 32, 5, False),
    (128, 64, 4, False),
    (128, 128, 3, False),
    (64, 16, 6, True),
    (64, 16, 8, True),
    (64, 16, 12, True),
    (64, 32, 6, True),
    (64, 32, 8, True),
    (64, 32, 11, True),
    (64, 64, 6, True),
    (64, 64, 9, True),
    (64, 128, 7, True),
    (128, 16, 6, True),
    (128, 32, 6, True),
    (128, 64, 5, True),
    (128, 128, 4, True),
)
TACTIC_OF = {config: tactic for tactic, config in enumerate(TACTICS)}
DEFAULT_TACTIC = 1  # FlashInfer's _TGV_CUTE_EXT_DEFAULT_TACTIC
CTA_K = 128
SMEM_ARCH = "sm_100"  # FlashInfer's key "arch" for tactics 0-28 ("sm_107" for the others)
DTYPES = ("bfloat16", "float16")  # FlashInfer's _TORCH_TO_CUTLASS_DTYPE; mm_bf16 takes bf16 only
# Leading (stride-1) dimension of the swapped 3-D views, as FlashInfer detects it: a row-major
# activation a[M, K], the documented weight layout b = w.T (w[N, K] row-major) and a row-major
# out[M, N] give the weight view [L, N, K] K-contiguous (2), a.T [L, K, M] K-contiguous (1),
# out.T [L, N, M] N-contiguous (1).
ROW_MAJOR = (2, 1, 1)
OPERAND_ALIGN = 32  # FlashInfer's from_dlpack(..., assumed_align=32) of a, b and c
TUNING_RUNNER = "TGVRunner"  # the class name FlashInfer's autotuner records

# Where TGV is meant to run: decode-sized M against projection weights (N, K) within the
# 2048 <= K <= 6144, N >= 1024 gate of the offline tuning (kernels.md §2). The keys do not
# depend on them (M, N, K are runtime); they are what `aot-cache explain` and the build name.
DEFAULT_SHAPES = (
    (1280, 2880),  # gpt-oss: qkv_proj at tensor parallel 4 (5120 / 4 outputs, hidden 2880)
    (2880, 4096),  # gpt-oss-120b: o_proj (64 heads x 64 -> hidden 2880)
    (6144, 4096),  # Llama-3.1-8B: qkv_proj ((32 + 2 x 8) heads x 128, hidden 4096)
    (4096, 4096),  # Llama-3.1-8B: o_proj
    (7168, 2048),  # DeepSeek-V3: o_proj at tensor parallel 8 (128 x 128 / 8 -> hidden 7168)
)


@dataclass(frozen=True)
class TgvGemmKey(KernelKey):
    """FlashInfer's TGV compile-cache key, field for field (see FLASHINFER_KEY); the target
    architecture is the bundle's."""

    FAMILY = FAMILY

    dtype: str  # of a, b, out (and bias)
    cta_m: int
    cta_n: int
    cta_k: int
    num_ab_stage: int
    use_2cta: bool
    use_pdl: bool
    has_bias: bool
    a_leading: int  # stride-1 dimension of the weight view [L, N, K]
    b_leading: int  # of the activation view [L, K, M]
    c_leading: int  # of the output view [L, N, M]
    smem_arch: str  # FlashInfer's "arch": the shared memory the launch requests ("sm_100")
    version: int = FAMILY_VERSION

    @property
    def tactic(self) -> int | None:
        """FlashInfer's tactic id of this configuration (None: not an SM100/SM103 tactic)."""
        return TACTIC_OF.get((self.cta_m, self.cta_n, self.num_ab_stage, self.use_2cta))

    def describe(self) -> str:
        tactic = "?" if self.tactic is None else self.tactic
        return (
            f"tactic {tactic} ({self.cta_m}x{self.cta_n}x{self.cta_k}, {self.num_ab_stage} "
            f"stages, {2 if self.use_2cta else 1}-CTA){' pdl' if self.use_pdl else ''}"
            f"{' bias' if self.has_bias else ''} {self.dtype} leading "
            f"{self.a_leading}{self.b_leading}{self.c_leading}"
        )


class TgvProblem(NamedTuple):
    m: int
    n: int
    k: int
    has_bias: bool = False
    pdl: bool | None = False  # mm_bf16's default; None leaves it to the autotuner
    tactic: int = -1  # what TGVRunner passes: -1 untuned (FlashInfer's default tactic)
    dtype: str = "bfloat16"
    a_leading: int = ROW_MAJOR[0]
    b_leading: int = ROW_MAJOR[1]
    c_leading: int = ROW_MAJOR[2]

    @property
    def layout(self) -> tuple[int, int, int]:
        return (self.a_leading, self.b_leading, self.c_leading)


def _check_problem(problem: TgvProblem) -> None:
    if problem.dtype not in DTYPES:
        raise UnsupportedProblemError(
            f"{FAMILY}: FlashInfer's TGV takes {'/'.join(DTYPES)}, not {problem.dtype}"
        )
    if not all(leading in (1, 2) for leading in problem.layout):
        raise UnsupportedProblemError(
            f"{FAMILY}: leading dimensions are 1 or 2 (of the 3-D views), got {problem.layout}"
        )
    if problem.tactic >= len(TACTICS):
        raise UnsupportedProblemError(
            f"{FAMILY}: tactic {problem.tactic} is not one of FlashInfer's 0-{len(TACTICS) - 1} "
            "for SM100/SM103 (29 and above need SM107's shared memory)"
        )
    if min(problem.m, problem.n, problem.k) < 1:
        raise UnsupportedProblemError(f"{FAMILY}: empty problem {problem[:3]}")


@functools.lru_cache(maxsize=1024)
def _dispatch(problem: TgvProblem, arch: str) -> Dispatch:
    _check_problem(problem)
    tactic = DEFAULT_TACTIC if problem.tactic < 0 else problem.tactic
    cta_m, cta_n, stages, use_2cta = TACTICS[tactic]
    pdl = bool(problem.pdl)  # None: FlashInfer's untuned runner (auto_pdl=False)
    key = TgvGemmKey(
        problem.dtype,
        cta_m,
        cta_n,
        CTA_K,
        stages,
        use_2cta,
        pdl,
        bool(problem.has_bias),
        *problem.layout,
        SMEM_ARCH,
    )
    if problem.tactic < 0:
        chose = f"untuned: FlashInfer's default tactic {tactic}"
    else:
        chose = f"tactic {tactic} as asked (a tuned choice)"
    if problem.pdl is None:
        why_pdl = "pdl=None: the untuned runner launches without PDL"
    else:
        why_pdl = f"pdl={pdl} as passed"
    reason = (
        f"{chose} ({cta_m}x{cta_n}x{CTA_K} tiles, {stages} stages, {2 if use_2cta else 1}-CTA); "
        f"{why_pdl}; {'with' if problem.has_bias else 'no'} bias; leading dims "
        f"{problem.layout} of the swapped views; M, N, K symbolic (FlashInfer's own cache key), "
        f"built for {arch}"
    )
    return Dispatch(key, reason)


def key_from_flashinfer(cache_key: tuple) -> TgvGemmKey:
    """Our key of a FlashInfer cache key (FLASHINFER_KEY's fields, in order)."""
    fields = dict(zip(FLASHINFER_KEY, cache_key, strict=True))
    fields["dtype"] = dtype_name(fields["dtype"])
    return TgvGemmKey(**{OUR_FIELD[name]: value for name, value in fields.items()})


def flashinfer_key(key: TgvGemmKey) -> tuple:
    """FlashInfer's cache key of our key (tests compare the two)."""
    from cute_aot.kernels.flashinfer import torch_dtype

    values = {name: getattr(key, OUR_FIELD[name]) for name in FLASHINFER_KEY}
    values["dtype"] = torch_dtype(key.dtype)
    return tuple(values[name] for name in FLASHINFER_KEY)


def check_flashinfer(module) -> None:
    """Refuse a FlashInfer whose TGV compile key, entry point or helpers differ from the ones
    we mirror (a new key field would otherwise be served a binary built without it)."""
    found = tuple(inspect.signature(getattr(module, CACHE_FUNCTION)).parameters)
    if found != FLASHINFER_KEY:
        raise TypeError(
            f"FlashInfer's {CACHE_FUNCTION}{found} is not the key {FLASHINFER_KEY} that "
            f"{FAMILY} mirrors"
        )
    run = getattr(module, PATCHED_FUNCTION)
    found = tuple(inspect.signature(getattr(run, "__wrapped__", run)).parameters)
    if found != RUN_PARAMETERS:
        raise TypeError(f"FlashInfer's {PATCHED_FUNCTION}{found} is not {RUN_PARAMETERS}")
    missing = [name for name in HELPERS if not hasattr(module, name)]
    if missing:
        raise TypeError(f"FlashInfer's {KERNEL_MODULE} has no {', '.join(missing)}")


def serving_run(original, serving, module):
    """A `run_tgv_cute_ext` that launches the bundle's kernel of FlashInfer's key, and leaves
    what no bundle holds to FlashInfer's `original`."""
    import torch

    resolve_tactic = module._resolve_tactic
    leading_dim = module._detect_leading_dim
    cta_k = module._TGV_CUTE_EXT_CTA_K
    first_sm107 = module._TGV_CUTE_EXT_FIRST_SM107_TACTIC
    # (device, dtype, tactic, pdl, bias?, leading dims) -> the bundle's function, or None where
    # FlashInfer compiles: resolved once (a miss is recorded once, not at every call), again
    # after bundles are loaded or cleared or the mode changes.
    functions = serving.resolutions()

    def run_tgv_cute_ext(a, b, bias, out, pdl, tactic):
        if tactic >= first_sm107:  # SM107-only tactics: FlashInfer's (it refuses them elsewhere)
            return original(a, b, bias, out, pdl, tactic)
        if a.dim() == 2:  # FlashInfer lifts mm to a batch of one
            a3, b3, out3 = a.unsqueeze(0), b.unsqueeze(0), out.unsqueeze(0)
        else:
            a3, b3, out3 = a, b, out
        a_, b_, c_ = b3.transpose(-2, -1), a3.transpose(-2, -1), out3.transpose(-2, -1)
        layout = (leading_dim(a_), leading_dim(b_), leading_dim(c_))
        lookup = (a.device, a.dtype, tactic, bool(pdl), bias is not None, layout)
        function = functions.get(lookup)
        if function is functions.MISSING:
            started = functions.now()
            function = _resolve(a, bias, out, pdl, tactic, layout)
            functions.put(lookup, function, started)
        if function is None:
            return original(a, b, bias, out, pdl, tactic)
        if bias is None:
            function(a_, b_, c_)
        else:
            function(a_, b_, c_, bias.as_strided(c_.shape, (0, 1, 0)))
        return out

    def _resolve(a, bias, out, pdl, tactic, layout):
        arch = _arch_of(a.device)
        if arch is None or dtype_name(a.dtype) not in DTYPES:
            return None  # a GPU or dtype we build nothing for: FlashInfer's business
        cta_m, cta_n, stages, use_2cta = resolve_tactic(tactic)
        key = TgvGemmKey(
            dtype_name(a.dtype),
            cta_m,
            cta_n,
            cta_k,
            stages,
            bool(use_2cta),
            bool(pdl),
            bias is not None,
            *layout,
            SMEM_ARCH,
        )
        details = {
            "M": out.shape[-2],
            "N": out.shape[-1],
            "K": a.shape[-1],
            "batch": a.shape[0] if a.dim() == 3 else None,
            "tactic": tactic,
            "tactic_config": key.describe(),
        }
        return serving.function(key, arch, details)

    def _arch_of(device):
        try:
            capability = torch.cuda.get_device_capability(device)
        except (AssertionError, RuntimeError, ValueError):  # not a CUDA device here
            return None
        arch = arch_for_capability(*capability)
        return arch if arch in TgvGemmFamily.archs else None

    run_tgv_cute_ext.__wrapped__ = original  # its signature is FlashInfer's
    return run_tgv_cute_ext


def keys_from_autotune_file(path: Path, arch: str) -> list[TgvGemmKey]:
    """The keys of the TGV entries in a FlashInfer autotuning file (`autotune(cache=FILE)`).

    An entry reads `"(custom_op, runner class, nearest profile, extras)": [runner class, tactic,
    ...]`. TGV's extras are `(capability,)`, plus `auto_pdl` for the op "bf16_gemm_pdl_auto"
    (pdl=None); with an explicit pdl flag the tuned tactic serves both, so both are built. The
    profile's shapes are the inputs (a, b, bias, pdl, out, workspace): bias (0,) means none. Its
    strides are not recorded: the documented row-major layout is assumed.
    """
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedProblemError(f"{path}: not a FlashInfer autotuning file ({exc})") from exc
    if not isinstance(entries, dict):
        return []
    keys = set()
    for text, value in entries.items():
        if text.startswith("_") or not isinstance(value, list) or len(value) < 2:
            continue  # _metadata, _records, _generation
        if value[0] != TUNING_RUNNER or not isinstance(value[1], int):
            continue
        try:
            _op, runner, profile, extras = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError):
            continue
        if runner != TUNING_RUNNER or not extras or arch_for_capability(*extras[0]) != arch:
            continue
        if value[1] >= len(TACTICS):
            continue  # an SM107 tactic
        pdls = (bool(extras[1]),) if len(extras) > 1 else (False, True)
        has_bias = tuple(profile[2]) != (0,)
        n, k = profile[1][-1], profile[1][-2]
        for pdl in pdls:
            problem = TgvProblem(1, max(n, 1), max(k, 1), has_bias, pdl, value[1])
            keys.add(_dispatch(problem, arch).key)
    return sorted(keys, key=lambda key: key.canonical_json())


def _tensor(name: str, layout: str, align: int = OPERAND_ALIGN, **kwargs) -> TensorArg:
    return TensorArg(name, "key dtype", 3, layout=layout, align_bytes=align, **kwargs)


class TgvGemmFamily(KernelFamily, Tuner):
    """The family contract for FlashInfer's TGV BF16 GEMM (CuTe DSL path)."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = TgvGemmKey
    archs = ("sm_100a", "sm_103a")  # tcgen05: FlashInfer's TGV requires SM100/SM103 (or SM107)
    serves = "flashinfer.mm_bf16"
    requires = REQUIRES
    foreign_sources = (
        ("flashinfer-python", KERNEL_MODULE),  # the kernel, the tactic table, the key
        ("flashinfer-python", "flashinfer/gemm/gemm_base.py"),  # TGVRunner: tactic and pdl
    )
    # What the exported function takes, in order: FlashInfer's swapped views of a call's
    # tensors (`_to_cute_swap`), as torch tensors; the stream is TVM-FFI's environment stream
    # (torch's current stream on the tensors' device).
    abi = (
        _tensor("a", "weight view b.T [L, N, K]; stride 1 at dimension key a_leading"),
        _tensor("b", "activation view a.T [L, K, M]; stride 1 at dimension key b_leading"),
        _tensor(
            "c", "output view out.T [L, N, M]; stride 1 at dimension key c_leading", output=True
        ),
        _tensor(
            "bias",
            "bias.as_strided([L, N, M], (0, 1, 0)); passed only where key has_bias",
            align=2,
            optional=True,
        ),
    )
    builder = "cute_aot.kernels.flashinfer.tgv_gemm_build"
    default_shapes = DEFAULT_SHAPES
    shape_syntax = "N,K"

    def dispatch(self, problem, arch: str) -> Dispatch:
        problem = TgvProblem(*problem)
        return _dispatch(problem, self.check_arch(arch))

    def problems(self, shape) -> Iterator[TgvProblem]:
        """A decode-sized call with and without bias, with pdl False (mm_bf16's default),
        True and None, untuned, in the documented row-major layout."""
        n, k = shape
        for has_bias in (False, True):
            for pdl in (False, True, None):
                yield TgvProblem(1, n, k, has_bias, pdl)

    def tune_problems(self, shape) -> Iterator[TgvProblem]:
        n, k = shape
        for has_bias in (False, True):
            yield TgvProblem(1, n, k, has_bias, None)

    def tune_candidates(self, problem, arch: str) -> list[TgvGemmKey]:
        """Every tactic FlashInfer's autotuner tries on SM100/SM103, with and without PDL."""
        problem = TgvProblem(*problem)
        return [
            self.dispatch(problem._replace(tactic=tactic, pdl=pdl), arch).key
            for tactic in range(len(TACTICS))
            for pdl in (False, True)
        ]

    def keys_from_tuning_cache(self, path: Path, arch: str) -> list[TgvGemmKey]:
        return keys_from_autotune_file(path, normalize_arch(arch))

    def parse_shape(self, text: str) -> tuple[int, ...]:
        """ "N,K": K a multiple of 8 (the weight's and activation's rows are TMA-loaded, whose
        global strides must be 16-byte multiples)."""
        n, k = super().parse_shape(text)
        if k % 8:
            raise UnsupportedProblemError(f"{FAMILY}: K={k} is not a multiple of 8 (TMA)")
        return n, k

    def parse_problem(self, text: str, dtypes: str | None = None) -> TgvProblem:
        """ "M,N,K" (or named, "M=1,N=1280,K=2880") then optionally "bias", "pdl" (or
        "pdl=none") and "tactic=T"."""
        parts = [part.strip() for part in text.split(",")]
        try:
            m, n, k = parse_ints(self, ",".join(parts[:3]), "M,N,K")
        except UnsupportedProblemError:
            m = n = k = 0
        named = {part.strip() for part in (dtypes or "bfloat16").split(",")}
        dtype = named.pop() if len(named) == 1 else ",".join(sorted(named))  # one for all
        problem = TgvProblem(m, n, k, dtype=dtype)
        for part in parts[3:]:
            if part == "bias":
                problem = problem._replace(has_bias=True)
            elif part in ("pdl", "pdl=none"):
                problem = problem._replace(pdl=True if part == "pdl" else None)
            elif part.startswith("tactic=") and part[7:].lstrip("-").isdigit():
                problem = problem._replace(tactic=int(part[7:]))
            else:
                m = 0
        if min(m, n, k) < 1:
            raise UnsupportedProblemError(
                f"{FAMILY}: {text!r} is not M,N,K[,bias][,pdl|pdl=none][,tactic=T]"
            )
        return problem

    def describe_problem(self, problem) -> dict[str, Any]:
        return TgvProblem(*problem)._asdict()

    def input_shapes(self, problem) -> tuple[tuple[int, ...] | None, ...]:
        p = TgvProblem(*problem)
        return ((p.m, p.k), (p.k, p.n), (p.n,) if p.has_bias else None)

    def output_shape(self, problem) -> tuple[int, ...]:
        p = TgvProblem(*problem)
        return (p.m, p.n)

    def reference(self, a, b, bias=None):
        """mm_bf16 in fp32 torch: a @ b (+ bias), rounded once to a's dtype."""
        out = a.float() @ b.float()
        if bias is not None:
            out = out + bias.float()
        return out.to(a.dtype)

    def patches(self, serving) -> list[Patch]:
        from flashinfer.gemm.kernels import tgv_gemm_cute_ext as module

        check_flashinfer(module)
        return [
            Patch(
                module,
                PATCHED_FUNCTION,
                lambda original: serving_run(original, serving, module),
            )
        ]


family = TgvGemmFamily()
