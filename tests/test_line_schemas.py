"""Record and miss-log lines have one schema each (kernels/recorded RECORD_SCHEMA,
artifacts/miss_log MISS_SCHEMA), checked where they are read: a line of the wrong shape is
skipped with one warning naming its file, line number and field, the rest is built or listed,
and a source whose every line is refused is one error, never a traceback. The build runs for
real, with the stub compile worker (tests/stubs.py) standing in for the CuTe DSL compiler; the
readers are not touched."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from cute_aot.aot.cli import main as aot_build
from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from tests.stubs import stub_compile

DATA = Path(__file__).parent / "data" / "previous_commit"
GOOD_RECORD = json.loads((DATA / "record" / "scale.record.jsonl").read_text().splitlines()[0])
GOOD_MISS = json.loads((DATA / "misses" / "misses.jsonl").read_text().splitlines()[0])


def _changed(line: dict, **fields) -> dict:
    """`line` with `fields` set; a field set to ... is left out."""
    changed = {**line, **fields}
    return {name: value for name, value in changed.items() if value is not ...}


def _with_key(line: dict, **fields) -> dict:
    return {**line, "key": {**line["key"], **fields}}


# (the field a warning names, a line of the wrong shape): issue 55's cases
BAD_RECORDS = [
    ("key", _changed(GOOD_RECORD, key="oops")),
    ("arch", _changed(GOOD_RECORD, arch=90)),
    ("key", _with_key(GOOD_RECORD, replay=[])),
    ("key", _changed(GOOD_RECORD, key=...)),
    ("recreatable", _changed(GOOD_RECORD, recreatable="no")),
    ("format", _changed(GOOD_RECORD, format="1")),
]
BAD_MISSES = [
    ("key", _changed(GOOD_MISS, key="oops")),
    ("arch", _changed(GOOD_MISS, arch=90)),
    ("family", _changed(GOOD_MISS, family=["router_gemm"])),
    ("key", _changed(GOOD_MISS, key=...)),
    ("host", _changed(GOOD_MISS, host={"name": "vm"})),
    ("problem", _changed(GOOD_MISS, problem=[1, 2])),
]


def _write_lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def stub_compiler(settings_scope, tmp_path) -> dict:
    """aot-build's context object giving stub objects for the CuTe DSL compiler (aot/cli.py:
    compile_worker): the build, link and pack are real."""
    settings_scope(CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"))
    return {"worker": stub_compile}


def _invoke(command, args: list, obj: dict | None = None) -> tuple:
    """(result, warnings said) of a command line, every warning kept."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = CliRunner().invoke(command, [*map(str, args)], obj=obj)
    return result, [str(warning.message) for warning in said]


def _one_warning_naming(said: list[str], path: Path, line: int, field: str) -> None:
    naming = [text for text in said if f"{path}:{line}:" in text]
    assert len(naming) == 1, said
    assert f"field {field!r}" in naming[0], naming


@pytest.mark.parametrize(("field", "bad"), BAD_RECORDS, ids=[f for f, _ in BAD_RECORDS])
def test_a_record_line_of_the_wrong_shape_is_skipped_and_the_rest_built(
    stub_compiler, tmp_path, field, bad
):
    record = _write_lines(tmp_path / "calls.jsonl", [bad, GOOD_RECORD])
    out = tmp_path / "out"
    result, said = _invoke(
        aot_build, ["--from-record", record, "--out", out, "--no-cache"], stub_compiler
    )
    assert result.exit_code == 0, result.output
    _one_warning_naming(said, record, 1, field)
    assert (out / "default-sm_90a.cuteaot").is_file()


@pytest.mark.parametrize(("field", "bad"), BAD_MISSES, ids=[f for f, _ in BAD_MISSES])
def test_a_miss_line_of_the_wrong_shape_is_skipped_and_the_rest_built(
    stub_compiler, tmp_path, field, bad
):
    log = _write_lines(tmp_path / "misses.jsonl", [GOOD_MISS, bad])
    out = tmp_path / "out"
    result, said = _invoke(
        aot_build, ["--from-misses", log, "--out", out, "--no-cache"], stub_compiler
    )
    assert result.exit_code == 0, result.output
    _one_warning_naming(said, log, 2, field)
    assert (out / "default-sm_90a.cuteaot").is_file()


@pytest.mark.parametrize(("field", "bad"), BAD_MISSES, ids=[f for f, _ in BAD_MISSES])
def test_aot_cache_misses_skips_a_line_of_the_wrong_shape_and_lists_the_rest(tmp_path, field, bad):
    log = _write_lines(tmp_path / "misses.jsonl", [GOOD_MISS, bad])
    result, said = _invoke(aot_cache, ["misses", "--log", log, "--json"])
    assert result.exit_code == 0, result.output
    _one_warning_naming(said, log, 2, field)
    assert [row["key_id"] for row in json.loads(result.stdout)["keys"]] == [GOOD_MISS["key_id"]]


def test_a_record_file_of_refused_lines_is_one_error(tmp_path):
    record = _write_lines(tmp_path / "calls.jsonl", [bad for _, bad in BAD_RECORDS])
    result, said = _invoke(aot_build, ["--from-record", record, "--out", tmp_path / "out"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert f"{record}: none of its {len(BAD_RECORDS)} line(s) is a record line" in result.output
    assert "Traceback" not in result.output
    assert len([text for text in said if str(record) in text]) == len(BAD_RECORDS)


@pytest.mark.parametrize("command", ["aot-build", "aot-cache misses"])
def test_a_miss_log_of_refused_lines_is_one_error(tmp_path, command):
    log = _write_lines(tmp_path / "misses.jsonl", [bad for _, bad in BAD_MISSES])
    if command == "aot-build":
        result, _ = _invoke(aot_build, ["--from-misses", log, "--out", tmp_path / "out"])
    else:
        result, _ = _invoke(aot_cache, ["misses", "--log", log])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert f"{log}: none of its {len(BAD_MISSES)} line(s) is a miss log line" in result.output
