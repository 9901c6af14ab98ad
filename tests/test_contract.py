"""The family contract: a small required part, optional protocols found by `capability`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cute_aot.aot.models import Model, family_shapes
from cute_aot.kernels import (
    CAPABILITIES,
    Adapter,
    Dispatch,
    KernelFamily,
    ModelShapes,
    TensorArg,
    TorchModelShapes,
    TorchReference,
    Tuner,
    TuningCache,
    capability,
    families,
)
from cute_aot.kernels.keys import KernelKey

EXTERNAL = Path(__file__).parent / "external_family"


def members(protocol) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    return names | {name for name in vars(protocol) if not name.startswith("_")}


def test_the_required_part_declares_no_optional_member():
    # A default on the base would make every family match the protocol structurally.
    for protocol in CAPABILITIES:
        assert not members(protocol) & set(dir(KernelFamily)), protocol.__name__


def test_our_families_capabilities():
    found = {
        name: {p.__name__ for p in CAPABILITIES if capability(f, p)}
        for name, f in families().items()
    }
    expected = {
        "cute_compile": {"Adapter"},
        "flashinfer_gdn_decode": {"ModelShapes", "TorchReference", "Adapter"},
        "flashinfer_mxfp8_gemm": {"ModelShapes", "Tuner", "TuningCache", "Adapter"},
        "flashinfer_tgv_gemm": {"TorchReference", "Tuner", "TuningCache", "Adapter"},
        "gemm_sm90": {"ModelShapes", "TorchReference", "Tuner"},
        "gemm_sm90_fp8": {"ModelShapes", "TorchReference", "Tuner"},
        "router_gemm": {"ModelShapes", "TorchModelShapes", "TorchReference", "Tuner"},
    }
    assert {name: found[name] for name in expected if name in found} == {
        name: caps for name, caps in expected.items() if name in found
    }


def test_an_external_family_has_what_it_defines_without_importing_a_protocol(monkeypatch):
    monkeypatch.syspath_prepend(str(EXTERNAL))
    try:
        from cute_aot_rmsnorm import family

        assert type(family).__mro__[1:] == (KernelFamily, object)  # written before the protocols
        assert capability(family, ModelShapes) is family
        assert capability(family, TorchModelShapes) is family
        assert capability(family, TorchReference) is family
        for absent in (Tuner, TuningCache, Adapter):
            assert capability(family, absent) is None
    finally:  # imported from its source here: later tests import it as installed
        for name in [m for m in sys.modules if m.split(".")[0] == "cute_aot_rmsnorm"]:
            del sys.modules[name]


@dataclass(frozen=True)
class MinimalKey(KernelKey):
    FAMILY = "minimal"

    version: int = 1


class Minimal(KernelFamily):
    """Only the required part."""

    name = "minimal"
    version = 1
    Key = MinimalKey
    archs = ("sm_90a",)
    abi = (TensorArg("x", "float32", 1), TensorArg("out", "float32", 1, output=True))
    builder = "nowhere"

    def dispatch(self, problem, arch):
        return Dispatch(MinimalKey(), f"one kernel for {problem}")

    def problems(self, shape):
        yield shape


def test_a_family_of_only_the_required_part_enumerates_and_has_no_capability():
    minimal = Minimal()
    assert minimal.enumerate_keys("sm_90a", [(1,), (2,)]) == [MinimalKey()]
    assert [p for p in CAPABILITIES if capability(minimal, p)] == []
    assert minimal.missing_requirements() is None
    model = Model("toy", {"hidden_size": 4096}, "toy")
    assert family_shapes(model, minimal) == []


def test_subclassing_a_protocol_gives_its_defaults():
    class Tuned(Minimal, Tuner):
        def tune_candidates(self, problem, arch):
            return [self.dispatch(problem, arch).key]

    tuned = Tuned()
    assert capability(tuned, Tuner) is tuned
    assert list(tuned.tune_problems((3,))) == [(3,)]
    with pytest.raises(NotImplementedError, match="no dispatch table"):
        tuned.tuned_table("sm_90a", [], {})
