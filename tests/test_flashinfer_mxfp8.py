"""The flashinfer_mxfp8_gemm family against FlashInfer itself, on the CPU.

FlashInfer's public `mm_mxfp8(..., backend="cute-dsl")` runs here on CPU tensors with test
doubles for the device queries only (compute capability, SM count, current device, the workspace
buffer, get_max_active_clusters); everything else, its checks, runner choice, tactic and cache
key, is FlashInfer's own code. The compiled-kernel cache is where we look: its key is what our
key must mirror, and its lookup is where the bundle's function comes in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from cute_aot.artifacts.core.errors import KernelNotFoundError, UnsupportedProblemError
from cute_aot.kernels.flashinfer import mxfp8_gemm as mx
from cute_aot.kernels.flashinfer.profiles import build_profiles, profile

# FlashInfer is imported by the tests that drive it, not at collection (it imports cutlass).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer-python"
)

B200 = profile("B200")
STANDIN_MAC = {c: B200.clusters(c) for c in (1, 2, 4, 8, 16)}


def _swizzled_len(rows: int, k: int) -> int:
    return (rows + 127) // 128 * 128 * ((k // 32 + 3) // 4 * 4)


def operands(m: int, n: int, k: int):
    """mm_mxfp8's operands on the CPU: A (M, K), B = W^T (K, N) column-major, 1-D scales."""
    a = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    w = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    a_sf = torch.zeros(_swizzled_len(m, k), dtype=torch.uint8)
    b_sf = torch.zeros(_swizzled_len(n, k), dtype=torch.uint8)
    return a, w.t(), a_sf, b_sf


def install_device_doubles(monkeypatch, capability=(10, 0), sm_count=148, mac=None):
    """What needs a GPU, answered as a GPU of `capability` would (and nothing else)."""
    import flashinfer.utils as fi_utils
    from flashinfer.cute_dsl import utils as dsl_utils
    from flashinfer.gemm import gemm_base

    monkeypatch.setattr(fi_utils, "get_compute_capability", lambda device: capability)
    monkeypatch.setattr(gemm_base, "get_compute_capability", lambda device: capability)
    monkeypatch.setattr(gemm_base, "get_device_sm_count", lambda device: sm_count)
    monkeypatch.setattr(
        gemm_base,
        "_get_stream_cache_buf",
        lambda name, size, device, zero_init=False: torch.empty(size, dtype=torch.uint8),
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    mac = mac or STANDIN_MAC
    monkeypatch.setattr(dsl_utils, "get_max_active_clusters", lambda size: mac[size])


class KeyRecorder(dict):
    """Stands in for FlashInfer's kernel cache: records every key FlashInfer asks for and
    answers with a function that records its call instead of launching."""

    def __init__(self):
        super().__init__()
        self.asked: list = []
        self.calls: list = []

    def __contains__(self, mem_key):
        self.asked.append(mem_key)
        return True

    def __getitem__(self, mem_key):
        return (lambda *args: self.calls.append(args), 0)


@pytest.fixture
def flashinfer_keys(monkeypatch):
    """mm_mxfp8(backend="cute-dsl") on the CPU -> the cache keys FlashInfer asks for."""
    import flashinfer
    from flashinfer.gemm import gemm_base

    install_device_doubles(monkeypatch)
    recorder = KeyRecorder()
    monkeypatch.setattr(gemm_base, mx.CACHE_DICT, recorder)

    def ask(m, n, k, out_dtype=torch.bfloat16):
        before = len(recorder.asked)
        flashinfer.mm_mxfp8(*operands(m, n, k), out_dtype=out_dtype, backend="cute-dsl")
        assert len(recorder.asked) == before + 1, "FlashInfer did not look up exactly one kernel"
        return recorder.asked[-1]

    ask.recorder = recorder
    return ask


# -- 1. the key mirrors FlashInfer's, field by field ---------------------------------------------
def test_flashinfer_key_has_exactly_the_fields_we_mirror(flashinfer_keys):
    from flashinfer.gemm import gemm_base

    # the names in FlashInfer's source: an added field fails here
    assert mx._cache_key_names(gemm_base._cute_dsl_gemm_mxfp8_runner) == mx.FLASHINFER_KEY
    device_index, cache_key = flashinfer_keys(4, 256, 8192)
    assert device_index == 0
    assert len(cache_key) == len(mx.FLASHINFER_KEY)
    fields = dict(zip(mx.FLASHINFER_KEY, cache_key, strict=True))
    key = mx.key_from_flashinfer(cache_key, STANDIN_MAC[mx.launch_cluster_size(cache_key)])
    assert fields["sf_vec_size"] == key.sf_vec_size == 32
    assert fields["mma_tiler_mn"] == (key.tile_m, key.tile_n) == (128, 8)
    assert fields["cluster_shape_mn"] == (key.cluster_m, key.cluster_n) == (1, 1)
    assert fields["swap_ab"] is key.swap_ab is True
    assert fields["use_prefetch"] is key.use_prefetch is False
    assert fields["enable_pdl"] is key.enable_pdl is True
    assert fields["out_dtype"] == torch.bfloat16 and key.out_dtype == "bfloat16"
    assert fields["split_k_slices"] == key.split_k_slices == 1
    assert key.max_active_clusters == 148
    assert mx.flashinfer_key(key) == cache_key
    # every field of our key is FlashInfer's, or max_active_clusters, or our version
    mirrored = {
        "sf_vec_size",
        "tile_m",
        "tile_n",
        "cluster_m",
        "cluster_n",
        "swap_ab",
        "use_prefetch",
        "enable_pdl",
        "out_dtype",
        "split_k_slices",
    }
    assert set(key.fields()) - {"family"} == mirrored | {"max_active_clusters", "version"}


def test_flashinfer_keys_of_other_tactics_round_trip():
    """Every tactic the autotuner may pick maps to a key and back (split-K, clusters, fp16)."""
    tactics = mx.runner_tactics(20, 7168, 16384, "float16", B200.sm_count)
    assert any(t[4] > 1 for t in tactics) and any(t[1] != (1, 1) for t in tactics)
    for tactic in tactics:
        key = mx.tactic_key(tactic, "float16", B200)
        assert mx.key_from_flashinfer(mx.flashinfer_key(key), key.max_active_clusters) == key
        assert key.max_active_clusters == B200.clusters(key.launch_cluster_size)


def test_a_flashinfer_with_another_key_layout_is_refused(monkeypatch):
    from flashinfer.gemm import gemm_base

    mx.check_flashinfer(gemm_base)
    monkeypatch.setattr(mx, "FLASHINFER_KEY", mx.FLASHINFER_KEY + ("l2_policy",))
    with pytest.raises(TypeError, match="mirrors"):
        mx.check_flashinfer(gemm_base)
    with pytest.raises(UnsupportedProblemError, match="fields"):
        mx.key_from_flashinfer((32, (128, 8), (1, 1), True, False, True, torch.bfloat16), 1)


# -- 2. dispatch is FlashInfer's untuned choice ----------------------------------------------------
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_dispatch_reproduces_flashinfers_untuned_choice(flashinfer_keys, out_dtype):
    seen = set()
    # small operands (zeros are allocated); K > 5120 or N/16 > 148 keep the warp runner out
    for m in (1, 5, 8, 9, 16, 17, 31, 32, 33, 100, 1000):
        for n, k in ((256, 5376), (2400, 1024), (128, 8192)):
            _, cache_key = flashinfer_keys(m, n, k, out_dtype)
            expected = mx.key_from_flashinfer(cache_key, STANDIN_MAC[1])
            problem = mx.Mxfp8Problem(m, n, k, str(out_dtype).removeprefix("torch."), "B200")
            decision = mx.family.dispatch(problem, "sm_100a")
            assert decision.key == expected, (m, n, k)
            assert f"M={m}" in decision.reason
            seen.add(expected)
    assert {(key.tile_n, key.swap_ab) for key in seen} == {
        (8, True),
        (16, True),
        (32, True),
        (128, False),
    }


def test_warp_splitk_rule_is_flashinfers(monkeypatch):
    """Dispatch refuses what FlashInfer's warp split-K runner takes untuned: its envelope is
    FlashInfer's (constants, K rule) and its precedence is FlashInfer's runner order."""
    from flashinfer.gemm import gemm_base
    from flashinfer.gemm.kernels import dense_mxfp8_gemm_warp_splitk as warp

    assert (warp._MAX_M, warp._MAX_K) == (mx.WARP_MAX_M, mx.WARP_MAX_K)
    assert all(warp._k_supported(k) == mx.warp_splitk_k_supported(k) for k in range(0, 9000, 32))

    class WarpStandIn:  # FlashInfer's checks minus the CUDA-device one, which a CPU fails
        def supports_inputs(self, inputs, check_m=True):
            a, b = inputs[0], inputs[1]
            m = a.shape[0] if check_m else 1
            return mx.warp_splitk_serves(m, b.shape[1], a.shape[1])

    stand_in = WarpStandIn()
    monkeypatch.setattr(gemm_base, "_cute_dsl_warp_splitk_mxfp8_gemm_runner", lambda pdl: stand_in)
    for sm_count in (148, 160):
        monkeypatch.setattr(gemm_base, "get_device_sm_count", lambda device, s=sm_count: s)
        for m, n, k in [
            (4, 1024, 4096),
            (16, 2048, 5120),
            (17, 1024, 4096),
            (4, 4096, 4096),
            (4, 2368, 4096),
            (4, 2560, 4096),
            (8, 1024, 7168),
            (4, 1032, 4096),
        ]:
            a, b, a_sf, b_sf = operands(m, n, k)
            out = torch.empty(m, n, dtype=torch.bfloat16)
            inputs = [a, b, a_sf, b_sf, torch.bfloat16, out, None]
            runners = gemm_base._cute_dsl_mxfp8_runners(10, 0, True, torch.bfloat16, inputs)
            assert (runners[0] is stand_in) == mx.warp_splitk_first(m, n, k, sm_count), (m, n, k)
    with pytest.raises(UnsupportedProblemError, match="warp split-K"):
        mx.family.dispatch((4, 1024, 4096), "sm_100a")
    assert mx.family.dispatch((4, 1024, 7168), "sm_100a").key.tile_n == 8


def test_enumerated_keys_per_profile():
    for arch in mx.ARCHS:
        (gpu,) = build_profiles(arch)
        keys = mx.family.enumerate_keys(arch)
        assert len(keys) == 8  # 4 untuned tactics x 2 output dtypes
        assert {key.max_active_clusters for key in keys} == {gpu.clusters(1)}
    with pytest.raises(UnsupportedProblemError):
        mx.family.dispatch((4, 7168, 7168, "bfloat16", "B300"), "sm_100a")
    with pytest.raises(UnsupportedProblemError):
        mx.family.dispatch((4, 7168, 7168, "float32"), "sm_100a")


def test_keys_from_flashinfers_autotune_cache(tmp_path):
    tactic = [[256, 128], [2, 1], False, True, 1]
    split = [[128, 16], [1, 1], True, False, 2]
    profile_shapes = ((16, 7168), (7168, 2112), (1,), (1,), (), (16, 2112), (1,))
    data = {
        "_metadata": {"gpu": "NVIDIA B200", "flashinfer_version": "0.7.4"},
        str(("mxfp8_gemm", "CuteDSLMxfp8GemmRunner", profile_shapes, ("torch.bfloat16", True))): [
            "CuteDSLMxfp8GemmRunner",
            tactic,
            ["hot"],
        ],
        str(("mxfp8_gemm", "CuteDSLMxfp8GemmRunner", profile_shapes, ("torch.float16", True))): [
            "CuteDSLMxfp8GemmRunner",
            split,
        ],
        str(
            ("mxfp8_gemm", "CuteDSLMxfp8WarpSplitKRunner", profile_shapes, ("torch.bfloat16", True))
        ): ["CuteDSLMxfp8WarpSplitKRunner", [16, 8, 256, 4, 1]],
        str(("mxfp8_gemm", "CuteDSLMxfp8GemmRunner", profile_shapes, ("torch.float16", False))): [
            "CuteDSLMxfp8GemmRunner",
            -1,
        ],
        str(("fp4_gemm", "CuteDSLFp4GemmRunner", profile_shapes, ())): ["X", tactic],
    }
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(data))
    keys = mx.family.keys_from_tuning_cache(path, "sm_100a")
    assert [k.describe() for k in keys] == [
        "tile 256x128 cluster 2x1 prefetch pdl out bfloat16 max_active_clusters=74",
        "tile 128x16 cluster 1x1 swap_ab split-K 2 pdl out float16 max_active_clusters=74",
    ]
    assert mx.family.keys_from_tuning_cache(path, "sm_103a") == []  # tuned on a B200
    path.write_text(json.dumps({"_metadata": {"gpu": "NVIDIA B200"}}))
    assert mx.family.keys_from_tuning_cache(path, "sm_100a") == []


# -- 5. the patched cache, by mode -----------------------------------------------------------------
@pytest.fixture
def patched_cache(fresh_runtime, monkeypatch, settings_scope, tmp_path):
    from flashinfer.gemm import gemm_base

    from cute_aot.runtime import flashinfer as served

    install_device_doubles(monkeypatch)
    settings_scope(CUTE_AOT_MISS_LOG=str(tmp_path / "misses.jsonl"))
    original = getattr(gemm_base, mx.CACHE_DICT)
    assert served.install(["flashinfer_mxfp8_gemm"]) == {"flashinfer_mxfp8_gemm": "installed"}
    try:
        cache = getattr(gemm_base, mx.CACHE_DICT)
        assert isinstance(cache, mx.ServingKernelCache) and cache.original is original
        yield cache, tmp_path / "misses.jsonl"
    finally:
        served.uninstall(["flashinfer_mxfp8_gemm"])
    assert getattr(gemm_base, mx.CACHE_DICT) is original


MEM_KEY = (0, (32, (128, 16), (1, 1), True, False, True, torch.bfloat16, 1))


def test_mode_auto_misses_and_records(patched_cache):
    from cute_aot.runtime import set_mode

    cache, log = patched_cache
    set_mode("auto")
    assert (MEM_KEY in cache) is False
    (line,) = log.read_text().splitlines()
    record = json.loads(line)
    assert record["family"] == mx.FAMILY
    expected = mx.key_from_flashinfer(MEM_KEY[1], 148)
    assert expected.id in line and record["arch"] == "sm_100a"
    cache[MEM_KEY] = ("flashinfer's own", 148)  # what FlashInfer stores after compiling
    assert MEM_KEY in cache and cache[MEM_KEY] == ("flashinfer's own", 148)


def test_mode_aot_refuses_a_key_no_bundle_holds(patched_cache):
    from cute_aot.runtime import set_mode

    cache, log = patched_cache
    set_mode("aot")
    with pytest.raises(KernelNotFoundError):
        MEM_KEY in cache  # noqa: B015
    assert not log.exists()


def test_a_hit_is_stored_as_flashinfers_own_value(patched_cache, monkeypatch):
    from cute_aot.runtime import REGISTRY, serving
    from tests.stubs import loaded_bundle

    cache, log = patched_cache
    key = mx.key_from_flashinfer(MEM_KEY[1], 148)
    REGISTRY.add(loaded_bundle(key, "the bundle's function", "sm_100a"))  # the real registry
    served = serving.installed(mx.FAMILY)
    assert MEM_KEY in cache
    assert cache[MEM_KEY] == ("the bundle's function", 148)
    assert (served.hits, served.misses) == (1, 0)  # one lookup, of this key on sm_100a
    assert MEM_KEY in cache and served.hits == 1  # FlashInfer's dict keeps it
    # another GPU (other max_active_clusters) asks for another key; Hopper asks for none
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert (1, MEM_KEY[1]) not in cache
    assert (served.hits, served.misses) == (1, 0) and not log.exists()  # nothing was asked


# -- 3, 4. a real build, served to FlashInfer's public function ----------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from click.testing import CliRunner

    from cute_aot.aot.cli import main

    out = tmp_path_factory.mktemp("mxfp8-bundles")
    args = [
        "--arch",
        "sm100a",
        "--arch",
        "sm103a",
        "--families",
        "flashinfer_mxfp8_gemm",
        "--out",
        str(out),
        "--no-cache",
        "-j",
        "2",
    ]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_build_compiles_tcgen05_mma_for_every_key(built):
    from cute_aot.artifacts.bundle import read_bundle

    for arch in mx.ARCHS:
        manifest, _ = read_bundle(built / f"default-{arch}.cuteaot")
        assert {e.key_id for e in manifest.entries} == {
            k.id for k in mx.family.enumerate_keys(arch)
        }
        for entry in manifest.entries:
            binary = entry.gpu_binary
            assert binary["sm"] == [int(arch[3:6])]
            opcodes = {op for kernel in binary["kernels"] for op in kernel.get("opcodes", {})}
            assert any(re.fullmatch(r"UTC\w*MMA", op) for op in opcodes), (entry.key_id, opcodes)


SERVE_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
import flashinfer
from flashinfer.gemm import gemm_mm_fp4_cute_dsl
from cute_aot.runtime import REGISTRY, load_bundles, flashinfer as served
from cute_aot.kernels.flashinfer import mxfp8_gemm as mx
from test_flashinfer_mxfp8 import install_device_doubles, operands

class Patch:  # pytest's monkeypatch, minus pytest
    def setattr(self, owner, name, value):
        setattr(owner, name, value)

install_device_doubles(Patch())

def no_compile(*args, **kwargs):
    raise AssertionError("FlashInfer compiled a kernel")

gemm_mm_fp4_cute_dsl._make_blockscaled_gemm_compile_fn = no_compile
(bundle,) = load_bundles({bundle!r}, gpu_arch="sm_100a")
print("install", served.install(["flashinfer_mxfp8_gemm"]))
real = REGISTRY.bundle_function
handed, called = {{}}, []

def bundle_function(family, key_id, arch, key=None):
    function = real(family, key_id, arch)
    assert function is bundle.function(key_id)
    def stand_in(*args):
        called.append((key_id, [type(a).__name__ for a in args]))
    handed[key_id] = stand_in
    return stand_in

REGISTRY.bundle_function = bundle_function
for out_dtype in (torch.bfloat16, torch.float16):
    for m in (4, 12, 24, 100):
        before = len(called)
        out = flashinfer.mm_mxfp8(*operands(m, 256, 8192), out_dtype=out_dtype,
                                  backend="cute-dsl")
        assert len(called) == before + 1 and out.shape == (m, 256)
        print("call", json.dumps([m, str(out_dtype), called[-1][0], called[-1][1]]))
"""


@pytest.mark.slow
def test_flashinfers_public_mm_mxfp8_calls_the_bundles_functions(built, tmp_path):
    bundle = built / "default-sm_100a.cuteaot"
    script = SERVE_SCRIPT.format(tests=os.path.dirname(__file__), bundle=str(bundle))
    env = {
        **os.environ,
        "FLASHINFER_DISABLE_JIT": "1",
        "CUTE_AOT_MODE": "aot",
        "CUTE_AOT_CACHE_DIR": str(tmp_path / "cache"),
    }
    env.pop("CUTE_AOT_BUNDLES", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "install {'flashinfer_mxfp8_gemm': 'installed'}" in done.stdout
    calls = [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("call ")]
    problems = {(m, dtype.removeprefix("torch.")): key_id for m, dtype, key_id, _ in calls}
    for (m, dtype), key_id in problems.items():
        assert key_id == mx.family.dispatch((m, 256, 8192, dtype), "sm_100a").key.id
    assert set(problems.values()) == {k.id for k in mx.family.enumerate_keys("sm_100a")}
    for *_, argument_types in calls:  # FlashInfer's launch: 3 tensors, 5 ints, alpha
        assert argument_types == ["Tensor"] * 3 + ["int"] * 5 + ["Tensor"]
