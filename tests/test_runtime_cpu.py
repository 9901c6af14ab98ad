"""Runtime behaviour that needs no GPU: compatibility checks before any dlopen, input checks."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.bundle_writer import write_bundle
from cute_aot.artifacts.core.errors import IncompatibleBundleError, InputError
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


def test_a_caller_catching_value_error_catches_a_refused_input():
    with pytest.raises(ValueError, match="x must be bfloat16") as caught:
        router_gemm(torch.zeros(2, 64), _bf16(8, 64))
    assert type(caught.value) is InputError


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


def test_router_shapes_come_from_moe_gate_weights():
    from cute_aot.runtime import model_shapes

    def router_shapes(model):
        return model_shapes(model).get("router_gemm", [])

    class Block(torch.nn.Module):
        def __init__(self, k, n):
            super().__init__()
            self.gate = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
            self.gate_proj = torch.nn.Linear(k, 4 * k, bias=False, dtype=torch.bfloat16)

    class Router(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = torch.nn.Linear(2880, 128, bias=False, dtype=torch.bfloat16)

    model = torch.nn.ModuleDict(
        {"a": Block(64, 8), "b": Block(64, 8), "c": Block(128, 16), "d": Router()}
    )
    assert model_shapes(model) == {"router_gemm": [(8, 64), (16, 128), (128, 2880)]}
    assert model_shapes(torch.nn.Linear(64, 8, dtype=torch.bfloat16)) == {}
    fp32 = torch.nn.ModuleDict({"a": torch.nn.ModuleDict({"gate": torch.nn.Linear(64, 8)})})
    assert router_shapes(fp32) == []


def test_custom_op_has_a_fake_implementation():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cute_aot.runtime  # noqa: F401  (registers the op)

    with FakeTensorMode():
        x = torch.empty(4, 64, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(8, 64, dtype=torch.bfloat16, device="cuda")
        out = torch.ops.cute_aot.router_gemm(x, w)
    assert out.shape == (4, 8) and out.dtype == torch.float32


def test_same_cutlass_dsl_ignores_flavours_present_on_one_side_only():
    built = {
        "nvidia-cutlass-dsl": "4.8.1",
        "nvidia-cutlass-dsl-libs-cu12": "4.8.1",
        "nvidia-cutlass-dsl-libs-cu13": "4.8.1",
    }
    server = {"nvidia-cutlass-dsl": "4.8.1", "nvidia-cutlass-dsl-libs-cu13": "4.8.1"}
    assert toolchain.same_cutlass_dsl(built, server)
    assert not toolchain.same_cutlass_dsl(built, {**server, "nvidia-cutlass-dsl": "4.9.0"})
    assert not toolchain.same_cutlass_dsl(
        built, {**server, "nvidia-cutlass-dsl-libs-cu13": "4.8.0"}
    )
    assert not toolchain.same_cutlass_dsl({}, server)


def test_kernels_are_resolved_per_device_architecture(monkeypatch):
    """Each device index is asked for its own capability: a Hopper and a Blackwell GPU in one
    process get kernels of their own architecture."""
    from cute_aot.runtime import device

    device.device_arch.cache_clear()
    capabilities = {0: (9, 0), 1: (10, 0), 2: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capabilities[index])
    try:
        assert device.device_arch(0) == "sm_90a"
        assert device.device_arch(1) == "sm_100a"
        assert device.device_arch(2) is None
    finally:
        device.device_arch.cache_clear()


def _fresh_manifest(**toolchain_changes):
    """A manifest that is current for the installed router family (not stale)."""
    from cute_aot.kernels import family_facts

    return dataclasses.replace(
        _manifest(),
        families={"router_gemm": family_facts("router_gemm")},
        toolchain={**toolchain.fingerprint(), **toolchain_changes},
    )


def _never_dlopen(monkeypatch):
    from cute_aot.runtime import loader

    def refuse(*args):
        raise AssertionError("dlopen reached")

    monkeypatch.setattr(loader, "_load_library", refuse)
    monkeypatch.setattr(loader, "check_library", refuse)  # not even the library's bytes are read


def test_a_stale_bundle_is_refused_before_its_library_is_read(fresh_runtime, tmp_path, monkeypatch):
    from cute_aot.runtime import REGISTRY, StaleBundleError, set_mode

    _never_dlopen(monkeypatch)
    stale = tmp_path / "stale-sm_90a.cuteaot"
    manifest = _fresh_manifest()
    facts = {**manifest.families["router_gemm"], "source_hash": "cd" * 32}  # other sources
    write_bundle(
        stale, dataclasses.replace(manifest, families={"router_gemm": facts}), NOT_A_LIBRARY
    )
    with pytest.warns(RuntimeWarning, match="not used for router_gemm.*source hash"):
        assert REGISTRY.load(stale, gpu_arch="sm_90a") == []  # auto: skipped, no dlopen
    assert REGISTRY.bundles == []
    set_mode("aot")
    with pytest.raises(StaleBundleError, match="stale.*router_gemm: kernel source hash"):
        REGISTRY.load(stale, gpu_arch="sm_90a")


def test_a_too_old_driver_is_refused_before_dlopen(fresh_runtime, tmp_path, monkeypatch):
    from cute_aot.artifacts.core.errors import DriverTooOldError
    from cute_aot.runtime import REGISTRY, device

    _never_dlopen(monkeypatch)
    monkeypatch.setattr(device, "driver_cuda_version", lambda: (12, 4))
    path = tmp_path / "b-sm_90a.cuteaot"
    write_bundle(path, _fresh_manifest(cuda_runtime_major=13), NOT_A_LIBRARY)
    with pytest.raises(DriverTooOldError, match="CUDA 13 runtime, this driver supports CUDA 12.4"):
        open_bundle(path, gpu_arch="sm_90a")
    # in a folder, mode auto skips it (its kernels fall back) instead of failing the server
    with pytest.warns(RuntimeWarning, match="skipping bundle.*CUDA 12.4"):
        assert REGISTRY.load(tmp_path, gpu_arch="sm_90a") == []
    # a new enough driver passes this check (and reaches the library checks, refused here)
    monkeypatch.setattr(device, "driver_cuda_version", lambda: (13, 0))
    with pytest.raises(AssertionError, match="dlopen reached"):
        open_bundle(path, gpu_arch="sm_90a")


@pytest.mark.parametrize("with_out", [False, True], ids=["returned", "out="])
def test_torch_compile_traces_the_torch_op_not_the_hit_path(with_out):
    """fullgraph: under dynamo the op calls the torch op (with its Meta kernel), never the hit
    path's dict lookup and foreign C call."""
    from cute_aot.runtime import op

    router_gemm = op("router_gemm")
    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module)
        (outputs,) = [node.args[0] for node in graph_module.graph.nodes if node.op == "output"]
        # traced only: there is no CPU kernel to run
        return lambda *args: [torch.zeros(2, 8) for _ in outputs]

    def forward(x, w, out):
        logits = router_gemm(x, w, out=out) if with_out else router_gemm(x, w)
        return torch.softmax(logits, dim=-1)

    x, w = _bf16(2, 64), _bf16(8, 64)
    torch.compile(forward, fullgraph=True, backend=record)(x, w, torch.empty(2, 8))
    (graph,) = graphs
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert "cute_aot.router_gemm" in targets


def test_making_an_op_imports_neither_dynamo_nor_cutlass():
    """A server pays for the op, not for torch.compile's machinery (seconds) or the DSL."""
    script = (
        "import sys, torch; from cute_aot.runtime import router_gemm, op; op('router_gemm'); "
        "print(sorted({m.split('.')[0] if m.startswith('cutlass') else m for m in sys.modules "
        "if m.startswith(('torch._dynamo', 'cutlass'))}))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
