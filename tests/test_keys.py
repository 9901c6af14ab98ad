import dataclasses
import json

import pytest

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.arch import arch_family, normalize_arch
from cute_aot.kernels.router_gemm import RouterGemmKey

DOT = RouterGemmKey("dot", 4, 7168, 128, 0, 0, True)


def test_canonical_json_is_sorted_compact_and_names_the_family():
    text = DOT.canonical_json()
    data = json.loads(text)
    assert data["family"] == "router_gemm"
    assert list(data) == sorted(data)
    assert " " not in text
    assert data["x_dtype"] == "bfloat16" and data["out_dtype"] == "float32"


def test_id_is_stable_across_processes_and_versions():
    # Pinned: an id that drifts makes every shipped bundle miss. Change only with FAMILY_VERSION.
    import hashlib

    expected = hashlib.sha256(DOT.canonical_json().encode()).hexdigest()[:20]
    assert DOT.id == expected
    assert DOT.symbol == f"router_gemm_{DOT.id}"


@pytest.mark.parametrize(
    "change",
    [
        {"backend": "splitk"},
        {"m": 5},
        {"k": 4096},
        {"block_size": 256},
        {"split_k": 8},
        {"num_stages": 2},
        {"pdl": False},
        {"x_dtype": "float16"},
        {"w_dtype": "float16"},
        {"out_dtype": "bfloat16"},
        {"align_bytes": 32},
        {"version": 2},
    ],
)
def test_every_field_changes_the_id(change):
    other = dataclasses.replace(DOT, **change)
    assert other.id != DOT.id
    assert other.symbol != DOT.symbol


def test_round_trip_through_fields():
    assert RouterGemmKey.from_fields(json.loads(DOT.canonical_json())) == DOT


def test_from_fields_refuses_unknown_or_missing_fields():
    fields = DOT.fields()
    with pytest.raises(ValueError, match="differ"):
        RouterGemmKey.from_fields({**fields, "extra": 1})
    fields.pop("pdl")
    with pytest.raises(ValueError, match="differ"):
        RouterGemmKey.from_fields(fields)
    with pytest.raises(ValueError, match="family"):
        RouterGemmKey.from_fields({**DOT.fields(), "family": "other"})


@pytest.mark.parametrize("spelling", ["sm90a", "sm_90a", "SM_90A", " sm90a "])
def test_arch_spellings(spelling):
    assert normalize_arch(spelling) == "sm_90a"


def test_arch_families_and_refusal():
    assert arch_family("sm100a") == arch_family("sm_103a") == "sm100"
    assert arch_family("sm_90a") == "sm90"
    with pytest.raises(UnsupportedProblemError, match="sm_80"):
        normalize_arch("sm_80")
