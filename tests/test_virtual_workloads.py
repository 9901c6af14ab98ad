"""A virtual GPU runs what real workloads do (tests/user_kernels/training_program.py, an unmodified
program under CUTE_AOT_VIRTUAL=h200, activated by the environment alone, in a fresh process):
integer devices, views made contiguous, autograd forward and backward that each launch a kernel,
host reads of host-made index tensors, refused reads of what a launch wrote, numeric checks
(assert_close, assert statements, `assert torch.equal`) counted instead of ending the run, graph
capture, and torch.compile regions run eagerly. Also: a process that is not a
virtual GPU keeps torch as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "tests" / "user_kernels" / "training_program.py"


def _site(statement: str) -> str:
    """training_program.py:LINE of the line that holds `statement`."""
    lines = PROGRAM.read_text().splitlines()
    (number,) = [n for n, line in enumerate(lines, 1) if statement in line]
    return f"training_program.py:{number}"


def _run(tmp_path, argv, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    clean.update(PYTHONPATH=path, CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"), **env)
    return subprocess.run(
        [sys.executable, *argv],
        env=clean,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """(cases by name, recorded calls, stderr) of one run of the training program."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    pytest.importorskip("torch", reason="needs torch")
    tmp_path = tmp_path_factory.mktemp("training")
    done = _run(
        tmp_path,
        ["-m", "tests.user_kernels.training_program"],
        CUTE_AOT_VIRTUAL="h200",
        CUTE_AOT_RECORD=f"{tmp_path}/rec/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cases = {
        line["case"]: line for line in map(json.loads, done.stdout.splitlines()) if "case" in line
    }
    records = [
        json.loads(line)
        for path in sorted((tmp_path / "rec").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return cases, records, done.stderr


def _blocks(records) -> list[int]:
    """The user kernel's block size of each recorded call, in order."""
    return [dict(json.loads(record["key"]["call"])["args"])["block"]["value"] for record in records]


def test_an_integer_device_is_the_virtual_cuda_device(training):
    cases, _, _ = training
    assert cases["integer_device"] == {
        "case": "integer_device",
        "ok": True,
        "devices": ["cuda:0", "cuda:0", "cuda:0"],
    }


def test_a_strided_view_is_made_contiguous(training):
    cases, _, _ = training
    assert cases["contiguous_view"]["contiguous"] == [False, True]
    assert cases["contiguous_view"]["shape"] == [8, 2, 4]


def test_a_backward_pass_runs_and_records_its_kernel(training):
    cases, records, _ = training
    assert cases["backward"]["grad"] == [[1024], "cuda:0"], cases["backward"]
    # forward (block 128) then backward (block 256): the backward's kernel is in the record
    assert 256 in _blocks(records)
    assert _blocks(records).index(256) > _blocks(records).index(128)


def test_a_host_made_index_tensor_answers_host_reads(training):
    cases, _, _ = training
    assert cases["host_made_index"] == {
        "case": "host_made_index",
        "ok": True,
        "max": 9,
        "offsets": [0, 3, 12, 16],
        "any_long": True,
    }


def test_a_read_of_what_a_launch_wrote_is_refused_with_its_site(training):
    cases, _, stderr = training
    refused = cases["stub_output"]
    assert (refused["ok"], refused["error"]) == (False, "Unanswerable")
    site = _site('return {"read":')
    assert site in refused["message"] and "made on the device" in refused["message"]
    assert f"{site}: a value of a CUDA tensor" in stderr  # the summary names it


def test_a_check_of_unknown_values_is_counted_and_the_run_goes_on_to_its_next_kernel(training):
    cases, records, stderr = training
    assert cases["check_then_next_kernel"]["after_the_check"] is True
    assert "3 numeric checks not made" in stderr
    assert f"{_site('torch.testing.assert_close(y')} x1" in stderr
    assert f"{_site('assert (y - 0.5 * y)')} x1" in stderr
    # the kernel after the check (block 64) was compiled and recorded
    assert 64 in _blocks(records)


def test_an_asserted_torch_equal_of_unknown_values_is_counted_and_the_run_goes_on(training):
    cases, records, stderr = training
    assert cases["equal_check_then_next_kernel"]["after_the_check"] is True, cases
    assert f"{_site('assert torch.equal(')} x1" in stderr
    assert 32 in _blocks(records)


@pytest.mark.parametrize(
    "case, block",
    [
        ("compiled_region", 1024),  # torch.compile(fullgraph=True) of a custom op: run eagerly
        ("library_kernel", 384),  # an op's CUDA kernel from Library.impl, as vLLM registers
    ],
)
def test_python_around_a_kernel_runs_and_records_it_where_a_fake_would_launch_nothing(
    training, case, block
):
    cases, records, _ = training
    assert cases[case] == {"case": case, "ok": True, "shape": [4096], "device": "cuda:0"}
    assert block in _blocks(records)


def test_a_graph_capture_runs_its_work_and_a_replay_launches_nothing(training):
    cases, records, _ = training
    assert cases["graph_capture"] == {
        "case": "graph_capture",
        "ok": True,
        "capturing": True,
        "after": False,
    }
    assert 512 in _blocks(records)


def test_a_process_that_is_not_virtual_keeps_torch_as_it_was(tmp_path):
    """No guard for CUDA is registered and no accelerator appears without CUTE_AOT_VIRTUAL."""
    torch = pytest.importorskip("torch", reason="needs torch")
    if torch.backends.cuda.is_built():
        pytest.skip("a CUDA build of torch has its own CUDA guard: nothing to tell apart")
    probe = textwrap.dedent(
        """
        import torch
        try:
            torch.device(0)
            print("device 0")
        except RuntimeError as exc:
            print("refused:", exc)
        """
    )
    plain = _run(tmp_path, ["-c", probe])
    assert plain.stdout.strip() == (
        "refused: Cannot access accelerator device when none is available."
    ), plain.stderr
    virtual = _run(tmp_path, ["-c", probe], CUTE_AOT_VIRTUAL="h200")
    assert virtual.stdout.strip() == "device 0", virtual.stderr
