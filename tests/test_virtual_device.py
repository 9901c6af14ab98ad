"""A virtual GPU (CUTE_AOT_VIRTUAL) on this CPU-only machine: an unmodified program
(tests/user_kernels/torch_program.py: torch CUDA tensors, the user kernel compiled with and
without TVM-FFI, then called) records what a real GPU of the profile records, and the record
builds. The real-format recording it is compared with is the H200's own
(tests/data/scale_h200.record.jsonl: the same four calls, recorded on an H200 by
benchmarks/recorded_flashinfer.py). Questions no profile answers fail where they are asked,
named with their site. Real processes throughout, activated by the environment alone.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels import gpu_profiles
from cute_aot.kernels.arch import SUPPORTED_ARCHS, arch_for_capability

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "tests" / "user_kernels" / "torch_program.py"
H200_RECORD = REPO / "tests" / "data" / "scale_h200.record.jsonl"


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env.update(PYTHONPATH=path, CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def _python(tmp_path, *argv, check=True, **env) -> subprocess.CompletedProcess:
    """`python ARGV` in a fresh process working in `tmp_path`, with `env` for CUTE_AOT_*."""
    done = subprocess.run(
        [sys.executable, *argv],
        env=_env(tmp_path, **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _program(tmp_path, *args, check=True, **env) -> subprocess.CompletedProcess:
    return _python(tmp_path, "-m", "tests.user_kernels.torch_program", *args, check=check, **env)


def _lines(done) -> list[dict]:
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _records(folder: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def _needs_the_dsl_and_torch():
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    pytest.importorskip("torch", reason="needs torch")


# -- the profiles file ----------------------------------------------------------------------------
def test_every_profile_value_names_its_source_and_its_capability_is_its_arch():
    for name, profile in gpu_profiles.profiles().items():
        answers = {
            *profile.attributes,
            "name",
            "driver_version",
            *(["total_memory"] if profile.total_memory is not None else []),
            *(f"max_active_clusters({size})" for size in profile.max_active_clusters),
        }
        assert set(profile.sources) == answers, name
        assert all(source.strip() for source in profile.sources.values()), name
        assert arch_for_capability(*profile.capability) == profile.arch, name
    for arch in SUPPORTED_ARCHS:
        assert gpu_profiles.profile(arch).arch == arch  # each architecture has its reference


def test_profiles_are_named_by_model_or_architecture_and_unknown_names_are_refused():
    assert gpu_profiles.profile("sm_100a").name == "b200"
    assert gpu_profiles.profile("B200") is gpu_profiles.profile("b200")
    assert gpu_profiles.profile("sm103a").device_name == "NVIDIA B300 SXM6 AC"
    with pytest.raises(UnsupportedProblemError, match="'h300'.*h200, h100-sxm, b200, b300"):
        gpu_profiles.profile("h300")


def test_an_override_changes_the_answer_and_says_so_but_not_the_architecture():
    base = gpu_profiles.profile("b200")
    changed = gpu_profiles.with_overrides(base, {"attributes": {"MULTIPROCESSOR_COUNT": 140}})
    assert (changed.sm_count, base.sm_count) == (140, 148)
    assert changed.sources["MULTIPROCESSOR_COUNT"] == "overridden by the user"
    assert changed.describe() == {
        "profile": "b200",
        "arch": "sm_100a",
        "overrides": {"attributes": {"MULTIPROCESSOR_COUNT": 140}},
    }
    with pytest.raises(UnsupportedProblemError, match="9.0 is not sm_100a"):
        gpu_profiles.with_overrides(base, {"attributes": {"COMPUTE_CAPABILITY_MAJOR": 9}})


# -- a virtual GPU records what the real one records -----------------------------------------------
@pytest.mark.slow
def test_a_virtual_h200_records_the_h200s_keys_and_the_record_builds(tmp_path):
    """The four calls give the key ids (and whole keys) the H200 recorded; the kernels ran as
    stubs (returned None); the record then builds on this CPU, every key."""
    _needs_the_dsl_and_torch()
    done = _program(tmp_path, CUTE_AOT_VIRTUAL="h200", CUTE_AOT_RECORD=f"{tmp_path}/rec/")
    calls = [line for line in _lines(done) if "call" in line]
    assert [c["returned"] for c in calls] == ["None"] * 4
    virtual = {r["key_id"]: r for r in _records(tmp_path / "rec")}
    real = {r["key_id"]: r for r in map(json.loads, H200_RECORD.read_text().splitlines())}
    assert set(virtual) == set(real) and len(real) == 4
    for key_id, record in real.items():
        assert virtual[key_id]["key"] == record["key"], key_id
        assert (virtual[key_id]["arch"], virtual[key_id]["tvm_ffi"]) == (
            "sm_90a",
            record["tvm_ffi"],
        )
    _python(
        tmp_path,
        "-m",
        "cute_aot.aot.cli",
        "--from-record",
        str(tmp_path / "rec"),
        "--arch",
        "sm90a",
        "--out",
        str(tmp_path / "out"),
        "--name",
        "virtual",
        "--quiet",
        "--no-cache",
    )
    (bundle,) = (tmp_path / "out").glob("*.cuteaot")
    assert {entry.key_id for entry in read_manifest(bundle).entries} == set(real)


@pytest.mark.slow
def test_a_hardware_query_is_answered_by_the_profile_and_recorded_with_it(tmp_path):
    """scale_on_every_sm asks HardwareInfo for the SM count: a virtual B200 answers 148, an
    override file 140, and each record keeps the answer and the GPU that gave it."""
    _needs_the_dsl_and_torch()
    override = tmp_path / "fewer-sms.json"
    override.write_text(json.dumps({"base": "b200", "attributes": {"MULTIPROCESSOR_COUNT": 140}}))
    answers = {}
    for spec in ("b200", str(override)):
        folder = tmp_path / f"rec-{len(answers)}"
        done = _program(tmp_path, "--every-sm", CUTE_AOT_VIRTUAL=spec, CUTE_AOT_RECORD=f"{folder}/")
        (info,) = [line for line in _lines(done) if "device" in line]
        assert (info["device"], info["capability"]) == ("NVIDIA B200", [10, 0])
        (record,) = [r for r in _records(folder) if r["target"].endswith("scale_on_every_sm")]
        assert record["arch"] == "sm_100a"
        replay = json.loads(record["key"]["replay"])
        answers[spec] = (replay["hardware"], replay["device"], record["key_id"])
    b200, fewer = answers["b200"], answers[str(override)]
    assert b200[:2] == (
        {"HardwareInfo.get_device_multiprocessor_count()": 148},
        {"name": "NVIDIA B200", "sm_count": 148},
    )
    assert fewer[:2] == (
        {"HardwareInfo.get_device_multiprocessor_count()": 140},
        {"name": "NVIDIA B200", "sm_count": 140},
    )


@pytest.mark.slow
def test_cpu_tensors_stay_real_cuda_ones_are_fake_on_every_thread_and_questions_are_named(tmp_path):
    """Each question no profile answers raises Unanswerable naming it and the program's own line;
    the summary at exit lists each with its site, and the report counts them."""
    _needs_the_dsl_and_torch()
    report = tmp_path / "report.json"
    done = _program(tmp_path, "--ask", CUTE_AOT_VIRTUAL="h200", CUTE_AOT_REPORT=str(report))
    lines = _lines(done)
    (info,) = [line for line in lines if "cpu" in line]
    assert info == {
        "cpu": [0, 1, 2],
        "cuda_on_a_thread": "FakeTensor",
        "device": "NVIDIA H200",
        "capability": [9, 0],
    }
    source = PROGRAM.read_text().splitlines()
    expected = {
        "item": "x.sum().item()",
        "driver": "cuModuleLoadData",
        "timing": "elapsed_time",
        "property": "no_such_property",
    }
    asked = {line["question"]: line for line in lines if "question" in line}
    assert set(asked) == set(expected)
    sites = {}
    for question, text in expected.items():
        (number,) = [
            i + 1 for i, line in enumerate(source) if f'yield "{question}"' in line and text in line
        ]
        sites[question] = f"{PROGRAM}:{number}"
        assert asked[question]["error"] in ("Unanswerable", "UnansweredAttribute"), asked[question]
        assert asked[question]["message"].endswith(f"asked at {sites[question]}")
        assert f"  {sites[question]}: " in done.stderr  # the summary's line for it
    counted = json.loads(report.read_text())["unanswerable"]
    assert sorted(u["site"] for u in counted) == sorted(sites.values())
    assert all(u["times"] == 1 for u in counted)


def test_an_unknown_profile_is_one_line_and_the_program_runs_without_cute_aot(tmp_path):
    """A typo never stops an interpreter (the startup hook runs in every Python process): one
    line names the variable and what it takes, and the program runs as it would without it
    (here, with no GPU, it fails in torch, as a plain run does; no virtual summary)."""
    done = _program(tmp_path, check=False, CUTE_AOT_VIRTUAL="h300")
    said = [line for line in done.stderr.splitlines() if line.startswith("cute-aot")]
    assert said == [
        "cute-aot: CUTE_AOT_VIRTUAL=h300: unknown GPU profile 'h300'; known: h200, h100-sxm, "
        "b200, b300, or an architecture (sm_90a, sm_100a, sm_103a) for its reference profile; "
        "cute-aot is off in this process"
    ]
    assert not _lines(done)  # nothing ran as if on a GPU: torch refused the CUDA tensor


@pytest.mark.slow
def test_an_autotuner_stages_inputs_by_copy_and_a_copy_to_the_host_is_named(tmp_path):
    """What FlashInfer's autotuner does before it times (and timing then is unanswerable): ask
    whether a CUDA graph is capturing, and copy inputs into CUDA buffers. A copy back to host
    memory would read device values: it is named, with its line."""
    _needs_the_dsl_and_torch()
    probe = (
        "import json, torch\n"
        "x = torch.empty(4, 8, device='cuda')\n"
        "x.copy_(torch.ones(4, 8))\n"
        "y = torch.empty(4, 8, device='cuda', dtype=torch.bfloat16).copy_(x)\n"
        "print(json.dumps({'capturing': torch.cuda.is_current_stream_capturing(),\n"
        "                  'copied': [type(y).__name__, str(y.device), list(y.shape)]}))\n"
        "torch.ones(4, 8).copy_(x)\n"
    )
    done = _python(tmp_path, "-c", probe, check=False, CUTE_AOT_VIRTUAL="h200")
    assert done.returncode == 1, done.stdout + done.stderr  # the last line asked the device
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"capturing": False, "copied": ["FakeTensor", "cuda:0", [4, 8]]}
    assert "Unanswerable: virtual GPU h200: copying a CUDA tensor into host memory" in done.stderr
    assert 'File "<string>", line 7' in done.stderr


def test_the_libraries_caches_live_in_a_folder_of_the_process_removed_at_exit(tmp_path):
    probe = (
        "import os, json; print(json.dumps({n: os.environ.get(n) for n in "
        "('FLASHINFER_WORKSPACE_BASE', 'XDG_CACHE_HOME', 'CUTE_DSL_ARCH')}))"
    )
    done = _python(tmp_path, "-c", probe, CUTE_AOT_VIRTUAL="b300")
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["CUTE_DSL_ARCH"] == "sm_103a"  # the profile's, never the DSL's guess
    folder = Path(seen["FLASHINFER_WORKSPACE_BASE"]).parent
    assert (
        folder.name.startswith("cute-aot-virtual.pid")  # atomic.temporary_name's scheme
        and Path(seen["XDG_CACHE_HOME"]).parent == folder
    )
    assert not folder.exists()  # removed when the process ended


WORKLOAD_TESTS = """
import torch

from tests.user_kernels.torch_program import run_user_kernel


def test_compiles_then_checks_numbers():
    run_user_kernel(1000, 128, "tvm_ffi")
    assert torch.ones(4, device="cuda").sum().item() == 4  # no number to read: the workload's


def test_asks_before_it_compiles():
    n = int(torch.ones(4, device="cuda").sum().item())  # its kernel is never reached
    run_user_kernel(n, 128, "tvm_ffi")


def test_compiles():
    run_user_kernel(1000, 256, "tvm_ffi")


def test_checks_unknown_numbers_then_compiles_again():
    x = torch.randn(64, device="cuda")
    torch.testing.assert_close(x * 2, x + x)  # numbers nobody computed: not made, counted
    assert ((x * 2 - (x + x)).abs() < 1e-6).all()  # as pytest rewrites an assert: the same
    run_user_kernel(1000, 64, "tvm_ffi")
"""


@pytest.mark.slow
def test_a_test_suite_s_own_failures_are_told_from_the_recorder_s(tmp_path):
    """pytest as the workload: a test that compiled and then failed on numbers is the
    workload's; one that failed before its compile is the recorder's (its kernel is missing)."""
    _needs_the_dsl_and_torch()
    (tmp_path / "test_workload.py").write_text(WORKLOAD_TESTS)
    report = tmp_path / "report.json"
    done = _python(
        tmp_path,
        *("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_workload.py"),
        check=False,
        CUTE_AOT_VIRTUAL="h200",
        CUTE_AOT_RECORD=str(tmp_path / "records") + "/",
        CUTE_AOT_REPORT=str(report),
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # two tests failed
    failed = json.loads(report.read_text())["failed_tests"]
    assert [row["test"] for row in failed["workload"]] == [
        "test_workload.py::test_compiles_then_checks_numbers"
    ]
    assert [row["test"] for row in failed["recorder"]] == [
        "test_workload.py::test_asks_before_it_compiles"
    ]
    (recorder,) = failed["recorder"]
    assert recorder["compiled"] == 0 and recorder["error"].startswith("Unanswerable")
    assert recorder["site"].endswith("test_workload.py:13")  # its .item() line
    assert "1 the workload's" in done.stderr and "1 the recorder's" in done.stderr
    assert len(_records(tmp_path / "records")) == 3  # the three tests that compiled
    tests = {row["test"].split("::")[1]: row for row in json.loads(report.read_text())["tests"]}
    assert tests["test_checks_unknown_numbers_then_compiles_again"] == {
        "test": "test_workload.py::test_checks_unknown_numbers_then_compiles_again",
        "compile_calls": 1,
        "checks_not_made": 2,
        "outcome": "passed",
    }
    assert tests["test_asks_before_it_compiles"]["outcome"] == "failed (recorder's)"
    assert tests["test_compiles"]["outcome"] == "passed"
