"""FlashInfer's GDN decode as a cute-aot family, on the CPU: the key mirrors FlashInfer's cache
key field by field, FlashInfer's public function reaches the bundle's kernel through the one
patched lookup (mode aot refuses a miss, mode auto lets FlashInfer compile and records it), and
FlashInfer's version and sources are staleness facts.

FlashInfer's public `gated_delta_rule_decode` runs here on CPU tensors with two test doubles for
what needs a GPU (its device-target query and torch's current CUDA stream); the kernel itself is
never launched: the function FlashInfer calls records its arguments instead.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from click.testing import CliRunner

from tests.stubs import RecordingKernel, loaded_bundle

pytest.importorskip(
    "flashinfer", reason="needs flashinfer-python (pip install 'cute-aot[flashinfer]')"
)

from flashinfer.gdn_decode import gated_delta_rule_decode  # noqa: E402
from flashinfer.gdn_kernels import gdn_decode_nontranspose as flashinfer_gdn  # noqa: E402
from flashinfer.gdn_kernels.device_target import GdnDeviceTarget  # noqa: E402

from cute_aot.artifacts.core.errors import KernelNotFoundError, UnsupportedProblemError  # noqa: E402
from cute_aot.kernels import family_facts  # noqa: E402
from cute_aot.kernels.flashinfer.gdn_decode import (  # noqa: E402
    CACHE_FUNCTION,
    FLASHINFER_KEY,
    GdnProblem,
    check_flashinfer,
    family,
    flashinfer_key,
    key_from_flashinfer,
)
from cute_aot.kernels.flashinfer.gdn_reference import example_inputs  # noqa: E402
from cute_aot.runtime import (  # noqa: E402
    REGISTRY,
    serving,  # noqa: E402
    set_mode,
)
from cute_aot.runtime import flashinfer as serve_flashinfer  # noqa: E402

HOPPER = GdnDeviceTarget(0, "sm_90a", 9, 0, 132, False)
F32, BF16, F16 = "float32", "bfloat16", "float16"


class FlashInferCompiled(Exception):
    """FlashInfer reached its own compile (build_and_load_cute_dsl_kernel)."""


@pytest.fixture
def flashinfer_on_cpu(monkeypatch):
    """FlashInfer's GDN path on CPU tensors: an H200's device target, stream 0; the kernel
    lookups FlashInfer makes are recorded; FlashInfer's own compile raises."""
    monkeypatch.setattr(flashinfer_gdn, "gdn_device_target", lambda device: HOPPER)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0)
    )

    def no_compile(*args, **kwargs):
        raise FlashInferCompiled(args[1])

    monkeypatch.setattr(flashinfer_gdn, "build_and_load_cute_dsl_kernel", no_compile)
    keys = []
    original = flashinfer_gdn._get_compiled_decode_kernel_nontranspose
    original.cache_clear()

    def recording(*cache_key):
        keys.append(cache_key)
        return original(*cache_key)

    recording.__wrapped__ = original  # its signature is FlashInfer's

    monkeypatch.setattr(flashinfer_gdn, CACHE_FUNCTION, recording)
    yield keys
    serve_flashinfer.uninstall()
    original.cache_clear()


def call(problem: GdnProblem, scale=None, output_dtype=None):
    inputs = example_inputs(problem, "cpu")
    output = None
    if output_dtype is not None:
        output = torch.empty(
            problem.batch, 1, problem.hv, problem.v, dtype=getattr(torch, output_dtype)
        )
    gated_delta_rule_decode(
        **inputs, scale=scale, output=output, use_qk_l2norm=problem.use_qk_l2norm
    )
    return inputs


CASES = [
    # (problem, scale passed, output dtype passed)
    (GdnProblem(2, 1, 2, 4, 128, 128), None, None),
    (GdnProblem(40, 1, 2, 4, 128, 128), None, None),
    (
        GdnProblem(3, 1, 4, 8, 128, 128, (F32, F32, BF16, BF16, BF16, BF16, BF16, BF16, BF16)),
        None,
        None,
    ),
    (GdnProblem(3, 1, 2, 4, 128, 256, use_qk_l2norm=False), 1 / math.sqrt(128), None),
    (GdnProblem(5, 1, 2, 4, 128, 128, (F32, F32, F16, F32, F16, F16, F16, F16, F16)), None, F16),
]


def test_flashinfers_cache_key_has_exactly_the_fields_we_mirror():
    check_flashinfer(getattr(flashinfer_gdn, CACHE_FUNCTION))  # the installed FlashInfer's

    def upgraded(
        target_key, use_small_batch, T, H, HV, K, V, dtype_key, scale, use_qk_l2norm, tile
    ):
        return {}

    with pytest.raises(TypeError, match="tile"):
        check_flashinfer(upgraded)
    assert len(FLASHINFER_KEY) == 10


@pytest.mark.parametrize("problem, scale, output_dtype", CASES)
def test_our_key_is_flashinfers_key_field_by_field(flashinfer_on_cpu, problem, scale, output_dtype):
    with pytest.raises(FlashInferCompiled):  # nothing is installed: FlashInfer would compile
        call(problem, scale, output_dtype)
    (cache_key,) = flashinfer_on_cpu
    arch, key = key_from_flashinfer(cache_key)
    assert arch == "sm_90a"
    assert flashinfer_key(key, "sm_90a", device_index=0) == cache_key
    if scale is not None:  # an explicit 1/sqrt(K) is another key than the default K**-0.5
        problem = problem._replace(scale=scale)
    dtypes = problem.dtypes if output_dtype else problem.dtypes[:-1] + (BF16,)
    assert family.dispatch(problem._replace(dtypes=dtypes), "sm_90a").key == key
    fields = dict(zip(FLASHINFER_KEY, cache_key, strict=True))
    assert key.small_batch == fields["use_small_batch"] == (problem.batch < 32)
    assert (key.t, key.h, key.hv, key.k, key.v) == tuple(
        fields[name] for name in ("T", "H", "HV", "K", "V")
    )
    assert key.dtypes == tuple(str(d).removeprefix("torch.") for d in fields["dtype_key"])
    assert key.scale == fields["scale"] and key.use_qk_l2norm == fields["use_qk_l2norm"]


def test_the_public_function_calls_the_bundles_kernel(
    flashinfer_on_cpu, fresh_runtime, monkeypatch
):
    problem = GdnProblem(3, 1, 2, 4, 128, 128)
    expected = family.dispatch(problem, "sm_90a").key
    kernel = RecordingKernel(expected.id)
    REGISTRY.add(loaded_bundle(expected, kernel, "sm_90a"))  # served by the real registry
    gdn = ["flashinfer_gdn_decode"]
    assert serve_flashinfer.install(gdn) == {"flashinfer_gdn_decode": "installed"}
    assert serve_flashinfer.install(gdn) == {"flashinfer_gdn_decode": "installed"}  # idempotent
    inputs = call(problem)
    call(problem)  # the second call finds the kernel in FlashInfer's own cache entry
    # one lookup, a hit: the second call never asks the registry
    served = serving.installed("flashinfer_gdn_decode")
    assert (served.hits, served.misses) == (1, 0)
    assert len(kernel.calls) == 2
    cu_seqlens, q, *_, state, indices, output, stream = kernel.calls[0]
    assert q is inputs["q"] and state.shape == (3 * 4, 128, 128) and output.shape == (3, 1, 4, 128)
    assert cu_seqlens.tolist() == [0] * 4 and indices.tolist() == [0, 1, 2]
    assert int(stream) == 0
    assert serving.installed("flashinfer_gdn_decode").hits == 1
    serve_flashinfer.uninstall()
    assert getattr(flashinfer_gdn, CACHE_FUNCTION).__name__ == "recording"  # the original is back


def test_mode_aot_refuses_a_kernel_no_bundle_holds(flashinfer_on_cpu, fresh_runtime):
    serve_flashinfer.install()
    set_mode("aot")
    with pytest.raises(KernelNotFoundError, match="flashinfer_gdn_decode"):
        call(GdnProblem(2, 1, 2, 4, 128, 128))


def test_mode_auto_lets_flashinfer_compile_and_records_the_miss(
    flashinfer_on_cpu, fresh_runtime, monkeypatch, settings_scope, tmp_path
):
    log = tmp_path / "misses.jsonl"
    settings_scope(CUTE_AOT_MISS_LOG=str(log))
    flashinfers_own = RecordingKernel("flashinfer")
    monkeypatch.setattr(
        flashinfer_gdn, "build_and_load_cute_dsl_kernel", lambda *a, **k: flashinfers_own
    )
    serve_flashinfer.install()
    problem = GdnProblem(2, 1, 2, 4, 128, 128)
    with pytest.warns(RuntimeWarning, match="compiles it itself"):
        call(problem)
    assert len(flashinfers_own.calls) == 1
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["family"] == "flashinfer_gdn_decode"
    assert record["key_id"] == family.dispatch(problem, "sm_90a").key.id
    assert serving.installed("flashinfer_gdn_decode").misses == 1


def test_flashinfer_version_and_sources_are_staleness_facts():
    from cute_aot.runtime.registry import _foreign_difference

    facts = family_facts("flashinfer_gdn_decode")["foreign"]
    assert facts["flashinfer-python"]["version"] == "0.7.4"
    assert len(facts["flashinfer-python"]["source_hash"]) == 64
    older = {"flashinfer-python": {"version": "0.7.3", "source_hash": "x"}}
    assert (
        _foreign_difference(older, facts)
        == "built against flashinfer-python 0.7.3, installed 0.7.4"
    )
    patched = {"flashinfer-python": {"version": "0.7.4", "source_hash": "x"}}
    assert "kernel sources differ" in _foreign_difference(patched, facts)


def test_a_serving_family_has_no_op():
    from cute_aot.runtime import op

    with pytest.raises(UnsupportedProblemError, match="gated_delta_rule_decode"):
        op("flashinfer_gdn_decode")


def test_families_whose_requirements_are_missing_are_left_out_of_default_builds(monkeypatch):
    from cute_aot.aot.build import buildable_families
    from cute_aot.aot.cli import main

    assert "flashinfer_gdn_decode" in buildable_families()
    monkeypatch.setattr(type(family), "requires", {"flashinfer-python": "0.0.1"})
    assert "flashinfer_gdn_decode" not in buildable_families()
    result = CliRunner().invoke(
        main, ["--arch", "sm90a", "--families", "flashinfer_gdn_decode", "--out", "x"]
    )
    assert result.exit_code == 2 and "flashinfer-python==0.0.1" in result.output


def test_qwen3_next_gives_four_tensor_parallel_shapes_and_sixteen_keys():
    from cute_aot.aot.models import PRESETS, family_shapes

    shapes = family_shapes(PRESETS["qwen3-next-80b-a3b"], family)
    assert shapes == [(16, 32, 128, 128), (8, 16, 128, 128), (4, 8, 128, 128), (2, 4, 128, 128)]
    keys = family.enumerate_keys("sm_90a", shapes)
    assert len(keys) == 16
    assert {(k.small_batch, k.dt_bias_dtype) for k in keys} == {
        (s, d) for s in (True, False) for d in (F32, BF16)
    }
    assert {k.scale for k in keys} == {128**-0.5}
    with pytest.raises(UnsupportedProblemError, match="sm_90a"):
        family.dispatch(GdnProblem(1, 1, 2, 4, 128, 128), "sm_100a")


WORKER = textwrap.dedent(
    """
    import json, sys, types
    import torch
    from flashinfer.gdn_decode import gated_delta_rule_decode
    from flashinfer.gdn_kernels import gdn_decode_nontranspose as flashinfer_gdn
    from flashinfer.gdn_kernels.device_target import GdnDeviceTarget
    from cute_aot.kernels.flashinfer.gdn_decode import GdnProblem, family
    from cute_aot.kernels.flashinfer.gdn_reference import example_inputs
    from cute_aot.runtime import flashinfer as serve_flashinfer, load_bundles
    from cute_aot.runtime.loader import LoadedBundle

    flashinfer_gdn.gdn_device_target = lambda device: GdnDeviceTarget(0, "sm_90a", 9, 0, 132, False)
    torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0)
    def refuse(*args, **kwargs):
        raise AssertionError("FlashInfer compiled")
    flashinfer_gdn.build_and_load_cute_dsl_kernel = refuse
    called, served = [], {}
    real_function = LoadedBundle.function
    def function(self, key_id, key=None):
        real = real_function(self, key_id)
        def stand_in(*args):  # records instead of launching (no GPU here)
            called.append((key_id, type(real).__name__, len(args)))
        served[key_id] = stand_in
        return stand_in
    LoadedBundle.function = function
    load_bundles(sys.argv[1], gpu_arch="sm_90a")
    print(json.dumps(serve_flashinfer.install()))
    for batch, dt_bias in [(2, "float32"), (2, "bfloat16"), (33, "float32"), (33, "bfloat16")]:
        dtypes = ("float32", "float32", "bfloat16", dt_bias) + ("bfloat16",) * 5
        problem = GdnProblem(batch, 1, 2, 4, 128, 128, dtypes)
        gated_delta_rule_decode(**example_inputs(problem, "cpu"))
        print(json.dumps([family.dispatch(problem, "sm_90a").key.id, called[-1]]))
    """
)


@pytest.mark.slow
def test_a_built_bundle_serves_flashinfer_in_a_fresh_process_without_jit(tmp_path):
    from cute_aot.aot.cli import main

    out = tmp_path / "bundles"
    args = [
        "--arch",
        "sm90a",
        "--families",
        "flashinfer_gdn_decode",
        "--no-default-shapes",
        "--shape",
        "flashinfer_gdn_decode:2,4,128,128",
        "--out",
        str(out),
        "--no-cache",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    env = dict(
        os.environ,
        FLASHINFER_DISABLE_JIT="1",
        CUTE_AOT_MODE="aot",
        CUTE_AOT_CACHE_DIR=str(tmp_path / "c"),
    )
    env.pop("CUTE_AOT_BUNDLES", None)
    run = subprocess.run(
        [sys.executable, "-c", WORKER, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith(("{", "["))]
    assert lines[0]["flashinfer_gdn_decode"] == "installed"
    for dispatched, (served, real_type, arguments) in lines[1:]:
        assert served == dispatched  # FlashInfer called the bundle's kernel of its own key
        assert (
            real_type == "Function" and arguments == 12
        )  # a TVM-FFI function, FlashInfer's 12 args
    assert len({line[0] for line in lines[1:]}) == 4


def test_explain_says_flashinfer_compiles_what_no_bundle_holds():
    from cute_aot.aot.tools.aot_cache.facts.explain import explain
    from cute_aot.runtime.mode import Mode

    problem = GdnProblem(2, 1, 2, 4, 128, 128)
    decision = explain(family, problem, "sm_90a", Mode.AUTO, [])
    assert decision["source"] == "jit"
    assert "gated_delta_rule_decode compiles it itself" in decision["why"]
    assert "overlay" not in decision["why"]  # our JIT and overlay never serve these families
    assert explain(family, problem, "sm_90a", Mode.AOT, [])["source"] == "error"
