"""Runtime behaviour that needs no GPU: compatibility checks before any dlopen, input checks."""

import dataclasses

import pytest
import torch

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.bundle import write_bundle
from cute_aot.artifacts.errors import IncompatibleBundleError, InputError
from cute_aot.runtime.loader import open_bundle
from cute_aot.runtime.ops import router_gemm
from tests.test_bundle import _manifest

NOT_A_LIBRARY = b"this would crash dlopen if it were ever reached"


def _bundle(tmp_path, **changes):
    path = tmp_path / "b.cuteaot"
    write_bundle(path, dataclasses.replace(_manifest(), **changes), NOT_A_LIBRARY)
    return path


def test_wrong_gpu_architecture_is_refused_before_loading(tmp_path):
    with pytest.raises(IncompatibleBundleError, match="built for sm_90a, this GPU needs sm_100a"):
        open_bundle(_bundle(tmp_path), gpu_arch="sm_100a")


def test_other_tvm_ffi_series_is_refused_before_loading(tmp_path):
    tc = {**toolchain.fingerprint(), "tvm_ffi": "0.0.1"}
    with pytest.raises(IncompatibleBundleError, match="apache-tvm-ffi 0.0.1"):
        open_bundle(_bundle(tmp_path, toolchain=tc), gpu_arch="sm_90a")


def test_tvm_ffi_compatibility_rule():
    assert toolchain.abi_compatible_tvm_ffi("0.1.15.post2", "0.1.16")
    assert not toolchain.abi_compatible_tvm_ffi("0.1.15", "0.2.0")
    assert not toolchain.abi_compatible_tvm_ffi(None, "0.1.15")


def _bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "x, w, message",
    [
        (torch.zeros(2, 64), _bf16(8, 64), "x must be bfloat16"),
        (_bf16(2, 64), torch.zeros(8, 64, dtype=torch.float16), "w must be bfloat16"),
        (_bf16(64), _bf16(8, 64), "x must be 2-D"),
        (_bf16(2, 64), _bf16(8, 64), "must be on a CUDA device"),
        ("not a tensor", _bf16(8, 64), "must be a torch.Tensor"),
    ],
)
def test_bad_inputs_are_refused_with_a_clear_error(x, w, message):
    with pytest.raises(InputError, match=message):
        router_gemm(x, w)


def test_input_errors_are_value_errors():
    assert issubclass(InputError, ValueError)


@pytest.mark.parametrize(
    "x, w, message",
    [
        (_bf16(2, 64), _bf16(8, 32), "K=64.*K=32"),
        (_bf16(0, 64), _bf16(8, 64), "empty problem"),
        (_bf16(2, 60), _bf16(8, 60), "multiple of 8"),
    ],
)
def test_shape_errors(x, w, message):
    with pytest.raises(InputError, match=message):
        router_gemm(x, w)
