"""Any CuTe DSL kernel, no family: record `cute.compile` calls, replay them on a CPU
(`aot-build --from-record`), serve them back at `cute.compile` (`intercept()`).

The kernel is a user's plain `@cute.jit` function (tests/user_kernels/scale.py); calls are made
the way a CPU can make them (tensors typed as CUDA tensors over no memory, sm_90a, TVM-FFI or the
DSL's own calling convention), so
every step runs here for real: the recorder in one process, the build in its workers, the
interceptor in another process, whose real compiles are counted.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")

REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    env.update(PYTHONPATH=str(REPO), CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def _compile_calls(tmp_path, specs, **env) -> list[dict]:
    """Run tests/user_kernels/compile_calls.py in a fresh process: one result per N:BLOCK."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.user_kernels.compile_calls", *specs],
        env=_env(tmp_path, **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _aot_build(tmp_path, *args) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "cute_aot.aot.cli", *map(str, args), "--quiet"]
    return subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=900)


# -- the key, derived without tracing -------------------------------------------------------------
def _described(n=1000, block=128, align=16, dtype="float32", factor=2.0):
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import describe_call
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.scale import scale

    x, y, _, stream = arguments(n, align, dtype)
    options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
    return describe_call(options, scale, (x, y, factor, stream), {"block": block})


def _key(**given):
    return _described(**given).key()


def test_the_key_ignores_runtime_values_and_keeps_compile_time_ones():
    base = _key()
    assert _key(n=77).id == base.id  # a dynamic size
    assert _key(factor=0.5).id == base.id  # a dynamic scalar (annotated Float32)
    assert _key(block=256).id != base.id  # a Constexpr
    assert _key(align=8).id != base.id  # the tensor's assumed alignment is in its type
    assert _key(dtype="bfloat16").id != base.id
    call = base.call_data
    assert call["target"] == {"function": "tests.user_kernels.scale:scale"}
    assert call["options"] == {"EnableTVMFFI": True}  # GPUArch is the bundle's, not the key's
    assert [name for name, _ in call["args"]] == ["x", "y", "factor", "stream", "block"]
    assert call["args"][0][1] == {
        "dlpack": {
            "align": 16,
            "dtype": "Float32",
            "layout": "gmem o (?):(1)",
            "stride32": False,
            "tvm_ffi": False,
        }
    }
    assert base.replay_data["examples"][0]["shape"] == [1000]


def test_the_identity_json_is_written_exactly_as_canonical_json_writes_it():
    """A hit writes the identity's JSON from cached pieces: byte for byte canonical(identity),
    constants the cache could confuse included (-0.0 and 0.0, 1 and True, NaN), and the same
    again when every piece comes from the cache."""
    from cute_aot.kernels.recorded import canonical

    constants = [128, 1, True, 0.0, -0.0, float("nan"), None, 'quote " and \u00e9']
    given = [{"block": b} for b in constants] + [{"align": 8}, {"dtype": "bfloat16"}, {"n": 7}]
    first = [_described(**g) for g in given]
    again = [_described(**g) for g in given]
    for call, repeated in zip(first, again, strict=True):
        assert call.identity_json == canonical(call.identity)
        assert repeated.identity_json == call.identity_json
        # its id, hashed over the escaped text written alike, is the one digest's of the call
        assert call.call_id == repeated.call_id == _digest_of_call(canonical(call.identity))
    ids = [call.call_id for call in first]
    assert len(set(ids)) == len(ids) - 1  # only a dynamic size (n=7) keeps the id of block=128
    assert ids[-1] == ids[0]


def _digest_of_call(call_json: str) -> str:
    from cute_aot.artifacts.digest import KEY_ID_LENGTH, json_digest
    from cute_aot.kernels.recorded import FAMILY, FAMILY_VERSION

    identity = {"family": FAMILY, "call": call_json, "version": FAMILY_VERSION}
    return json_digest(identity, length=KEY_ID_LENGTH)


def test_fake_tensors_sharing_a_size_or_not_are_described_apart_from_the_cache():
    """Fake tensors, fake streams and dynamic DSL scalars are described once per kind, like
    tensors: the cached pieces keep each call's numbering of its symbolic sizes, so two fake
    tensors of one size `n` and two of their own sizes stay two calls, and a call made again
    with fresh symbols is the same call, each written as canonical(identity)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from cute_aot.kernels.recorded import canonical
    from cute_aot.kernels.recorded.calls import describe_call
    from tests.user_kernels.scale import scale

    def described(shared: bool, factor=2.0):
        sizes = [cute.sym_int()] * 2 if shared else [cute.sym_int(), cute.sym_int()]
        x, y = (make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16) for n in sizes)
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
        return describe_call(options, scale, (x, y, factor, stream), {"block": 128})

    calls = [described(True), described(False), described(True), described(False)]
    calls.append(described(True, cutlass.Float32(0.5)))
    for call in calls:
        assert call.identity_json == canonical(call.identity)
        assert call.call_id == _digest_of_call(call.identity_json)
    shared, own, shared_again, own_again, numeric = (call.call_id for call in calls)
    assert shared == shared_again != own == own_again
    assert numeric != shared  # a DSL Float32 is typed, unlike the float 2.0
    sizes = [args[1]["fake"]["shape"][0]["sym"]["n"] for args in calls[1].identity["args"][:2]]
    assert sizes == [0, 1]


def test_marks_are_logged_as_given_and_spelled_out_as_a_record_keeps_them():
    """The hook logs a tensor's `mark_*` calls as given (an append on the caller's path, served
    or not); a record spells each out with the method's defaults, tuples as lists."""
    from cutlass.cute.runtime import from_dlpack

    from cute_aot.kernels.recorded.calls import MARKS_ATTRIBUTE, _example, logged_marks
    from cute_aot.kernels.recorded.replay import MetadataTensor
    from cute_aot.runtime.compile_hook import install_hook

    install_hook()
    tensor = from_dlpack(MetadataTensor((64, 32), (32, 1), "float32"), assumed_align=16)
    assert logged_marks(tensor) is None
    tensor.mark_layout_dynamic(1)
    tensor.mark_compact_shape_dynamic(0, (0, 1), divisibility=8)
    assert vars(tensor)[MARKS_ATTRIBUTE] == [
        ("mark_layout_dynamic", (1,), {}),
        ("mark_compact_shape_dynamic", (0, (0, 1)), {"divisibility": 8}),
    ]
    spelled = [
        ["mark_layout_dynamic", {"leading_dim": 1}],
        ["mark_compact_shape_dynamic", {"mode": 0, "stride_order": [0, 1], "divisibility": 8}],
    ]
    assert logged_marks(tensor) == spelled
    assert _example({"dlpack": {}}, tensor)["marks"] == spelled


def test_a_kernel_object_holding_classes_is_described_by_their_names_and_rebuilt():
    """Classes in a kernel object's state (FlashInfer's GDN prefill keeps its MRO in its compile
    key) are described by importable name; the replay rebuilds an object of the same identity.
    A class defined inside a function is not importable, and says so."""
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import NotRecreatable, describe_call
    from cute_aot.kernels.recorded.replay import rebuild
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.keyed import KeyedScale

    x = arguments(1000)[0]
    call = describe_call(cute.compile, KeyedScale(128), (x, 1000), {})
    name, described = call.identity["args"][0]
    assert name == "self"
    assert described["state"]["_compile_key"]["tuple"][0] == {
        "tuple": [
            {"class": "tests.user_kernels.keyed:KeyedScale"},
            {"class": "builtins:object"},
        ]
    }
    rebuilt = rebuild(described, None, {})
    assert type(rebuilt) is KeyedScale and rebuilt._compile_key[0] == KeyedScale.__mro__
    again = describe_call(cute.compile, rebuilt, (x, 1000), {})
    assert again.identity_json == call.identity_json

    class Local(KeyedScale):
        pass

    with pytest.raises(NotRecreatable, match="defined inside a function"):
        describe_call(cute.compile, Local(128), (x, 1000), {})


def test_a_kernel_object_is_described_by_its_state_as_it_is_at_each_call():
    """An object of plain state is described once per state (the next call with that state
    finds it written); a changed value, -0.0 against 0.0, a new attribute and a list whose items
    change are each told apart, exactly as describing afresh tells them."""
    import cutlass.cute as cute

    from cute_aot.kernels.recorded import canonical
    from cute_aot.kernels.recorded.calls import describe_call
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.keyed import StateScale

    x = arguments(1000)[0]

    def described(kernel):
        call = describe_call(cute.compile, kernel, (x, 1000), {})
        assert call.identity_json == canonical(call.identity)
        return call.identity["args"][0][1], call.identity_json

    kernel = StateScale(128, 1e-6)
    state, first = described(kernel)
    assert state == {
        "object": "tests.user_kernels.keyed:StateScale",
        "state": {
            "block": {"py": "int", "value": 128},
            "dtype": {"dsl_type": "Float32"},
            "eps": {"py": "float", "value": 1e-6},
        },
    }
    assert described(StateScale(128, 1e-6))[1] == described(kernel)[1] == first
    kernel.block = 256
    assert described(kernel)[0]["state"]["block"] == {"py": "int", "value": 256}
    zero, negative = described(StateScale(128, 0.0)), described(StateScale(128, -0.0))
    assert zero[0]["state"]["eps"] == {"py": "float", "value": 0.0}
    assert negative[0]["state"]["eps"] == {"py": "float", "value": -0.0}
    assert zero[1] != negative[1]
    kernel.tiles = [1, 2]
    listed = described(kernel)
    kernel.tiles.append(3)
    grown = described(kernel)
    assert listed[0]["state"]["tiles"] == {
        "tuple": [{"py": "int", "value": 1}, {"py": "int", "value": 2}]
    }
    assert len(grown[0]["state"]["tiles"]["tuple"]) == 3
    assert len({first, listed[1], grown[1], described(kernel)[1]}) == 3


def test_served_functions_of_one_signature_share_its_wrapper_and_each_calls_its_own():
    from cute_aot.runtime.compile_hook import _callable_as_compiled

    spec = {
        "arg_names": ["x", "y", "factor"],
        "arg_defaults": [2.0],
        "kwonly_names": ["n"],
        "kwonly_defaults": {"n": 3},
        "env_streams": [],
    }
    first = _callable_as_compiled(lambda *args: ("first", args), spec)
    second = _callable_as_compiled(lambda *args: ("second", args), spec)
    assert first(1, y=2) == ("first", (1, 2, 2.0, 3))
    assert second(1, 2, factor=5.0, n=4) == ("second", (1, 2, 5.0, 4))
    assert first(1, 2) == ("first", (1, 2, 2.0, 3))
    assert second.__code__ is first.__code__  # generated and compiled once per signature


def test_a_closure_cannot_be_replayed_and_says_why():
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import NotRecreatable, describe_call

    @cute.jit
    def local(x: cute.Tensor):
        pass

    with pytest.raises(NotRecreatable, match="defined inside a function"):
        describe_call(cute.compile, local, (None,), {})


@pytest.mark.slow
def test_several_processes_record_each_distinct_call_once(tmp_path):
    """Six processes append the same five calls, in different orders, at once."""
    record = tmp_path / "calls.jsonl"
    child = (
        "import random, sys\n"
        "from cute_aot.runtime.capture.record import Recorder\n"
        "from tests.test_recorded_calls import _call\n"
        "calls = [_call(block) for block in (32, 64, 128, 256, 512)]\n"
        "random.Random(int(sys.argv[1])).shuffle(calls)\n"
        "recorder = Recorder(sys.argv[2])\n"
        "for call in calls * 3:\n"
        "    recorder.add(call, None, {}, None, 'site.py:1')\n"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", child, str(seed), str(record)], env=_env(tmp_path))
        for seed in range(6)
    ]
    assert [p.wait(timeout=300) for p in processes] == [0] * 6
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(lines) == 5
    assert len({line["key_id"] for line in lines}) == 5
    assert all(line["recreatable"] and line["family"] == "cute_compile" for line in lines)


def _call(block: int):
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import describe_call
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.scale import scale

    options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
    return describe_call(options, scale, arguments(1000), {"block": block})


# -- record -> build -> intercept, for real ------------------------------------------------------
@pytest.fixture(scope="module")
def recorded_bundle(tmp_path_factory):
    """Calls recorded in one process, replayed by aot-build on this CPU into a bundle."""
    tmp_path = tmp_path_factory.mktemp("recorded")
    record = tmp_path / "calls.jsonl"
    results = _compile_calls(
        tmp_path, ["1000:128", "4096:256", "77:128", "1000:128:c"], CUTE_AOT_RECORD=str(record)
    )
    assert [r["type"] for r in results] == ["TVMFFIJitCompiledFunctionWithKwargs"] * 3 + [
        "CudaDialectJitCompiledFunction"  # no TVM-FFI asked for: the DSL's own convention
    ]
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(lines) == 3  # 77:128 is 1000:128 again: the size is dynamic
    built = _aot_build(
        tmp_path,
        "--from-record",
        record,
        "--arch",
        "sm90a",
        "--out",
        tmp_path / "bundles",
        "--name",
        "recorded",
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return tmp_path, record, tmp_path / "bundles"


@pytest.mark.slow
def test_mode_aot_serves_recorded_calls_without_compiling(recorded_bundle, tmp_path):
    _, _, bundles = recorded_bundle
    served, missed = _compile_calls(
        tmp_path,
        ["5:128", "1000:64"],
        CUTE_AOT_BUNDLES=str(bundles),
        CUTE_AOT_INTERCEPT="1",
        CUTE_AOT_MODE="aot",
    )
    assert served["type"] == "function" and served["compiles"] == 0  # the bundle's TVM-FFI function
    assert served["counters"]["cute_compile"]["hits"] == 1
    assert missed["error"] == "KernelNotFoundError" and missed["compiles"] == 0
    assert "cute_compile" in missed["message"] and "mode aot" in missed["message"]
    assert "block=64" in missed["message"]  # the miss names the configuration asked for


@pytest.mark.slow
def test_a_compile_without_tvm_ffi_is_served_as_the_dsls_own_compiled_function(
    recorded_bundle, tmp_path
):
    """The bundle exports that key with the DSL's C ABI, so the hit is what `cute.compile`
    itself returns to such a caller (its JitCompiledFunction, loaded from the bundle's
    library), beside a TVM-FFI hit from the same library."""
    from cute_aot.artifacts.bundle import read_bundle
    from cute_aot.artifacts.elf import read_dynamic
    from cute_aot.artifacts.verify import TVM_FFI_EXPORT_PREFIX

    _, _, bundles = recorded_bundle
    c_abi, tvm_ffi, other = _compile_calls(
        tmp_path,
        ["5:128:c", "5:128", "5:64:c"],
        CUTE_AOT_BUNDLES=str(bundles),
        CUTE_AOT_INTERCEPT="1",
        CUTE_AOT_MODE="aot",
    )
    assert c_abi["type"] == "CudaDialectJitCompiledFunction" and c_abi["compiles"] == 0
    assert tvm_ffi["type"] == "function" and tvm_ffi["compiles"] == 0
    assert tvm_ffi["counters"]["cute_compile"]["hits"] == 2
    assert other["error"] == "KernelNotFoundError" and other["compiles"] == 0

    manifest, library = read_bundle(bundles / "recorded-sm_90a.cuteaot")
    exported = read_dynamic(bytes(library)).functions
    by_abi = {entry.abi: entry for entry in manifest.entries}
    assert sorted(e.abi for e in manifest.entries) == ["c", "tvm_ffi", "tvm_ffi"]
    assert by_abi["c"].symbol + "_cuda_load" in exported
    assert TVM_FFI_EXPORT_PREFIX + by_abi["c"].symbol not in exported
    assert TVM_FFI_EXPORT_PREFIX + by_abi["tvm_ffi"].symbol in exported
    assert not any(name.startswith(by_abi["tvm_ffi"].symbol) for name in exported)


@pytest.mark.slow
def test_mode_auto_compiles_a_miss_and_the_next_build_covers_it(recorded_bundle, tmp_path):
    _, _, bundles = recorded_bundle
    log = tmp_path / "misses.jsonl"
    hit, miss = _compile_calls(
        tmp_path,
        ["9:256", "9:64"],
        CUTE_AOT_BUNDLES=str(bundles),
        CUTE_AOT_INTERCEPT="1",
        CUTE_AOT_MISS_LOG=str(log),
    )
    assert hit["type"] == "function" and hit["compiles"] == 0
    assert miss["type"] == "TVMFFIJitCompiledFunctionWithKwargs" and miss["compiles"] == 1
    [logged] = [json.loads(line) for line in log.read_text().splitlines()]
    assert logged["family"] == "cute_compile" and '"value":64' in logged["key"]["call"]
    # the compile that still happened names its call site (the monitor's warn mode)
    assert logged["problem"]["target"] == "tests.user_kernels.scale:scale"
    assert Path(logged["problem"]["site"].rsplit(":", 1)[0]).name == "compile_calls.py"
    built = _aot_build(tmp_path, "--from-misses", log, "--out", tmp_path / "next")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [again] = _compile_calls(
        tmp_path,
        ["9:64"],
        CUTE_AOT_BUNDLES=str(tmp_path / "next"),
        CUTE_AOT_INTERCEPT="1",
        CUTE_AOT_MODE="aot",
    )
    assert again["type"] == "function" and again["compiles"] == 0


@pytest.mark.slow
def test_mode_jit_never_looks_at_bundles(recorded_bundle, tmp_path):
    _, _, bundles = recorded_bundle
    [bypassed] = _compile_calls(
        tmp_path,
        ["5:128"],
        CUTE_AOT_BUNDLES=str(bundles),
        CUTE_AOT_INTERCEPT="1",
        CUTE_AOT_MODE="jit",
    )
    assert bypassed["type"] == "TVMFFIJitCompiledFunctionWithKwargs" and bypassed["compiles"] == 1


@pytest.mark.slow
def test_the_build_lists_what_it_could_not_replay_and_fails(recorded_bundle, tmp_path):
    _, record, _ = recorded_bundle
    mixed = tmp_path / "mixed.jsonl"
    unreplayable = {
        "format": 1,
        "family": "cute_compile",
        "recreatable": False,
        "site": "server.py:42",
        "target": "?",
        "reason": "a closure",
    }
    mixed.write_text(record.read_text() + json.dumps(unreplayable) + "\n")
    built = _aot_build(tmp_path, "--from-record", mixed, "--arch", "sm90a", "--out", tmp_path / "b")
    assert built.returncode == 1
    said = built.stdout + built.stderr
    assert "server.py:42" in said and "a closure" in said, said
    assert "1 recorded call(s)" in said
    assert (tmp_path / "b" / "default-sm_90a.cuteaot").is_file()  # what could be built, was


@pytest.mark.slow
def test_hardware_answers_are_pinned_for_the_architecture_that_gave_them(tmp_path):
    """A trace that asks the GPU for its SM count replays on a CPU with the recorded answer, for
    the recorded architecture only; without the answer the build says which query is missing."""
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import describe_call
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.scale import scale_on_every_sm

    options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
    call = describe_call(options, scale_on_every_sm, arguments(1000), {})
    answered = call.key({"HardwareInfo.get_device_multiprocessor_count()": 132})
    record = tmp_path / "calls.jsonl"
    line = {
        "format": 1,
        "family": "cute_compile",
        "recreatable": True,
        "arch": "sm_90a",
        "site": "server.py:7",
        "target": call.target,
        "key_id": answered.id,
        "key": answered.fields(),
    }
    record.write_text(json.dumps(line) + "\n")
    built = _aot_build(
        tmp_path,
        "--from-record",
        record,
        "--arch",
        "sm90a",
        "--arch",
        "sm100a",
        "--out",
        tmp_path / "b",
    )
    said = built.stdout + built.stderr
    assert built.returncode == 1, said  # sm_100a left out
    assert "replayable there only" in said and "sm_100a" in said
    assert (tmp_path / "b" / "default-sm_90a.cuteaot").is_file()
    assert not (tmp_path / "b" / "default-sm_100a.cuteaot").exists()

    unanswered = {**line, "key": call.key().fields(), "key_id": call.key().id}
    record.write_text(json.dumps(unanswered) + "\n")
    built = _aot_build(
        tmp_path, "--from-record", record, "--arch", "sm90a", "--out", tmp_path / "c"
    )
    said = built.stdout + built.stderr
    assert built.returncode == 1
    assert "HardwareInfo.get_device_multiprocessor_count()" in said, said


def test_the_compute_capability_the_dsl_asks_to_pick_its_target_is_not_a_kernel_question():
    """A real GPU's first compile in a process asks the compute capability (attributes 75, 76)
    when no target is set; the record's architecture states it, so it is not logged, and the
    first call of a process gets the id the same call gets second, or on a virtual GPU. Other
    attributes (81: shared memory per SM) are logged as the trace asked them."""
    from cutlass.base_dsl.runtime import cuda as cuda_helpers

    from cute_aot.kernels.recorded.hardware import logged, pinned

    answers = {f"get_device_attribute({n})": value for n, value in ((75, 9), (76, 0), (81, 1))}
    into: dict = {}
    with pinned(answers), logged(into):  # a GPU that answers these, the recorder around it
        asked = [cuda_helpers.get_device_attribute(n) for n in (75, 76, 81)]
    assert asked == [9, 0, 1]
    assert into == {"get_device_attribute(81)": 1}
