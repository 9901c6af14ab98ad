"""Records from a fleet: CUTE_AOT_RECORD as a file, a folder or a URL prefix (one file per
process), read back by `aot-build --from-record` each distinct kernel once, with a call recorded on
GPUs that answered its hardware queries differently built once per answer. Real components: moto's
S3 server on loopback (tests/test_fleet_misses.py's fixtures), real processes and signals.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from cute_aot.aot.report import ConsoleNotes
from tests import test_fleet_misses as _fleet_misses
from tests.test_fleet_misses import BUCKET

# tests/test_fleet_misses.py's fixtures, found by pytest under these names (used by name below)
aws_env = _fleet_misses.aws_env
s3_endpoint = _fleet_misses.s3_endpoint

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")

REPO = Path(__file__).resolve().parents[1]
H200 = {"name": "NVIDIA H200", "sm_count": 132}
H100_PCIE = {"name": "NVIDIA H100 PCIe", "sm_count": 114}
SM_COUNT = "HardwareInfo.get_device_multiprocessor_count()"


def _record(block: int, device: dict | None = None, site: str = "server.py:1") -> dict:
    from tests.test_recorded_calls import _call

    call = _call(block)
    key = call.key({SM_COUNT: device["sm_count"]}, device) if device else call.key()
    return {
        "format": 1,
        "family": "cute_compile",
        "recreatable": True,
        "arch": "sm_90a",
        "site": site,
        "target": call.target,
        "key_id": key.id,
        "key": key.fields(),
        "tvm_ffi": True,
    }


def _plan(source):
    from cute_aot.aot.planning import plan_from_record

    return plan_from_record(source, (), ConsoleNotes(Console(file=io.StringIO(), width=200)))


def test_a_call_recorded_on_gpus_that_answer_differently_is_one_kernel_per_answer(tmp_path):
    """The answers are part of the key id: both kernels are planned side by side (one bundle
    holds both), each distinct kernel once, and a call whose trace asked nothing keeps its id."""
    folder = tmp_path / "records"
    folder.mkdir()
    plain = _record(256)
    on_h200, on_h100 = _record(64, H200), _record(64, H100_PCIE, "other.py:9")
    (folder / "h200-1.record.jsonl").write_text(
        json.dumps(on_h200) + "\n" + json.dumps(plain) + "\n"
    )
    (folder / "h100-2.record.jsonl").write_text(
        json.dumps(on_h100) + "\n" + json.dumps(plain) + "\n"
    )
    plan, left_out = _plan(f"{folder}/")
    assert left_out == []
    # files are read in name order: h100-2 first, then h200-1
    assert [key.id for key in plan["sm_90a"]] == [
        on_h100["key_id"],
        plain["key_id"],
        on_h200["key_id"],
    ]
    assert len({on_h100["key_id"], on_h200["key_id"], plain["key_id"]}) == 3
    from tests.test_recorded_calls import _call

    assert plain["key_id"] == _call(256).key().call_id  # no answers: the call's own id
    assert on_h200["key_id"] != _call(64).key().call_id


def test_one_shared_file_keeps_each_answer_once(tmp_path):
    from cute_aot.runtime.capture.record import Recorder, _subject

    shared = tmp_path / "calls.jsonl"
    for device in (H200, H100_PCIE, H200, None):  # recorders of processes on two GPUs, one file
        record = _record(64 if device else 256, device)
        Recorder(shared)._append(record, _subject(record))
    lines = [json.loads(line) for line in shared.read_text().splitlines()]
    assert len(lines) == 3 and len({line["key_id"] for line in lines}) == 3
    plan, left_out = _plan(shared)
    assert left_out == [] and [k.id for k in plan["sm_90a"]] == [line["key_id"] for line in lines]


_WORKER = """
import sys, time
from cute_aot.runtime import compile_hook
from cute_aot.runtime.capture import record
from tests.test_recorded_calls import _call
recorder = record.record_from_env()
recorder.add(_call(int(sys.argv[1])), None, {}, None, "worker.py:3")
print("recorded", flush=True)
time.sleep(120)
"""


def test_a_url_prefix_gets_each_process_file_even_when_it_is_terminated(
    tmp_path,
    aws_env,
    s3_endpoint,
):
    """One file per process under the prefix, written in the background: a worker that a pool
    ends with SIGTERM still writes what it holds; the build reads the whole prefix."""
    aws_env.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    prefix = f"s3://{BUCKET}/records-{time.monotonic_ns()}/"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CUTE_AOT_RECORD": prefix,
        "CUTE_AOT_CACHE_DIR": str(tmp_path / "cache"),
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(block)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            text=True,
        )
        for block in (64, 128)
    ]
    for worker in workers:
        assert worker.stdout.readline().strip() == "recorded"
        worker.send_signal(signal.SIGTERM)
    assert [worker.wait(timeout=60) for worker in workers] == [-signal.SIGTERM] * 2

    from cute_aot.artifacts.core import urls
    from cute_aot.kernels.recorded import read_records

    fs, root = urls.filesystem(prefix)
    names = sorted(path.rsplit("/", 1)[-1] for path in fs.find(root))
    assert len(names) == 2 and all(name.endswith(".record.jsonl") for name in names), names
    assert {str(w.pid) for w in workers} == {name.split("-")[-2] for name in names}
    found = read_records(prefix)
    assert len(found) == 2 and all(where.startswith(f"s3://{BUCKET}/") for where, _ in found)
    assert len(_plan(prefix)[0]["sm_90a"]) == 2


def test_an_unreachable_store_never_slows_a_record(tmp_path, aws_env):
    from cute_aot.runtime import process_files
    from cute_aot.runtime.capture.record import Recorder
    from tests.test_fleet_misses import _closed_port
    from tests.test_recorded_calls import _call

    aws_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    recorder, call = Recorder(f"s3://{BUCKET}/records/"), _call(64)
    started = time.perf_counter()
    recorder.add(call, None, {}, None, "server.py:1")
    assert time.perf_counter() - started < 0.5  # into memory; the store is the writer's problem
    process_files.discard(f"s3://{BUCKET}/records/", "record")  # no writer left retrying


def test_the_id_covers_the_hardware_answers_and_nothing_else_of_the_replay_data():
    from cute_aot.kernels.recorded import RecordedCallKey
    from tests.test_recorded_calls import _call

    plain = _call(64).key()
    replay = json.loads(plain.replay)
    other_examples = RecordedCallKey(plain.call, json.dumps({**replay, "examples": [1, 2]}))
    answered = _call(64).key({SM_COUNT: 132}, H200)
    same_answers_other_gpu = _call(64).key(
        {SM_COUNT: 132}, {"name": "NVIDIA H100", "sm_count": 132}
    )
    assert other_examples.id == plain.id == plain.call_id
    assert answered.id != plain.id and answered.call_id == plain.id
    assert same_answers_other_gpu.id == answered.id  # the answers identify it, not the GPU's name
    assert _call(64).key({SM_COUNT: 114}, H100_PCIE).id not in (answered.id, plain.id)
