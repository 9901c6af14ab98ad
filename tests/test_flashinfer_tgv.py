"""FlashInfer's TGV BF16 GEMM as a cute-aot family, on the CPU: the key mirrors FlashInfer's
compile-cache key field by field, dispatch makes FlashInfer's untuned choice, keys read from a
FlashInfer autotuning file are the ones FlashInfer then asks for, the placeholders we compile from
have exactly the types FlashInfer's own compile tensors have, and FlashInfer's public `mm_bf16`
reaches the bundle's kernel through the one patched function (mode aot refuses a miss, mode auto
lets FlashInfer compile and records it).

FlashInfer's public `mm_bf16(backend="tgv")` runs here on CPU tensors with test doubles only for
what needs a GPU: the compute-capability queries (torch's and FlashInfer's cached one), torch's
CUDA version and the GPU workspace allocation. FlashInfer's own compile is intercepted at its
cache (`_TGV_CUTE_EXT_COMPILE_CACHE`), which records the key it was asked for and raises; the
kernel is never launched: the function called records its arguments instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from tests.stubs import RecordingKernel, loaded_bundle

pytest.importorskip(
    "flashinfer", reason="needs flashinfer-python (pip install 'cute-aot[flashinfer]')"
)

import flashinfer  # noqa: E402
import flashinfer.utils as flashinfer_utils  # noqa: E402
from flashinfer.gemm import gemm_base  # noqa: E402
from flashinfer.gemm.kernels import tgv_gemm_cute_ext as flashinfer_tgv  # noqa: E402

from cute_aot.artifacts.core.errors import KernelNotFoundError, UnsupportedProblemError  # noqa: E402
from cute_aot.kernels.flashinfer.tgv_gemm import (  # noqa: E402
    CTA_K,
    DEFAULT_TACTIC,
    FLASHINFER_KEY,
    OUR_FIELD,
    PATCHED_FUNCTION,
    ROW_MAJOR,
    TACTICS,
    TgvGemmKey,
    TgvProblem,
    check_flashinfer,
    family,
    flashinfer_key,
    key_from_flashinfer,
)
from cute_aot.runtime import REGISTRY, serving, set_mode  # noqa: E402
from cute_aot.runtime import flashinfer as serve_flashinfer  # noqa: E402

BF16 = torch.bfloat16
CAPABILITY = {"sm_100a": (10, 0), "sm_103a": (10, 3)}


class FlashInferCompiled(Exception):
    """FlashInfer reached its own compile: `args[0]` is the cache key it looked up."""


class RecordingCompileCache(dict):
    """Stands in for `_TGV_CUTE_EXT_COMPILE_CACHE`: records each key looked up, then raises (the
    compile that would follow needs a GPU)."""

    def __init__(self):
        super().__init__()
        self.keys = []

    def get(self, key, default=None):
        self.keys.append(key)
        raise FlashInferCompiled(key)


@pytest.fixture
def gpu(monkeypatch):
    """FlashInfer's TGV path on CPU tensors: a B200 (or, set `gpu.capability`, a B300)."""

    class Gpu:
        capability = CAPABILITY["sm_100a"]

    def capability(device=None):
        return Gpu.capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(flashinfer_utils, "get_compute_capability", capability)
    monkeypatch.setattr(gemm_base, "get_compute_capability", capability)
    monkeypatch.setattr(
        gemm_base,
        "_get_stream_cache_buf",
        lambda name, size, device, zero_init=False: torch.empty(size, dtype=torch.uint8),
    )
    cache = RecordingCompileCache()
    monkeypatch.setattr(flashinfer_tgv, "_TGV_CUTE_EXT_COMPILE_CACHE", cache)
    Gpu.cache = cache
    yield Gpu
    serve_flashinfer.uninstall()


def operands(m, n, k, bias=False, a_col=False, b_row=False, out_col=False):
    """mm_bf16's tensors: a[M, K], b[K, N] (the transpose of a row-major weight, or with b_row a
    row-major [K, N] tensor), bias[N], out[M, N]; a_col / out_col give column-major a / out."""
    a = torch.empty(k, m, dtype=BF16).T if a_col else torch.empty(m, k, dtype=BF16)
    b = torch.empty(k, n, dtype=BF16) if b_row else torch.empty(n, k, dtype=BF16).T
    out = torch.empty(n, m, dtype=BF16).T if out_col else torch.empty(m, n, dtype=BF16)
    return a, b, torch.empty(n, dtype=BF16) if bias else None, out


def flashinfers_key(gpu, call) -> tuple:
    """The compile-cache key FlashInfer looks up for `call()` (nothing installed)."""
    before = len(gpu.cache.keys)
    with pytest.raises(FlashInferCompiled):
        call()
    (key,) = gpu.cache.keys[before:]
    return key


# -- 1. the key is FlashInfer's, field by field ------------------------------------------------
def test_flashinfers_cache_key_has_exactly_the_fields_we_mirror():
    check_flashinfer(flashinfer_tgv)  # the installed FlashInfer's passes

    def upgraded(
        dtype,
        cta_m,
        cta_n,
        cta_k,
        num_ab_stage,
        use_2cta,
        use_pdl,
        has_bias,
        a_leading,
        b_leading,
        c_leading,
        arch="sm_100",
        split_k=1,
    ):
        return None

    class Upgraded:
        pass

    for name in (
        "_resolve_tactic",
        "_detect_leading_dim",
        "_TGV_CUTE_EXT_CTA_K",
        "_TGV_CUTE_EXT_FIRST_SM107_TACTIC",
        "_TGV_CUTE_EXT_TACTIC_CONFIGS",
        PATCHED_FUNCTION,
    ):
        setattr(Upgraded, name, staticmethod(getattr(flashinfer_tgv, name)))
    Upgraded._get_compiled_cute_ext_kernel = staticmethod(upgraded)
    with pytest.raises(TypeError, match="split_k"):
        check_flashinfer(Upgraded)
    Upgraded._get_compiled_cute_ext_kernel = staticmethod(
        flashinfer_tgv._get_compiled_cute_ext_kernel
    )
    check_flashinfer(Upgraded)
    del Upgraded._detect_leading_dim
    with pytest.raises(TypeError, match="_detect_leading_dim"):
        check_flashinfer(Upgraded)
    assert set(OUR_FIELD) == set(FLASHINFER_KEY) and len(FLASHINFER_KEY) == 12
    ours = [f for f in TgvGemmKey.__dataclass_fields__ if f != "version"]
    assert sorted(ours) == sorted(OUR_FIELD.values())  # nothing more, nothing less


def test_our_tactic_table_is_flashinfers():
    assert list(TACTICS) == flashinfer_tgv._TGV_CUTE_EXT_TACTIC_CONFIGS[:29]
    assert len(TACTICS) == flashinfer_tgv._TGV_CUTE_EXT_FIRST_SM107_TACTIC
    assert DEFAULT_TACTIC == flashinfer_tgv.get_tgv_cute_ext_default_tactic()
    assert CTA_K == flashinfer_tgv._TGV_CUTE_EXT_CTA_K


def test_the_autotuners_tactics_on_sm100_are_the_ones_we_build(gpu):
    """What FlashInfer's runner offers its autotuner on SM100/SM103: `tune_candidates`."""
    for capability in CAPABILITY.values():
        gpu.capability = capability
        assert flashinfer_tgv.get_tgv_cute_ext_valid_tactics(torch.device("cpu")) == list(
            range(len(TACTICS))
        )


LAYOUTS = [
    # (mm_bf16 operand options, FlashInfer's leading dims of the swapped views)
    ({}, ROW_MAJOR),
    ({"b_row": True}, (1, 1, 1)),
    ({"a_col": True}, (2, 2, 1)),
    ({"out_col": True}, (2, 1, 2)),
    ({"a_col": True, "b_row": True, "out_col": True}, (1, 2, 2)),
]


@pytest.mark.parametrize("options, layout", LAYOUTS)
@pytest.mark.parametrize("bias, pdl", [(False, False), (True, True), (True, None)])
def test_our_key_is_flashinfers_key_field_by_field(gpu, options, layout, bias, pdl):
    m, n, k = 3, 256, 512
    a, b, bias_t, out = operands(m, n, k, bias, **options)
    cache_key = flashinfers_key(
        gpu, lambda: flashinfer.mm_bf16(a, b, bias_t, pdl, out, backend="tgv")
    )
    assert len(cache_key) == len(FLASHINFER_KEY)  # an added field fails here
    key = key_from_flashinfer(cache_key)
    assert flashinfer_key(key) == cache_key
    for position, name in enumerate(FLASHINFER_KEY):
        ours = getattr(key, OUR_FIELD[name])
        theirs = cache_key[position]
        assert ours == (str(theirs).removeprefix("torch.") if name == "dtype" else theirs), name
    assert (key.a_leading, key.b_leading, key.c_leading) == layout
    problem = TgvProblem(m, n, k, bias, pdl, -1, "bfloat16", *layout)
    assert family.dispatch(problem, "sm_100a").key == key


@pytest.mark.parametrize("tactic", [0, 1, 11, 16, 24, 28])
def test_every_tactic_maps_to_flashinfers_key(gpu, tactic):
    a, b, bias, out = operands(2, 128, 256, bias=True)
    cache_key = flashinfers_key(
        gpu, lambda: flashinfer_tgv.run_tgv_cute_ext(a, b, bias, out, True, tactic)
    )
    expected = family.dispatch(TgvProblem(2, 128, 256, True, True, tactic), "sm_103a").key
    assert key_from_flashinfer(cache_key) == expected
    assert expected.tactic == tactic and cache_key[-1] == "sm_100"


def test_a_batched_call_has_the_same_key_rules(gpu):
    """bmm_bf16(backend="tgv") reaches the same function with 3-D tensors (no lifting)."""
    a = torch.empty(4, 3, 256, dtype=BF16)
    b = torch.empty(4, 128, 256, dtype=BF16).transpose(-2, -1)
    cache_key = flashinfers_key(gpu, lambda: flashinfer.bmm_bf16(a, b, backend="tgv"))
    assert (
        key_from_flashinfer(cache_key)
        == family.dispatch(TgvProblem(3, 128, 256, False, False), "sm_100a").key
    )


# -- 2. dispatch makes FlashInfer's untuned choice ---------------------------------------------
def test_dispatch_reproduces_flashinfers_untuned_choice(gpu):
    seen = set()
    for shape in family.default_shapes:
        for problem in family.problems(shape):
            for m in (1, 33):
                a, b, bias, out = operands(m, *shape, problem.has_bias)
                args = (a, b, bias, problem.pdl, out)
                cache_key = flashinfers_key(
                    gpu, lambda args=args: flashinfer.mm_bf16(*args, backend="tgv")
                )
                key = family.dispatch(problem._replace(m=m), "sm_100a").key
                assert key_from_flashinfer(cache_key) == key, (shape, problem)
                seen.add(key)
    # untuned: tactic 1 whatever the shape; pdl=None runs without PDL
    assert {(k.tactic, k.use_pdl, k.has_bias) for k in seen} == {
        (DEFAULT_TACTIC, pdl, bias) for pdl in (False, True) for bias in (False, True)
    }


def test_default_keys_and_all_tactics():
    for arch in family.archs:
        keys = family.enumerate_keys(arch)
        assert len(keys) == 4 and all(key.tactic == DEFAULT_TACTIC for key in keys)
        candidates = {
            key
            for shape in family.default_shapes
            for problem in family.tune_problems(shape)
            for key in family.tune_candidates(problem, arch)
        }
        assert len(candidates) == 29 * 2 * 2  # tactics x pdl x bias
        assert {key.tactic for key in candidates} == set(range(29))
        assert set(keys) <= candidates
    with pytest.raises(UnsupportedProblemError, match="sm_90a"):
        family.dispatch(TgvProblem(1, 1280, 2880), "sm_90a")
    with pytest.raises(UnsupportedProblemError, match="SM107"):
        family.dispatch(TgvProblem(1, 1280, 2880, tactic=29), "sm_100a")
    with pytest.raises(UnsupportedProblemError, match="float32"):
        family.dispatch(TgvProblem(1, 1280, 2880, dtype="float32"), "sm_100a")
    assert family.parse_problem("1,1280,2880,bias,pdl=none,tactic=7") == TgvProblem(
        1, 1280, 2880, True, None, 7
    )
    with pytest.raises(UnsupportedProblemError):
        family.parse_problem("1,1280,2880,split")
    with pytest.raises(UnsupportedProblemError, match="multiple of 8"):
        family.parse_shape("1280,2881")


def test_keys_from_flashinfers_autotuning_file_are_the_ones_it_then_asks_for(gpu, tmp_path):
    """Entries made by FlashInfer's own autotuner code (cache key, runner extras, save_configs);
    then FlashInfer, untuned, picks those tactics, and asks for exactly our keys."""
    from flashinfer.autotuner import AutoTuner

    tuner = AutoTuner.get()
    n, k = 1280, 2880
    a, b, bias, out = operands(1, n, k, bias=True)
    workspace = torch.empty(16, dtype=torch.uint8)
    tuned = [  # (bias, pdl, custom op, auto_pdl runner, tactic)
        (None, False, "bf16_gemm", False, 7),
        (bias, None, "bf16_gemm_pdl_auto", True, 20),
    ]
    added = []
    for bias_t, pdl, op, auto_pdl, tactic in tuned:
        inputs = [a, b, bias_t, pdl, out, workspace]
        runner = gemm_base._tgv_gemm_runner(BF16, True, auto_pdl=auto_pdl)
        cache_key = tuner._get_cache_key(
            op,
            runner,
            tuple(tuner._get_input_sizes(inputs)),
            gemm_base._BF16_GEMM_SM100_TUNING_CONFIG,
            runner.get_cache_key_extras(inputs),
        )
        tuner.profiling_cache[cache_key] = (tactic, None)
        added.append(cache_key)
    path = tmp_path / "tuned.json"
    try:
        tuner.save_configs(str(path))
        asked = [
            key_from_flashinfer(
                flashinfers_key(
                    gpu,
                    lambda b_=bias_t, p=pdl: flashinfer.mm_bf16(a, b, b_, p, out, backend="tgv"),
                )
            )
            for bias_t, pdl, *_ in tuned
        ]
    finally:
        for cache_key in added:
            tuner.profiling_cache.pop(cache_key, None)
    assert [key.tactic for key in asked] == [7, 20] and asked[1].use_pdl and asked[1].has_bias
    keys = family.keys_from_tuning_cache(path, "sm100a")
    assert set(asked) <= set(keys)
    # an explicit pdl flag: the tuned tactic serves both flags, so both are built
    assert {(key.tactic, key.use_pdl, key.has_bias) for key in keys} == {
        (7, False, False),
        (7, True, False),
        (20, True, True),
    }
    assert family.keys_from_tuning_cache(path, "sm_103a") == []  # tuned on a (10, 0) GPU
    assert _planned_keys(path, ["--families", "flashinfer_tgv_gemm", "--no-default-shapes"]) == {
        "sm_100a": sorted(keys, key=lambda key: key.symbol),
    }  # `aot-build --flashinfer-tuned FILE` builds exactly them
    empty = tmp_path / "other.json"
    empty.write_text(json.dumps({"_metadata": {}, "('x', 'CudnnRunner', (), ())": ["X", 0]}))
    assert family.keys_from_tuning_cache(empty, "sm_100a") == []


def _planned_keys(tuning_file, options) -> dict:
    """The keys `aot-build --arch sm100a --flashinfer-tuned FILE OPTIONS` would compile (its
    --dry-run)."""
    from cute_aot.aot import cli
    from cute_aot.kernels import family as installed

    args = ["--arch", "sm100a", "--flashinfer-tuned", str(tuning_file), *options]
    result = CliRunner().invoke(cli.main, [*args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    return {
        arch: [installed(key["family"]).Key.from_fields(key["key"]) for key in keys]
        for arch, keys in plan.items()
    }


# -- the placeholders we compile from are FlashInfer's compile tensors -------------------------
@pytest.mark.parametrize("a_leading", [1, 2])
@pytest.mark.parametrize("b_leading", [1, 2])
@pytest.mark.parametrize("c_leading", [1, 2])
def test_our_placeholders_have_the_types_of_flashinfers_compile_tensors(
    monkeypatch, a_leading, b_leading, c_leading
):
    """FlashInfer's `_make_compile_repr_tensors` (its CUDA tensors allocated on the CPU, handed to
    from_dlpack as DLPack tensors that claim a GPU) against tgv_gemm_build's placeholders: the
    MLIR memref types (dtype, memory space, alignment, static and dynamic strides) are equal."""
    from cutlass._mlir import ir

    from cute_aot.kernels.flashinfer import tgv_gemm_build
    from tests.test_key_properties import Desc, FakeGpuTensor

    empty = torch.empty
    monkeypatch.setattr(flashinfer_tgv.torch, "empty", lambda *a, device=None, **k: empty(*a, **k))
    producers = []
    real_from_dlpack = flashinfer_tgv.from_dlpack

    def on_gpu(tensor, **kwargs):
        producer = FakeGpuTensor(Desc("bfloat16", tuple(tensor.shape), tuple(tensor.stride())))
        producers.append(producer)
        return real_from_dlpack(producer, **kwargs)

    monkeypatch.setattr(flashinfer_tgv, "from_dlpack", on_gpu)
    theirs = flashinfer_tgv._make_compile_repr_tensors(BF16, True, a_leading, b_leading, c_leading)
    ours = [
        tgv_gemm_build._operand("bfloat16", a_leading),
        tgv_gemm_build._operand("bfloat16", b_leading),
        tgv_gemm_build._operand("bfloat16", c_leading),
        tgv_gemm_build._bias("bfloat16"),
    ]
    with ir.Context() as context, ir.Location.unknown():
        context.allow_unregistered_dialects = True
        for flashinfers, placeholder in zip(theirs, ours, strict=True):
            assert str(placeholder.mlir_type) == str(flashinfers.mlir_type)
    assert "gmem" in str(ours[0].memspace) and ours[0].leading_dim == a_leading


# -- serving: FlashInfer's public function reaches the bundle's kernel -------------------------
def test_the_public_function_calls_the_bundles_kernel_with_the_swapped_views(
    gpu, fresh_runtime, monkeypatch
):
    m, n, k = 5, 1280, 2880
    a, b, bias, out = operands(m, n, k, bias=True)
    calls = [(with_bias, pdl) for with_bias in (False, True) for pdl in (False, True, None)]
    expected = {call: family.dispatch(TgvProblem(m, n, k, *call), "sm_100a").key for call in calls}
    kernels = {key.id: RecordingKernel(key.id) for key in expected.values()}
    assert len(kernels) == 4  # pdl None and False are one key
    for key in {key.id: key for key in expected.values()}.values():  # the real registry serves
        REGISTRY.add(loaded_bundle(key, kernels[key.id], "sm_100a", path=f"{key.id}.cuteaot"))
    assert serve_flashinfer.install(["flashinfer_tgv_gemm"]) == {"flashinfer_tgv_gemm": "installed"}
    assert serve_flashinfer.install(["flashinfer_tgv_gemm"]) == {"flashinfer_tgv_gemm": "installed"}
    for _ in range(2):
        for with_bias, pdl in calls:
            result = flashinfer.mm_bf16(a, b, bias if with_bias else None, pdl, out, backend="tgv")
            assert result is out
    # one lookup per key, each a hit (pdl None and False share theirs), then the patched
    # function's cache
    served = serving.installed("flashinfer_tgv_gemm")
    assert (served.hits, served.misses) == (4, 0)
    assert gpu.cache.keys == []  # FlashInfer's own compile was never reached
    weight = b.T  # the row-major [N, K] weight
    for call in calls:
        kernel = kernels[expected[call].id]
        assert len(kernel.calls) == 2 * (2 if call[1] is not True else 1)
        for args in kernel.calls:
            a_, b_, c_, *rest = args
            assert a_.data_ptr() == weight.data_ptr() and a_.shape == (1, n, k)
            assert a_.stride()[1:] == (k, 1)
            assert b_.data_ptr() == a.data_ptr() and b_.shape == (1, k, m)
            assert b_.stride()[1:] == (1, k)
            assert c_.data_ptr() == out.data_ptr() and c_.shape == (1, n, m)
            assert c_.stride()[1:] == (1, n)
            if call[0]:
                (bias_,) = rest
                assert bias_.data_ptr() == bias.data_ptr() and bias_.shape == (1, n, m)
                assert bias_.stride() == (0, 1, 0)
            else:
                assert rest == []
    assert serving.installed("flashinfer_tgv_gemm").hits == 4
    serve_flashinfer.uninstall(["flashinfer_tgv_gemm"])
    assert getattr(flashinfer_tgv, PATCHED_FUNCTION).__module__ == flashinfer_tgv.__name__


def test_a_b300_gets_the_sm103a_kernel_and_sm107_tactics_stay_flashinfers(
    gpu, fresh_runtime, monkeypatch
):
    kernel = RecordingKernel("any")
    key = family.dispatch(TgvProblem(1, 256, 512), "sm_103a").key
    REGISTRY.add(loaded_bundle(key, kernel, "sm_103a"))  # the real registry: sm_103a's only
    serve_flashinfer.install(["flashinfer_tgv_gemm"])
    served = serving.installed("flashinfer_tgv_gemm")
    gpu.capability = CAPABILITY["sm_103a"]
    a, b, bias, out = operands(1, 256, 512)
    flashinfer.mm_bf16(a, b, backend="tgv", out=out)
    assert (served.hits, served.misses) == (1, 0) and len(kernel.calls) == 1
    gpu.capability = (10, 7)  # a Rubin: its tactics and its GPU are FlashInfer's business
    with pytest.raises(FlashInferCompiled):
        flashinfer_tgv.run_tgv_cute_ext(a, b, None, out, False, 30)
    assert gpu.cache.keys[-1][-1] == "sm_107"
    assert (served.hits, served.misses) == (1, 0)  # the Rubin's call asked cute-aot nothing


def _stub_bundle(tmp_path, keys_by_arch):
    """The real build, link and pack of stub objects (tests/stubs.py): a bundle in a second."""
    from cute_aot.aot.build import run_build
    from tests.stubs import stub_compile

    outcome = run_build(
        keys_by_arch,
        tmp_path / "stub",
        name="tgv",
        jobs=1,
        show_progress=False,
        worker=stub_compile,
    )
    assert not outcome.failed, outcome.failed
    return outcome.bundles


def test_mode_aot_refuses_a_kernel_the_bundle_lacks(gpu, fresh_runtime, tmp_path):
    from cute_aot.runtime import load_bundles

    default_keys = family.enumerate_keys("sm_100a")
    (bundle,) = _stub_bundle(tmp_path, {"sm_100a": default_keys})
    load_bundles(bundle, gpu_arch="sm_100a")
    serve_flashinfer.install(["flashinfer_tgv_gemm"])
    set_mode("aot")
    a, b, bias, out = operands(1, 1280, 2880)
    flashinfer.mm_bf16(a, b, out=out, backend="tgv")  # a default key: the bundle's (stub) kernel
    assert serving.installed("flashinfer_tgv_gemm").hits == 1
    lacking = family.dispatch(TgvProblem(1, 1280, 2880, False, False, 5), "sm_100a").key
    assert lacking not in default_keys
    with pytest.raises(KernelNotFoundError, match=lacking.id):
        flashinfer_tgv.run_tgv_cute_ext(a, b, None, out, False, 5)
    assert gpu.cache.keys == []


def test_mode_auto_lets_flashinfer_compile_and_records_the_miss_once(
    gpu, fresh_runtime, settings_scope, tmp_path
):
    from cute_aot.runtime import load_bundles

    log = tmp_path / "misses.jsonl"
    settings_scope(CUTE_AOT_MISS_LOG=str(log))
    (bundle,) = _stub_bundle(tmp_path, {"sm_100a": family.enumerate_keys("sm_100a")})
    load_bundles(bundle, gpu_arch="sm_100a")
    serve_flashinfer.install(["flashinfer_tgv_gemm"])
    a, b, bias, out = operands(4, 1280, 2880)
    lacking = family.dispatch(TgvProblem(4, 1280, 2880, False, True, 12), "sm_100a").key
    with pytest.warns(RuntimeWarning, match="compiles it itself"):
        with pytest.raises(FlashInferCompiled):  # FlashInfer's original runs: it compiles
            flashinfer_tgv.run_tgv_cute_ext(a, b, None, out, True, 12)
    with pytest.raises(FlashInferCompiled):  # and again; the miss is not recorded again
        flashinfer_tgv.run_tgv_cute_ext(a, b, None, out, True, 12)
    assert [key_from_flashinfer(key) for key in gpu.cache.keys] == [lacking, lacking]
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["family"] == "flashinfer_tgv_gemm" and record["key_id"] == lacking.id
    assert record["arch"] == "sm_100a" and record["problem"]["tactic"] == 12
    assert serving.installed("flashinfer_tgv_gemm").misses == 1
    # a bundle loaded after the miss serves the key from the next call on (loading bundles
    # empties the replacement's table of resolved functions); FlashInfer compiles no more
    (later,) = _stub_bundle(tmp_path / "later", {"sm_100a": [lacking]})
    load_bundles(later, gpu_arch="sm_100a")
    flashinfer_tgv.run_tgv_cute_ext(a, b, None, out, True, 12)
    flashinfer_tgv.run_tgv_cute_ext(a, b, None, out, True, 12)
    assert len(gpu.cache.keys) == 2 and serving.installed("flashinfer_tgv_gemm").hits == 1


def test_the_family_is_found_and_serves_no_op():
    from cute_aot.kernels import families, family_facts
    from cute_aot.runtime import op

    assert families()["flashinfer_tgv_gemm"] is family
    facts = family_facts("flashinfer_tgv_gemm")["foreign"]["flashinfer-python"]
    assert facts["version"] == "0.7.4" and len(facts["source_hash"]) == 64
    with pytest.raises(UnsupportedProblemError, match="mm_bf16"):
        op("flashinfer_tgv_gemm")


def test_the_reference_is_mm_bf16s_arithmetic():
    a, b, bias, _ = operands(3, 16, 32, bias=True)
    for t in (a, b, bias):
        t.copy_(torch.randn(t.shape))
    expected = (a.float() @ b.float() + bias.float()).to(BF16)
    assert torch.equal(family.reference(a, b, bias), expected)


# -- the real build, and a fresh process serving FlashInfer from it ----------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from cute_aot.aot.cli import main

    out = tmp_path_factory.mktemp("tgv-bundles")
    args = [
        "--arch",
        "sm100a",
        "--arch",
        "sm103a",
        "--families",
        "flashinfer_tgv_gemm",
        "--out",
        str(out),
        "--no-cache",
        "-j",
        "2",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_the_build_compiles_tcgen05_kernels_for_both_architectures(built):
    from cute_aot.aot.binary_info import classify_opcodes
    from cute_aot.artifacts.bundle import read_manifest
    from cute_aot.runtime.paths import expand_bundle_paths

    manifests = {m.arch: m for m in map(read_manifest, expand_bundle_paths([built]))}
    assert set(manifests) == {"sm_100a", "sm_103a"}
    for arch, manifest in manifests.items():
        keys = {TgvGemmKey.from_fields(entry.key) for entry in manifest.entries}
        assert keys == set(family.enumerate_keys(arch))
        for entry in manifest.entries:
            sm = {"sm_100a": 100, "sm_103a": 103}[arch]
            assert entry.gpu_binary and sm in entry.gpu_binary["sm"], entry.gpu_binary
            mma = [
                opcode
                for kernel in entry.gpu_binary["kernels"]
                for opcode in kernel.get("opcodes", {})
                if opcode.startswith("UTC") and "MMA" in opcode
            ]
            assert mma, f"{arch} {entry.key}: no tcgen05 MMA in the SASS"
            classes = classify_opcodes(entry.gpu_binary["kernels"][0]["opcodes"])
            assert classes.get("UTC*MMA") and classes.get("UTMA*")  # tcgen05 MMA fed by TMA


WORKER = textwrap.dedent(
    """
    import functools, json, sys
    import torch
    import flashinfer, flashinfer.utils as flashinfer_utils
    from flashinfer.gemm import gemm_base
    from flashinfer.gemm.kernels import tgv_gemm_cute_ext as flashinfer_tgv
    from cute_aot.artifacts.core.errors import KernelNotFoundError
    from cute_aot.kernels.flashinfer.tgv_gemm import TgvProblem, family
    from cute_aot.runtime import flashinfer as serve_flashinfer, load_bundles
    from cute_aot.runtime.loader import LoadedBundle

    capability = [(10, 0)]
    query = lambda device=None: capability[0]
    torch.cuda.get_device_capability = query
    torch.version.cuda = "13.0"
    flashinfer_utils.get_compute_capability = query
    gemm_base.get_compute_capability = query
    gemm_base._get_stream_cache_buf = lambda name, size, device, zero_init=False: torch.empty(
        size, dtype=torch.uint8)
    original = flashinfer_tgv._get_compiled_cute_ext_kernel
    @functools.wraps(original)  # FlashInfer's signature: the family checks it before patching
    def refuse(*args, **kwargs):
        raise AssertionError("FlashInfer compiled")
    flashinfer_tgv._get_compiled_cute_ext_kernel = refuse
    called = []
    real_function = LoadedBundle.function
    def function(self, key_id, key=None):
        real = real_function(self, key_id)
        def stand_in(*args):  # records instead of launching (no GPU here)
            called.append((self.arch, key_id, type(real).__name__, args))
        return stand_in
    LoadedBundle.function = function
    for arch in ("sm_100a", "sm_103a"):
        load_bundles(sys.argv[1], gpu_arch=arch)
    print(json.dumps(serve_flashinfer.install(["flashinfer_tgv_gemm"])))
    m, n, k = 3, 1280, 2880
    x = torch.empty(m, k, dtype=torch.bfloat16)
    w = torch.empty(n, k, dtype=torch.bfloat16)
    bias = torch.empty(n, dtype=torch.bfloat16)
    names = {x.data_ptr(): "x", w.data_ptr(): "w", bias.data_ptr(): "bias"}
    for arch, cap in (("sm_100a", (10, 0)), ("sm_103a", (10, 3))):
        capability[0] = cap
        # a process's device keeps its kind; here the one "device" changes it: start afresh
        serve_flashinfer.uninstall(["flashinfer_tgv_gemm"])
        installed = serve_flashinfer.install(["flashinfer_tgv_gemm"])
        assert installed == {"flashinfer_tgv_gemm": "installed"}
        for has_bias in (False, True):
            for pdl in (False, True, None):
                out = torch.empty(m, n, dtype=torch.bfloat16)
                names[out.data_ptr()] = "out"
                flashinfer.mm_bf16(x, w.T, bias if has_bias else None, pdl, out, backend="tgv")
                served_arch, served, real, args = called[-1]
                key = family.dispatch(TgvProblem(m, n, k, has_bias, pdl), arch).key
                views = [[names[t.data_ptr()], list(t.shape), list(t.stride())] for t in args]
                print(json.dumps([arch, key.id, served_arch, served, real, views]))
    try:
        flashinfer_tgv.run_tgv_cute_ext(x, w.T, None, out, False, 5)
        print(json.dumps("served"))
    except KernelNotFoundError as exc:
        print(json.dumps(["KernelNotFoundError", str(exc)]))
    """
)


@pytest.mark.slow
def test_a_built_bundle_serves_flashinfers_mm_bf16_in_a_fresh_process_without_jit(built, tmp_path):
    env = dict(
        os.environ,
        FLASHINFER_DISABLE_JIT="1",
        CUTE_AOT_MODE="aot",
        CUTE_AOT_CACHE_DIR=str(tmp_path / "c"),
    )
    env.pop("CUTE_AOT_BUNDLES", None)
    run = subprocess.run(
        [sys.executable, "-c", WORKER, str(built)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith(("{", "["))]
    assert lines[0] == {"flashinfer_tgv_gemm": "installed"}
    calls, refusal = lines[1:-1], lines[-1]
    assert len(calls) == 12
    m, n, k = 3, 1280, 2880
    for arch, dispatched, served_arch, served, real_type, views in calls:
        assert (served_arch, served) == (arch, dispatched)  # the bundle's kernel of its key
        assert real_type == "Function"  # a TVM-FFI function from the bundle's library
        assert views[:3] == [
            ["w", [1, n, k], [k, k, 1]],  # a_ = b.T lifted: the weight, K-contiguous
            ["x", [1, k, m], [m * k, 1, k]],  # b_ = a.T lifted
            ["out", [1, n, m], [m * n, 1, n]],  # c_ = out.T lifted
        ]
        assert views[3:] in ([], [["bias", [1, n, m], [0, 1, 0]]])
    assert {(c[0], c[1]) for c in calls} == {
        (arch, key.id) for arch in family.archs for key in family.enumerate_keys(arch)
    }
    assert refusal[0] == "KernelNotFoundError" and "flashinfer_tgv_gemm" in refusal[1]
