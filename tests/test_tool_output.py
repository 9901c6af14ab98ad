"""The tools' output where release pipelines read it: in a pipe or a CI log (stdout or stderr not
a terminal, as under click's CliRunner), tables keep every path and key whole on one line instead
of folding them into fragments at 80 columns, and --json is there wherever a table is printed.
Also: build planning is a pure module, importable and testable without click."""

import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cute_aot.aot.cli import main as aot_build
from cute_aot.aot.planning import RequestError, StderrNotes, plan_from_record
from cute_aot.aot.report import ConsoleNotes
from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from cute_aot.artifacts.core import terminal
from cute_aot.kernels.recorded import FAMILY, RECORD_FORMAT
from cute_aot.kernels.router_gemm import dispatch
from cute_aot.runtime.misses import forget_recorded, record_miss

LONG = 150  # characters: far past the 80 columns rich gives a stream that is not a terminal


@pytest.fixture(autouse=True)
def piped(tmp_path, monkeypatch, settings_scope):
    """Own cache dir, no bundles from the environment, and no COLUMNS: the width is the pipe's."""
    settings_scope(
        CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"),
        CUTE_AOT_BUNDLES=None,
        CUTE_AOT_MISS_LOG=None,
        CUTE_AOT_MODE=None,
    )
    monkeypatch.delenv("COLUMNS", raising=False)


def long_folder(root, length: int = LONG):
    """A folder whose path is at least `length` characters long."""
    folder = root
    while len(str(folder)) < length:
        folder = folder / "a-release-folder-with-a-long-name"
    folder.mkdir(parents=True)
    return folder


def one_line_with(text: str, output: str) -> str:
    """The first line that holds `text` whole (folded, no line would)."""
    lines = [line for line in output.splitlines() if text in line]
    assert lines, f"{text!r} not whole on one line of:\n{output}"
    return lines[0]


def test_aot_cache_ls_keeps_a_long_path_whole(stub_bundles, tmp_path):
    _, paths, _ = stub_bundles
    bundle = long_folder(tmp_path) / paths[0].name
    shutil.copy(paths[0], bundle)
    assert len(str(bundle)) >= LONG
    result = CliRunner().invoke(aot_cache, ["ls", str(bundle), "--no-overlay"])
    assert result.exit_code == 0, result.output
    assert "router_gemm" in one_line_with(str(bundle), result.stdout)
    listing = json.loads(CliRunner().invoke(aot_cache, ["ls", str(bundle), "--json"]).stdout)
    assert [row["path"] for row in listing["bundles"]] == [str(bundle)]


def test_aot_cache_tables_keep_keys_and_paths_whole(stub_bundles, tmp_path, settings_scope):
    """`misses` (a long log path in its title, 20-hex key ids in rows) and `show` (key ids)."""
    _, paths, _ = stub_bundles
    log = long_folder(tmp_path) / "misses.jsonl"
    settings_scope(CUTE_AOT_MISS_LOG=str(log))
    key = dispatch(3, 128, 2880, "sm_90a")
    forget_recorded()
    record_miss(key, "sm_90a", {"m": 3, "k": 2880, "n": 128})
    assert len(key.id) == 20
    runner = CliRunner()
    misses = runner.invoke(aot_cache, ["misses"])
    assert misses.exit_code == 0, misses.output
    one_line_with(str(log), misses.stdout)
    assert "sm_90a" in one_line_with(key.id, misses.stdout)
    assert json.loads(runner.invoke(aot_cache, ["misses", "--json"]).stdout)["keys"][0][
        "key_id"
    ] == (key.id)
    show = runner.invoke(aot_cache, ["show", str(paths[0])])
    assert show.exit_code == 0, show.output
    shown = json.loads(runner.invoke(aot_cache, ["show", str(paths[0]), "--json"]).stdout)
    for entry in shown["entries"]:
        one_line_with(entry["key_id"], show.stdout)


@pytest.mark.parametrize(
    "command",
    [["ls"], ["env"], ["misses"], ["gc", "--dry-run"], ["verify", "--gpu-arch", "sm_90a"]],
)
def test_every_aot_cache_table_command_has_json(command, stub_bundles):
    folder, _, _ = stub_bundles
    args = [*command, str(folder)] if command[0] in ("ls", "verify") else command
    result = CliRunner().invoke(aot_cache, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert isinstance(json.loads(result.stdout), dict)


def _not_built_records(folder, site: str, target: str):
    record = {
        "format": RECORD_FORMAT,
        "family": FAMILY,
        "site": site,
        "target": target,
        "arch": "sm_90a",
        "recreatable": False,
        "reason": "its arguments hold a Python object that no record can rebuild",
    }
    path = folder / "calls.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def test_aot_build_keeps_the_calls_it_could_not_build_whole(tmp_path):
    """aot-build --from-record: the table of recorded calls not built (on stderr, like all it
    says) keeps a long call site and a 20-hex target whole on one row, then the one-line error."""
    site = str(long_folder(tmp_path / "src")) + "/model.py:123"
    target = "kernel_" + "0123456789abcdef0123"
    records = _not_built_records(tmp_path, site, target)
    result = CliRunner().invoke(
        aot_build, ["--from-record", str(records), "--out", str(tmp_path / "out"), "--no-cache"]
    )
    assert result.exit_code == 1, result.output
    row = one_line_with(site, result.stderr)
    assert target in row and "sm_90a" in row and "no record can rebuild" in row
    assert "no recorded call to build" in result.stderr


def test_aot_build_json_says_an_early_failure_on_stdout(tmp_path):
    """--json: a build that fails before it builds anything still answers a pipeline on stdout,
    with the error its one line on stderr gives."""
    records = _not_built_records(tmp_path, "/src/model.py:1", "kernel_" + "ab" * 10)
    for args, error in [
        (["--arch", "sm999"], "unsupported architecture 'sm999'"),
        (["--from-record", str(records)], f"{records}: no recorded call to build"),
    ]:
        result = CliRunner().invoke(
            aot_build, [*args, "--json", "--out", str(tmp_path / "out"), "--no-cache"]
        )
        assert result.exit_code == 1, result.output
        answer = json.loads(result.stdout)
        assert answer["command"] == "aot-build" and answer["ok"] is False
        assert answer["error"].startswith(error), answer
        assert f"aot-build failed: {answer['error']}" in " ".join(result.stderr.split())


def test_the_not_built_renderers(tmp_path, capsys):
    site = "/" + "x" * LONG + "/model.py:7"
    calls = [(site, "kernel_0123456789abcdef0123", "sm_90a", "why not")]
    ConsoleNotes(terminal.console(stderr=True)).not_built(calls)  # stderr: not a terminal here
    StderrNotes().not_built(calls)
    err = capsys.readouterr().err
    rich_row, plain_row = [line for line in err.splitlines() if site in line]
    assert "kernel_0123456789abcdef0123" in rich_row
    assert plain_row.split("\t") == list(calls[0])


def test_aot_build_models_has_json():
    result = CliRunner().invoke(aot_build, ["models", "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert listing["models"] and all("model" in row for row in listing["models"])


# -- planning without a command line -------------------------------------------------------------
class CollectedNotes:
    def __init__(self):
        self.lines, self.calls = [], []

    def note(self, text):
        self.lines.append(text)

    warning = note

    def not_built(self, calls):
        self.calls += calls


def test_planning_imports_without_click(tmp_path):
    code = (
        "import sys; sys.modules['click'] = None\n"  # any import of click fails
        "import cute_aot.aot.planning\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'click'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['click']"  # only the blocked placeholder


def test_planning_says_what_it_left_out_to_its_notes(tmp_path):
    records = _not_built_records(tmp_path, "model.py:1", "kernel")
    notes = CollectedNotes()
    with pytest.raises(Exception, match="no recorded call to build"):
        plan_from_record(records, (), notes)
    assert notes.calls == [("model.py:1", "kernel", "sm_90a", notes.calls[0][3])]
    assert notes.lines == [f"records: 1 from 1 file(s) in {records}"]


def test_planning_refuses_contradicting_options_without_click():
    from cute_aot.aot.planning import PlanRequest, plan_keys

    request = PlanRequest(
        archs=["sm_90a"],
        shapes={"router_gemm": [(256, 7168)]},
        no_default_shapes=False,
        tables_file=None,
        all_tactics=False,
        tuning_caches=(),
        models=[],
        model_configs=(),
        named_families=["no_such_family"],
        misses_file=None,
        record_file=None,
    )
    with pytest.raises(RequestError, match="--families leaves out"):
        plan_keys(CollectedNotes(), request)
