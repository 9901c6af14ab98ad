"""FlashInfer's GDN decode served from a bundle built on a CPU machine, on the GPU: bitwise
equal to FlashInfer's own JIT-compiled kernels in the same run, over every default key and
several batch sizes; CUDA-graph capture works; FlashInfer's outputs agree with our fp32 torch
reference. Needs CUTE_AOT_BUNDLES with the default flashinfer_gdn_decode keys (aot-build
--families flashinfer_gdn_decode), flashinfer-python, and nvidia-cutlass-dsl for FlashInfer's JIT.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer-python"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("cutlass") is None,
        reason="needs nvidia-cutlass-dsl (FlashInfer's JIT is the baseline)",
    ),
    pytest.mark.skipif(
        not os.environ.get("CUTE_AOT_BUNDLES"), reason="needs CUTE_AOT_BUNDLES (GDN keys)"
    ),
]


def _bundles_hold_gdn_keys() -> bool:
    """Whether a bundle named in CUTE_AOT_BUNDLES holds flashinfer_gdn_decode kernels."""
    from cute_aot.artifacts.bundle import read_manifest
    from cute_aot.runtime.paths import expand_bundle_paths

    sources = [Path(s) for s in os.environ.get("CUTE_AOT_BUNDLES", "").split(os.pathsep) if s]
    for path in expand_bundle_paths([s for s in sources if s.exists()]):
        if "flashinfer_gdn_decode" in read_manifest(path).families:
            return True
    return False


@pytest.fixture(scope="module", autouse=True)
def _gdn_bundle():
    if not _bundles_hold_gdn_keys():
        pytest.skip(
            f"no flashinfer_gdn_decode kernels in CUTE_AOT_BUNDLES "
            f"({os.environ.get('CUTE_AOT_BUNDLES')}): aot-build --families flashinfer_gdn_decode"
        )


WORKER = Path(__file__).with_name("flashinfer_gdn_worker.py")


def run_worker(mode: str, out: Path, tmp_path: Path) -> dict:
    env = dict(os.environ, FLASHINFER_WORKSPACE_BASE=str(tmp_path / f"fi-{mode}"))
    if mode == "bundle":
        env.update(FLASHINFER_DISABLE_JIT="1", CUTE_AOT_MODE="aot")
    run = subprocess.run(
        [sys.executable, str(WORKER), mode, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=500,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gdn")
    flashinfer = run_worker("flashinfer", tmp / "flashinfer.pt", tmp)
    bundle = run_worker("bundle", tmp / "bundle.pt", tmp)
    return flashinfer, bundle, torch.load(tmp / "flashinfer.pt"), torch.load(tmp / "bundle.pt")


def test_every_key_is_served_from_the_bundle_without_jit(both):
    flashinfer, bundle, _, _ = both
    assert bundle["install"]["flashinfer_gdn_decode"] == "installed"
    assert bundle["hits"] == 16  # 4 tensor-parallel shapes x small/big x dt_bias fp32/bf16
    assert bundle["cases"] == flashinfer["cases"] == 4 * 2 * 5


def test_outputs_and_states_are_bitwise_flashinfers(both):
    _, _, theirs, ours = both
    assert theirs.keys() == ours.keys()
    for case, (output, state) in theirs.items():
        assert torch.equal(output, ours[case][0]), case
        assert torch.equal(state, ours[case][1]), case


def test_cuda_graph_replay_is_bitwise_eager(both):
    assert both[1]["graph_bitwise"] is True


def test_flashinfer_agrees_with_the_fp32_reference(both):
    from cute_aot.kernels.flashinfer.gdn_decode import GdnProblem, family
    from cute_aot.kernels.flashinfer.gdn_reference import example_inputs

    _, _, theirs, _ = both
    for index, (case, (output, state)) in enumerate(theirs.items()):
        problem = GdnProblem(*case)
        inputs = example_inputs(problem, "cuda", seed=index)
        ref_output, ref_state = family.reference(**inputs)
        scale = ref_output.float().abs().max().item()
        assert (output.float() - ref_output.float().cpu()).abs().max().item() <= 0.02 * scale, case
        assert torch.allclose(state, ref_state.cpu(), rtol=1e-3, atol=1e-4), case
