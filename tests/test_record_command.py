"""`aot-build record`: a workload run on a virtual GPU of each architecture, on this CPU-only
machine, recorded for `aot-build --from-record` (aot/record_command.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_process import aot_build


def _aot_build(tmp_path, *args) -> subprocess.CompletedProcess:
    return aot_build(tmp_path, *args, cache_dir=tmp_path / "cache", COLUMNS="200")


def _records(folder: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


@pytest.mark.slow
def test_a_program_is_recorded_on_a_virtual_gpu_of_each_architecture(tmp_path):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    pytest.importorskip("torch", reason="needs torch")
    program = ("python", "-m", "tests.user_kernels.training_program")
    done = _aot_build(tmp_path, "record", "--arch", "sm90a,sm100a", "--out", "rec", "--", *program)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for arch, profile in (("sm_90a", "h200"), ("sm_100a", "b200")):
        records = _records(tmp_path / "rec" / arch)
        assert records and {record["arch"] for record in records} == {arch}
        blocks = {
            dict(json.loads(record["key"]["call"])["args"])["block"]["value"] for record in records
        }
        assert {128, 256, 384, 1024} <= blocks  # forward, backward, Library.impl, compiled
        assert f"recording on a virtual {profile} ({arch})" in done.stderr
        assert f"{arch}: ok, {len(records)} calls recorded" in done.stderr
    assert "next: aot-build --from-record rec\n" in done.stderr
    # the build it names plans each architecture's records for that architecture only
    plan = _aot_build(tmp_path, "--from-record", "rec", "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    planned = json.loads(plan.stdout)["plan"]
    for arch in ("sm_90a", "sm_100a"):
        recorded = {record["key_id"] for record in _records(tmp_path / "rec" / arch)}
        assert {key["key_id"] for key in planned[arch]} == recorded


def test_a_failing_run_is_exit_status_1_and_keeps_its_folder(tmp_path):
    done = _aot_build(
        tmp_path,
        *("record", "--arch", "sm90a", "--out", "rec", "--"),
        *(
            sys.executable,
            "-c",
            "import os, sys; print(os.environ['CUTE_AOT_VIRTUAL']); sys.exit(3)",
        ),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "h200\n" in done.stdout  # the workload ran as the architecture's reference GPU
    assert "sm_90a: exit status 3, 0 calls recorded" in done.stderr  # the console's
    assert (tmp_path / "rec" / "sm_90a").is_dir()


def test_a_named_gpu_is_recorded_on_as_itself_beside_an_architecture_s_reference(tmp_path):
    """Two GPUs of one architecture answer differently (SM count, cluster occupancy): --gpu
    records on the one named, into a folder of its own."""
    show = "import os; print('as', os.environ['CUTE_AOT_VIRTUAL'])"
    done = _aot_build(
        tmp_path,
        *("record", "--arch", "sm90a", "--gpu", "h100-sxm", "--out", "rec", "--"),
        *(sys.executable, "-c", show),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:2] == ["as h200", "as h100-sxm"]
    assert "recording on a virtual h100-sxm (sm_90a)" in done.stderr
    assert sorted(path.name for path in (tmp_path / "rec").iterdir()) == ["h100-sxm", "sm_90a"]


@pytest.mark.parametrize(
    "args, said",
    [
        ((), "give either --workload NAME or a COMMAND after `--`"),
        (("--workload", "fa4", "--", "python", "x.py"), "give either --workload NAME or"),
        (("--model", "llama-3.1-8b", "--", "python", "x.py"), "--model chooses a --workload"),
        (("--workload", "fa4", "--model", "gpt-9"), "workload fa4 has no model gpt-9; known:"),
    ],
)
def test_what_to_record_is_one_workload_or_one_command(tmp_path, args, said):
    done = _aot_build(tmp_path, "record", "--arch", "sm90a", "--out", "rec", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in " ".join(done.stderr.split())
    assert not (tmp_path / "rec").exists()


@pytest.mark.parametrize(
    "args, said",
    [
        (("--out", "rec"), "name what to record for: --arch and/or --gpu"),
        (("--gpu", "h300", "--out", "rec"), "unknown GPU profile 'h300'; known: h200, h100-sxm"),
    ],
)
def test_what_to_record_on_is_an_architecture_or_a_known_gpu(tmp_path, args, said):
    done = _aot_build(tmp_path, "record", *args, "--", sys.executable, "-c", "pass")
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in " ".join(done.stderr.split())
    assert not (tmp_path / "rec").exists()


def test_models_lists_the_fa4_workload_with_its_models_and_configurations(tmp_path):
    done = _aot_build(tmp_path, "models", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    fa4 = json.loads(done.stdout)["workloads"]["fa4"]
    assert {"llama-3.1-8b", "qwen3-8b", "gpt-oss-20b", "deepseek-v3"} <= set(fa4["models"])
    assert fa4["configs"] == ["prefill", "decode", "split_kv", "train", "fp8"]
    table = _aot_build(tmp_path, "models")
    assert "recorded workloads (aot-build record --workload)" in table.stdout
    assert "cute-aot[fa4]" in table.stdout
