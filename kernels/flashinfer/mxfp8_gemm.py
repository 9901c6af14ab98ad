"""FlashInfer's MXFP8 GEMM on Blackwell (`mm_mxfp8(backend="cute-dsl")`, the main runner
CuteDSLMxfp8GemmRunner with its cluster split-K kernel) as a cute-aot family serving
`flashinfer.mm_mxfp8`.

FlashInfer compiles one CuTe DSL kernel per key of
`(sf_vec_size, mma_tiler_mn, cluster_shape_mn, swap_ab, use_prefetch, enable_pdl, out_dtype,
split_k_slices)` on first use and keeps `(function, max_active_clusters)` in the module dict
`gemm_base._CUTE_DSL_MM_MXFP8_KERNEL_CACHE` under `(device_index, key)`. M, N and K are runtime
values. Two things shape the binary without being in that key: the architecture (the bundle's)
and `max_active_clusters`, which FlashInfer asks the driver for on a miss
(`get_max_active_clusters(cluster_m * cluster_n * split_k)`) and compiles in. Our key holds
FlashInfer's fields and max_active_clusters; a server asks for the value of its own GPU, so a
kernel built for another GPU model is never served. The values a build uses come from GPU-model
profiles (gpu_profiles.json).

The patch replaces that dict by one that, on a miss, looks the key up in the bundles: FlashInfer's
own `if mem_key in cache: return cache[mem_key]` then hands our function to its own launch code.

Left out: FlashInfer's warp split-K runner (CuteDSLMxfp8WarpSplitKRunner). It is compiled with
`cute_ext.compile` (no TVM-FFI) from CUDA tensors and launched with cute tensors, and its keys are
per (N, K). Untuned, FlashInfer runs it first for M <= 16, N % 16 == 0, K % 256 == 0, K <= 5120
and N / 16 <= SM count; dispatch refuses exactly those problems, saying so.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import textwrap
from collections.abc import Iterator, Sequence
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
    ValueArg,
    parse_ints,
)
from cute_aot.kernels.flashinfer import REQUIRES, dtype_name
from cute_aot.kernels.flashinfer.profiles import (
    GpuProfile,
    build_profiles,
    profile,
    profile_for_device_name,
)
from cute_aot.kernels.keys import KernelKey

FAMILY = "flashinfer_mxfp8_gemm"
FAMILY_VERSION = 1
ARCHS = ("sm_100a", "sm_103a")
SF_VEC_SIZE = 32  # MXFP8: one E8M0 scale per 32 elements of K
ENABLE_PDL = True  # mm_mxfp8 builds its cute-dsl runners with enable_pdl=True on SM100/103
OUT_DTYPES = ("bfloat16", "float16")  # what _cute_dsl_gemm_mxfp8_runner accepts
MIN_N = MIN_K = 128  # _check_mm_mxfp8_problem_size

# FlashInfer's cache key, by the names its runner gives the fields: the patch refuses a
# FlashInfer whose key differs (check_flashinfer).
FLASHINFER_KEY = (
    "sf_vec_size",
    "mma_tiler_mn",
    "cluster_shape_mn",
    "swap_ab",
    "use_prefetch",
    "enable_pdl",
    "out_dtype",
    "split_k_slices",
)
CACHE_MODULE = "flashinfer.gemm.gemm_base"
CACHE_DICT = "_CUTE_DSL_MM_MXFP8_KERNEL_CACHE"
RUNNER_FACTORY = "_cute_dsl_gemm_mxfp8_runner"
AUTOTUNE_OP = "mxfp8_gemm"
RUNNER_CLASS = "CuteDSLMxfp8GemmRunner"

# The runner's untuned tactic (forward's fallback_tactic): M <= 32 (the split-K kernel's MAX_M)
# with a contiguous output -> a narrow swapped tile; otherwise 128x128.
LOW_M_MAX = 32
DEFAULT_TILE = (128, 128)
# The warp split-K runner's envelope (dense_mxfp8_gemm_warp_splitk.validate_inputs).
WARP_MAX_M = 16
WARP_MAX_K = 5120
WARP_K_TILES = (256, 512)
WARP_MAX_K_TILES = 64
WARP_OUTPUT_TILE = 16
# Split-K kernel (Sm100BlockScaledSplitKGemmKernel): slices, and K per MMA tile for 8-bit A/B.
SPLIT_K_SLICES = (2, 4)
SPLIT_K_TILE_K = 256 * 4 // 8

# M values that each stand for one of the runner's untuned choices: M <= 8, <= 16, <= 32, > 32.
M_BUCKETS = (8, 16, 32, 128)


def tuning_buckets(max_m: int = 8192) -> tuple[int, ...]:
    """The M values FlashInfer's autotuner profiles mm_mxfp8 at (get_hybrid_num_tokens_buckets:
    powers of two to 256, steps of 256 to 2048, of 512 to 4096, then powers of two)."""
    found = [m for m in (1 << i for i in range(9)) if m <= max_m]
    found += list(range(512, min(max_m, 2048) + 1, 256))
    found += list(range(2560, min(max_m, 4096) + 1, 512))
    m = 8192
    while m <= max_m:
        found.append(m)
        m *= 2
    return tuple(found)


@dataclass(frozen=True)
class Mxfp8GemmKey(KernelKey):
    """FlashInfer's mxfp8 cache key, field for field (see FLASHINFER_KEY), plus the GPU-derived
    max_active_clusters it compiles in."""

    FAMILY = FAMILY

    sf_vec_size: int
    tile_m: int  # mma_tiler_mn
    tile_n: int
    cluster_m: int  # cluster_shape_mn
    cluster_n: int
    swap_ab: bool
    use_prefetch: bool
    enable_pdl: bool
    out_dtype: str
    split_k_slices: int
    max_active_clusters: int  # get_max_active_clusters(cluster_m * cluster_n * split_k_slices)
    version: int = FAMILY_VERSION

    @property
    def launch_cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n * self.split_k_slices

    def describe(self) -> str:
        split = f" split-K {self.split_k_slices}" if self.split_k_slices > 1 else ""
        return (
            f"tile {self.tile_m}x{self.tile_n} cluster {self.cluster_m}x{self.cluster_n}"
            f"{' swap_ab' if self.swap_ab else ''}{' prefetch' if self.use_prefetch else ''}"
            f"{split}{' pdl' if self.enable_pdl else ''} out {self.out_dtype} "
            f"max_active_clusters={self.max_active_clusters}"
        )


class Mxfp8Problem(NamedTuple):
    m: int
    n: int
    k: int
    out_dtype: str = "bfloat16"
    profile: str | None = None  # GPU model (gpu_profiles.json); None: the arch's first built


# -- FlashInfer's key <-> ours -------------------------------------------------------------------
def key_from_flashinfer(cache_key: tuple, max_active_clusters: int) -> Mxfp8GemmKey:
    """Our key of FlashInfer's cache key (its FLASHINFER_KEY fields) on a GPU whose
    get_max_active_clusters gave `max_active_clusters` for the key's launch cluster size."""
    if len(cache_key) != len(FLASHINFER_KEY):
        raise UnsupportedProblemError(
            f"{FAMILY}: FlashInfer's key has {len(cache_key)} fields, not {len(FLASHINFER_KEY)}"
        )
    sf_vec, (tile_m, tile_n), (cluster_m, cluster_n), swap, prefetch, pdl, out, split = cache_key
    return Mxfp8GemmKey(
        int(sf_vec),
        int(tile_m),
        int(tile_n),
        int(cluster_m),
        int(cluster_n),
        bool(swap),
        bool(prefetch),
        bool(pdl),
        dtype_name(out),
        int(split),
        int(max_active_clusters),
    )


def flashinfer_key(key: Mxfp8GemmKey) -> tuple:
    """FlashInfer's cache key of our key (tests compare the two)."""
    from cute_aot.kernels.flashinfer import torch_dtype

    return (
        key.sf_vec_size,
        (key.tile_m, key.tile_n),
        (key.cluster_m, key.cluster_n),
        key.swap_ab,
        key.use_prefetch,
        key.enable_pdl,
        torch_dtype(key.out_dtype),
        key.split_k_slices,
    )


def launch_cluster_size(cache_key: tuple) -> int:
    """FlashInfer's launch cluster size of its key: cluster_m * cluster_n * split_k."""
    cluster_m, cluster_n = cache_key[2]
    return int(cluster_m) * int(cluster_n) * int(cache_key[7])


# -- FlashInfer's untuned rules --------------------------------------------------------------------
def warp_splitk_k_supported(k: int) -> bool:
    return 0 < k <= WARP_MAX_K and any(
        k % tile == 0 and k // tile <= WARP_MAX_K_TILES for tile in WARP_K_TILES
    )


def warp_splitk_serves(m: int, n: int, k: int) -> bool:
    """The warp split-K runner's supports_inputs (packed, aligned operands assumed)."""
    return 1 <= m <= WARP_MAX_M and n % WARP_OUTPUT_TILE == 0 and warp_splitk_k_supported(k)


def warp_splitk_first(m: int, n: int, k: int, sm_count: int) -> bool:
    """_cute_dsl_mxfp8_runners: untuned, the warp split-K runner goes first while its 16-wide
    output tiles fit in one wave."""
    return warp_splitk_serves(m, n, k) and n // WARP_OUTPUT_TILE <= sm_count


def narrow_tile_n(m: int) -> int:
    return 8 if m <= 8 else 16 if m <= 16 else 32


def check_problem(problem: Mxfp8Problem) -> None:
    """FlashInfer's own checks of mm_mxfp8 that decide whether a kernel is asked for at all."""
    if problem.m < 1 or problem.n < MIN_N or problem.k < MIN_K:
        raise UnsupportedProblemError(
            f"{FAMILY}: mm_mxfp8 takes M >= 1, N >= {MIN_N}, K >= {MIN_K}; got "
            f"M={problem.m} N={problem.n} K={problem.k}"
        )
    if problem.out_dtype not in OUT_DTYPES:
        raise UnsupportedProblemError(
            f"{FAMILY}: the cute-dsl runner writes {' or '.join(OUT_DTYPES)}, not "
            f"{problem.out_dtype}"
        )


def resolve_profile(problem: Mxfp8Problem, arch: str) -> GpuProfile:
    if problem.profile is None:
        built = build_profiles(arch)
        if not built:
            raise UnsupportedProblemError(f"{FAMILY}: no GPU profile is built for {arch}")
        return built[0]
    found = profile(problem.profile)
    if found.arch != arch:
        raise UnsupportedProblemError(
            f"{FAMILY}: GPU profile {found.name} is {found.arch}, not {arch}"
        )
    return found


def tactic_key(tactic: Sequence, out_dtype: str, gpu: GpuProfile) -> Mxfp8GemmKey:
    """The key FlashInfer compiles for a runner tactic (mma_tiler_mn, cluster_shape_mn, swap_ab,
    use_prefetch, split_k_slices) on a GPU of profile `gpu`."""
    (tile_m, tile_n), (cluster_m, cluster_n), swap, prefetch, split = tactic
    return Mxfp8GemmKey(
        SF_VEC_SIZE,
        int(tile_m),
        int(tile_n),
        int(cluster_m),
        int(cluster_n),
        bool(swap),
        bool(prefetch),
        ENABLE_PDL,
        out_dtype,
        int(split),
        gpu.clusters(int(cluster_m) * int(cluster_n) * int(split)),
    )


@functools.lru_cache(maxsize=4096)
def _dispatch(problem: Mxfp8Problem, arch: str) -> Dispatch:
    check_problem(problem)
    gpu = resolve_profile(problem, arch)
    m, n, k = problem.m, problem.n, problem.k
    if warp_splitk_first(m, n, k, gpu.sm_count):
        raise UnsupportedProblemError(
            f"{FAMILY}: untuned, FlashInfer runs its warp split-K kernel for M={m} N={n} K={k} "
            f"(M <= {WARP_MAX_M}, N % {WARP_OUTPUT_TILE} == 0, K % 256 == 0, K <= {WARP_MAX_K} "
            f"and N/16 = {n // WARP_OUTPUT_TILE} <= {gpu.sm_count} SMs of {gpu.name}); this "
            f"family builds only the main runner"
        )
    if m <= LOW_M_MAX:
        tactic = ((128, narrow_tile_n(m)), (1, 1), True, False, 1)
        rule = (
            f"M={m} <= {LOW_M_MAX} with a contiguous output: the runner's low-M fallback, tile "
            f"128x{narrow_tile_n(m)} (the narrowest of 8/16/32 covering M), A and B swapped"
        )
    else:
        tactic = (DEFAULT_TILE, (1, 1), False, False, 1)
        rule = f"M={m} > {LOW_M_MAX}: the runner's default tactic, tile 128x128"
    key = tactic_key(tactic, problem.out_dtype, gpu)
    reason = (
        f"{rule}, cluster 1x1, no split-K, PDL on (mm_mxfp8's cute-dsl runner, untuned); "
        f"max_active_clusters={key.max_active_clusters} of {gpu.name} for cluster size 1; "
        f"M, N, K symbolic; built for {arch}"
    )
    return Dispatch(key, reason)


# -- the tactic space FlashInfer's autotuner tries ---------------------------------------------
def _approximate_ctas(m: int, n: int, tile: tuple, cluster: tuple) -> int:
    ctas_m = ((m + tile[0] - 1) // tile[0] + cluster[0] - 1) // cluster[0] * cluster[0]
    ctas_n = ((n + tile[1] - 1) // tile[1] + cluster[1] - 1) // cluster[1] * cluster[1]
    return ctas_m * ctas_n


def runner_tactics(m: int, n: int, k: int, out_dtype: str, sm_count: int) -> list[tuple]:
    """CuteDSLMxfp8GemmRunner.get_valid_tactics for a contiguous output, with FlashInfer's own
    can_implement and candidate lists (imports flashinfer: builds only)."""
    import cutlass
    from flashinfer.gemm.kernels.dense_blockscaled_gemm_sm100 import (
        Sm100BlockScaledPersistentDenseGemmKernel as DenseKernel,
    )
    from flashinfer.gemm.kernels.dense_blockscaled_gemm_sm100_splitk import (
        Sm100BlockScaledSplitKGemmKernel as SplitKernel,
    )
    from flashinfer.gemm.kernels.utils import (
        _CLUSTER_SHAPE_MN_CANDIDATES,
        _SM100_MMA_TILER_MN_CANDIDATES,
    )

    ab, sf = cutlass.Float8E4M3FN, cutlass.Float8E8M0FNU
    c = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}[out_dtype]
    warp_serves = warp_splitk_serves(m, n, k)
    if warp_serves and m <= 8:
        return [(SplitKernel.mma_tiler_mn_for_m(m), (1, 1), True, False, 1)]
    tactics = []
    if n % 8 == 0:
        for tile in _SM100_MMA_TILER_MN_CANDIDATES:
            for cluster in _CLUSTER_SHAPE_MN_CANDIDATES:
                for swap in (False, True):
                    kernel_m, kernel_n = (n, m) if swap else (m, n)
                    if not DenseKernel.can_implement(
                        ab,
                        sf,
                        SF_VEC_SIZE,
                        c,
                        tile,
                        cluster,
                        kernel_m,
                        kernel_n,
                        k,
                        1,
                        "k",
                        "k",
                        "m" if swap else "n",
                    ):
                        continue
                    for prefetch in (False, True):
                        if prefetch:
                            ratio = _approximate_ctas(kernel_m, kernel_n, tile, cluster) / sm_count
                            if not (0.5 < ratio < 1.0 or k >= 8192):
                                continue
                        tactics.append((tuple(tile), tuple(cluster), swap, prefetch, 1))
    for split in SplitKernel.SUPPORTED_SPLIT_K_SLICES:
        if warp_serves and k < 4096:
            continue
        if SplitKernel.is_valid_tactic(m, k, ab, split):
            tactics.append((SplitKernel.mma_tiler_mn_for_m(m), (1, 1), True, False, split))
    return tactics


# -- FlashInfer's saved autotuning -----------------------------------------------------------------
def tuned_tactics(path: Path) -> list[tuple[str, str, tuple]]:
    """(GPU name, out dtype, tactic) of every mxfp8_gemm main-runner entry of a FlashInfer
    autotune cache file (autotune(cache=FILE) / AutoTuner.save_configs: {str(key_fields):
    [runner class name, tactic, ...], "_metadata": {"gpu": ...}}; key_fields is (custom_op,
    runner class name, nearest profile, extras), extras (str(out dtype), enable_pdl))."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedProblemError(f"{FAMILY}: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        return []
    gpu = str((data.get("_metadata") or {}).get("gpu", "unknown"))
    found = []
    for file_key, value in data.items():
        if file_key.startswith("_") or not isinstance(value, list) or len(value) < 2:
            continue
        try:
            op, runner, _profile, extras = ast.literal_eval(file_key)
        except (ValueError, SyntaxError, TypeError):
            continue
        if op != AUTOTUNE_OP or runner != RUNNER_CLASS or value[0] != RUNNER_CLASS:
            continue
        tactic = value[1]
        if not isinstance(tactic, list) or len(tactic) != 5:
            continue  # -1: the runner's untuned fallback, which the default keys cover
        out = str(extras[0]).removeprefix("torch.") if extras else "bfloat16"
        (tile, cluster, swap, prefetch, split) = tactic
        found.append((gpu, out, (tuple(tile), tuple(cluster), bool(swap), bool(prefetch), split)))
    return found


# -- serving -----------------------------------------------------------------------------------
def _cache_key_names(runner_factory) -> tuple[str, ...] | None:
    """The names in `cache_key = (...)` of FlashInfer's runner source (None: not found)."""
    source = textwrap.dedent(inspect.getsource(inspect.unwrap(runner_factory)))
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["cache_key"]
            and isinstance(node.value, ast.Tuple)
        ):
            return tuple(getattr(element, "id", "?") for element in node.value.elts)
    return None


def check_flashinfer(gemm_base) -> None:
    """Refuse a FlashInfer whose mxfp8 cache differs from what this family mirrors: the key's
    fields, the dict it lives in, and the compile helper's (cache, key, ...) lookup."""
    cache = getattr(gemm_base, CACHE_DICT)
    if not isinstance(cache, dict):
        raise TypeError(f"FlashInfer's {CACHE_DICT} is a {type(cache).__name__}, not a dict")
    found = _cache_key_names(getattr(gemm_base, RUNNER_FACTORY))
    if found != FLASHINFER_KEY:
        raise TypeError(
            f"FlashInfer's mxfp8 cache key {found} is not the key {FLASHINFER_KEY} that "
            f"{FAMILY} mirrors"
        )
    compile_parameters = tuple(inspect.signature(gemm_base._compile_block_scaled_gemm).parameters)
    if compile_parameters[:2] != ("cache", "cache_key") or "device_index" not in compile_parameters:
        raise TypeError(
            f"FlashInfer's _compile_block_scaled_gemm{compile_parameters} does not look its "
            f"kernels up as (cache, cache_key, ..., device_index) any more"
        )


def device_arch(device_index: int) -> str | None:
    import torch

    return arch_for_capability(*torch.cuda.get_device_capability(device_index))


def max_active_clusters(cluster_size: int) -> int:
    """What FlashInfer compiles in for this launch cluster size on this GPU: its own query
    (looked up at call time, like FlashInfer does)."""
    from flashinfer.cute_dsl import utils

    return int(utils.get_max_active_clusters(cluster_size))


def _problem_details(key: Mxfp8GemmKey, device_index: int) -> dict[str, Any]:
    return {"tactic": key.describe(), "device": device_index, "M, N, K": "runtime"}


class ServingKernelCache(dict):
    """FlashInfer's mxfp8 kernel cache, filled from the bundles on a miss: `mem_key in cache`
    (FlashInfer's only question before compiling) answers True when a bundle holds the key,
    which then sits in the dict as FlashInfer's own `(function, max_active_clusters)`."""

    def __init__(self, original: dict, serving):
        super().__init__(original)
        self.original = original
        self.serving = serving

    def __contains__(self, mem_key) -> bool:
        if dict.__contains__(self, mem_key):
            return True
        found = self.lookup(mem_key)
        if found is None:
            return False
        self[mem_key] = found
        return True

    def lookup(self, mem_key) -> tuple | None:
        """(bundle function, max_active_clusters) for FlashInfer's (device_index, key), or None
        where FlashInfer compiles it itself."""
        try:
            device_index, cache_key = mem_key
            clusters = max_active_clusters(launch_cluster_size(cache_key))
            key = key_from_flashinfer(cache_key, clusters)
        except (UnsupportedProblemError, TypeError, ValueError, IndexError):
            return None  # not a key we mirror: FlashInfer's own business
        arch = device_arch(device_index)
        if arch not in ARCHS:
            return None
        function = self.serving.function(key, arch, _problem_details(key, device_index))
        return None if function is None else (function, clusters)


def _tensor(name, dtype, rank, layout, align=16, output=False) -> TensorArg:
    return TensorArg(name, dtype, rank, layout=layout, align_bytes=align, output=output)


class Mxfp8GemmFamily(KernelFamily, Tuner):
    """The family contract for FlashInfer's mm_mxfp8 cute-dsl main runner on SM100/SM103."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = Mxfp8GemmKey
    archs = ARCHS
    serves = "flashinfer.mm_mxfp8"
    requires = REQUIRES
    foreign_sources = tuple(
        ("flashinfer-python", f"flashinfer/gemm/{name}.py")
        for name in (
            "gemm_mm_fp4_cute_dsl",
            "kernels/dense_blockscaled_gemm_sm100",
            "kernels/dense_blockscaled_gemm_sm100_common",
            "kernels/dense_blockscaled_gemm_sm100_splitk",
        )
    ) + (("flashinfer-python", "flashinfer/cute_dsl/utils.py"),)
    # What CuteDSLMxfp8GemmRunner.forward passes, in order; the stream is TVM-FFI's env stream.
    abi = (
        _tensor("mA", "float8_e4m3fn", 2, "(rows, K) row-major: A, or B^T when swap_ab"),
        _tensor("mB", "float8_e4m3fn", 2, "(cols, K) row-major: B^T, or A when swap_ab"),
        _tensor(
            "mC",
            "key out_dtype",
            2,
            "(M, N) row-major, or its (N, M) transpose when swap_ab",
            output=True,
        ),
        ValueArg("sf_m", "int64"),
        ValueArg("sf_n", "int64"),
        ValueArg("sf_k", "int64"),
        ValueArg("a_sf_ptr", "pointer"),
        ValueArg("b_sf_ptr", "pointer"),
        _tensor("alpha", "float32", 1, "[1]", align=4),
    )
    builder = "cute_aot.kernels.flashinfer.mxfp8_gemm_build"
    # (N, K) weights: DeepSeek-V3 (q_a+kv_a fused, q_b, o_proj), Llama-3.1-8B (qkv, k/v
    # projection, o_proj). Keys do not depend on N and K except through the warp split-K rule.
    default_shapes = (
        (2112, 7168),
        (24576, 1536),
        (7168, 16384),
        (6144, 4096),
        (1024, 4096),
        (4096, 4096),
    )
    shape_syntax = "N,K"

    # -- problems ---------------------------------------------------------------------------------
    def dispatch(self, problem, arch: str) -> Dispatch:
        problem = Mxfp8Problem(*problem)
        return _dispatch(problem, self.check_arch(arch))

    def problems(self, shape) -> Iterator[Mxfp8Problem]:
        """One M per untuned choice of the runner, each output dtype."""
        n, k = shape
        for out in OUT_DTYPES:
            for m in M_BUCKETS:
                yield Mxfp8Problem(m, n, k, out)

    def served(self, problem: Mxfp8Problem, arch: str) -> bool:
        """Whether FlashInfer's untuned choice for `problem` is this family's runner."""
        gpu = resolve_profile(problem, arch)
        return not warp_splitk_first(problem.m, problem.n, problem.k, gpu.sm_count)

    def enumerate_keys(self, arch, shapes=None, table=None) -> list[Mxfp8GemmKey]:
        """Per GPU profile built for `arch`: the keys of every problem this runner serves
        untuned (the warp split-K runner's problems are left out)."""
        arch = normalize_arch(arch)
        shapes = self.default_shapes if shapes is None else shapes
        keys = set()
        for gpu in build_profiles(arch):
            for shape in shapes:
                for problem in self.problems(shape):
                    problem = problem._replace(profile=gpu.name)
                    if self.served(problem, arch):
                        keys.add(self.dispatch(problem, arch).key)
        return sorted(keys, key=lambda key: key.canonical_json())

    def parse_shape(self, text: str) -> tuple[int, ...]:
        n, k = parse_ints(self, text, self.shape_syntax)
        check_problem(Mxfp8Problem(1, n, k))
        return n, k

    def parse_problem(self, text: str, dtypes: str | None = None) -> Mxfp8Problem:
        """ "M,N,K" and optionally the output dtype (bfloat16, float16)."""
        m, n, k = parse_ints(self, text, "M,N,K")
        return Mxfp8Problem(m, n, k, (dtypes or "bfloat16").strip())

    def describe_problem(self, problem) -> dict[str, Any]:
        return Mxfp8Problem(*problem)._asdict()

    def shapes_from_model(self, config: dict[str, Any]) -> list[tuple[int, ...]]:
        """A dense decoder's linear layers (hidden_size, intermediate_size, heads)."""
        try:
            hidden = int(config["hidden_size"])
            inter = int(config["intermediate_size"])
            heads = int(config["num_attention_heads"])
        except (KeyError, TypeError, ValueError):
            return []
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        shapes = [
            ((heads + 2 * kv_heads) * head_dim, hidden),
            (hidden, heads * head_dim),
            (2 * inter, hidden),
            (hidden, inter),
        ]
        return [s for s in dict.fromkeys(shapes) if s[0] >= MIN_N and s[1] >= MIN_K]

    def input_shapes(self, problem) -> tuple[tuple[int, ...], ...]:
        p = Mxfp8Problem(*problem)
        return ((p.m, p.k), (p.k, p.n))

    def output_shape(self, problem) -> tuple[int, ...]:
        p = Mxfp8Problem(*problem)
        return (p.m, p.n)

    # -- tuning -----------------------------------------------------------------------------------
    def tune_problems(self, shape) -> Iterator[Mxfp8Problem]:
        """Every M bucket FlashInfer's autotuner profiles, each output dtype."""
        n, k = shape
        for out in OUT_DTYPES:
            for m in tuning_buckets():
                yield Mxfp8Problem(m, n, k, out)

    def tune_candidates(self, problem, arch: str) -> list[Mxfp8GemmKey]:
        """Every tactic FlashInfer's autotuner would time for `problem` with this runner, per
        GPU profile built for `arch` (or the problem's): aot-build --all-tactics."""
        problem = Mxfp8Problem(*problem)
        arch = normalize_arch(arch)
        check_problem(problem)
        gpus = (resolve_profile(problem, arch),) if problem.profile else build_profiles(arch)
        keys = []
        for gpu in gpus:
            for tactic in runner_tactics(
                problem.m, problem.n, problem.k, problem.out_dtype, gpu.sm_count
            ):
                keys.append(tactic_key(tactic, problem.out_dtype, gpu))
        return list(dict.fromkeys(keys))

    def keys_from_tuning_cache(self, path: Path, arch: str) -> list[Mxfp8GemmKey]:
        """The main-runner tactics of FlashInfer's autotune cache, for the GPU profile of the
        file's GPU when it is one of `arch`'s, else for the profiles built for `arch`."""
        arch = normalize_arch(arch)
        if arch not in self.archs:
            return []
        keys = []
        for gpu_name, out, tactic in tuned_tactics(path):
            gpu = profile_for_device_name(gpu_name)
            gpus = (gpu,) if gpu is not None and gpu.arch == arch else build_profiles(arch)
            if gpu is not None and gpu.arch != arch:
                continue  # tuned on another architecture's GPU
            if out not in OUT_DTYPES:
                continue
            keys += [tactic_key(tactic, out, found) for found in gpus]
        return list(dict.fromkeys(keys))

    # -- serving ----------------------------------------------------------------------------------
    def patches(self, serving) -> list[Patch]:
        from flashinfer.gemm import gemm_base

        check_flashinfer(gemm_base)
        return [
            Patch(gemm_base, CACHE_DICT, lambda original: ServingKernelCache(original, serving))
        ]


family = Mxfp8GemmFamily()
