"""`aot-cache records A B`: two recordings compared call by call, as a release engineer checks a
virtual recording against a real one: the same kernels, kernels only in one, and kernels of one
target that differ, with the fields that differ named; calls that could not be recorded are
counted by reason."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
H200_RECORD = REPO / "tests" / "data" / "scale_h200.record.jsonl"


def _records() -> list[dict]:
    return [json.loads(line) for line in H200_RECORD.read_text().splitlines()]


def _changed(record: dict, block: int) -> dict:
    """The record of the same call with another block size: another kernel of one target."""
    call = json.loads(record["key"]["call"])
    call["args"] = [
        [name, {**described, "value": block} if name == "block" else described]
        for name, described in call["args"]
    ]
    text = json.dumps(call, sort_keys=True, separators=(",", ":"))
    return {**record, "key": {**record["key"], "call": text}, "key_id": f"changed{block}"}


def _write(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def _compare(a: str, b: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "cute_aot.aot.tools.aot_cache.cli", "records", a, b, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_identical_recordings_are_the_same_call_for_call(tmp_path):
    records = _records()
    result = _compare(str(H200_RECORD), _write(tmp_path / "b.jsonl", list(reversed(records))))
    assert result["kernels"] == [4, 4] and result["same"] == 4
    assert result["only_a"] == result["only_b"] == result["differing"] == []


def test_a_kernel_of_one_target_that_differs_is_paired_and_its_fields_named(tmp_path):
    first, *rest = _records()
    refused = {"format": 1, "family": "cute_compile", "recreatable": False, "reason": "a lock"}
    b = _write(tmp_path / "b.jsonl", [_changed(first, 512), *rest[:2], refused])
    result = _compare(str(H200_RECORD), b)
    assert result["same"] == 2
    assert [row["key_id"] for row in result["only_a"]] == [rest[2]["key_id"]]
    assert result["only_b"] == []
    (differing,) = result["differing"]
    assert differing["key_ids"] == [first["key_id"], "changed512"]
    assert differing["target"] == "tests.user_kernels.scale:scale"
    block = json.loads(first["key"]["call"])["args"][-1][1]["value"]
    assert differing["fields"] == {"call.args.block.value": [block, 512]}
    assert result["not_recordable"] == [{}, {"a lock": 1}]
