"""On a Hopper GPU, the Blackwell-only FlashInfer families (MXFP8 and TGV GEMMs, sm_100a/sm_103a)
are never launched: their bundles are refused with a message naming both architectures (or
skipped in a folder), `install()` leaves FlashInfer's own answers about its backends as they were,
FlashInfer refuses those backends itself, and `auto` picks a Hopper backend; our lookups are
never reached. Needs CUTE_AOT_BUNDLES holding a Blackwell bundle of those families.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.core.errors import IncompatibleBundleError

BLACKWELL_FAMILIES = {"flashinfer_mxfp8_gemm", "flashinfer_tgv_gemm"}


def blackwell_bundles() -> list[Path]:
    found = []
    for entry in filter(None, os.environ.get("CUTE_AOT_BUNDLES", "").split(":")):
        for path in (
            sorted(Path(entry).glob("*.cuteaot")) if Path(entry).is_dir() else [Path(entry)]
        ):
            manifest = read_manifest(path)
            if manifest.arch != "sm_90a" and BLACKWELL_FAMILIES & set(manifest.families):
                found.append(path)
    return found


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer-python"
    ),
    pytest.mark.skipif(
        not blackwell_bundles(),
        reason="needs a Blackwell bundle of the FlashInfer GEMM families in CUTE_AOT_BUNDLES",
    ),
]


@pytest.fixture
def hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU (compute capability 9.0)")


def test_a_blackwell_bundle_is_refused_on_hopper_and_skipped_in_a_folder(hopper, fresh_runtime):
    from cute_aot.runtime import REGISTRY

    folders = set()
    for path in blackwell_bundles():
        arch = read_manifest(path).arch
        with pytest.raises(
            IncompatibleBundleError, match=f"built for {arch}, this GPU needs sm_90a"
        ):
            REGISTRY.load(path)
        REGISTRY.load(path.parent)  # a folder ships every architecture: only this GPU's is loaded
        folders.add(path.parent)
        hopper = {
            bundle.resolve()
            for folder in folders
            for bundle in folder.glob("*.cuteaot")
            if read_manifest(bundle).arch == "sm_90a"
        }
        assert {Path(bundle.path).resolve() for bundle in REGISTRY.bundles} == hopper


def test_flashinfer_keeps_refusing_the_blackwell_backends_and_auto_runs_a_hopper_one(
    hopper, fresh_runtime
):
    import flashinfer

    from cute_aot.runtime import flashinfer as serve_flashinfer
    from cute_aot.runtime import load_bundles, serving

    def supported():
        return (
            flashinfer.mm_mxfp8.is_backend_supported("cute-dsl", 90),
            flashinfer.mm_bf16.is_backend_supported("tgv", 90),
        )

    before = supported()
    for path in blackwell_bundles():
        load_bundles(path.parent)
    outcome = serve_flashinfer.install()
    try:
        assert supported() == before == (False, False)
        a = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16).T  # (k, n) column-major
        with pytest.raises(Exception, match=r"(?i)tgv|support|capabilit"):
            flashinfer.mm_bf16(a, b, backend="tgv")
        out = flashinfer.mm_bf16(a, b, backend="auto")
        expected = a.float() @ b.float()
        assert (out.float() - expected).abs().max().item() <= 0.02 * expected.abs().max().item()
        for name in BLACKWELL_FAMILIES & set(outcome):
            assert outcome[name] == "installed"
            assert (serving.installed(name).hits, serving.installed(name).misses) == (0, 0)
    finally:
        serve_flashinfer.uninstall()
