"""One place for each decision: a test per decision that fails when a second copy appears.

- The environment is read in artifacts/core/settings.py only (CUTE_AOT_* variables and the few of
  other programs cute-aot reads: CC, CUDA_HOME, LD_LIBRARY_PATH, COLUMNS, the DSL's own). Other
  modules may set variables for the processes they start (aot-build's workers, a virtual GPU's
  caches), never read them.
- The cache folder has one name: settings.cache_dir.
- JSON-lines files (miss logs, records, aot-tune's results) are read and appended to by
  artifacts/core/json_lines.py only, with one policy for a line that is no JSON object.
"""

import ast
import json
import os
import re
from pathlib import Path

import pytest

from tests.package_source import ROOT, package_files, parsed

SETTINGS = ROOT / "artifacts" / "core" / "settings.py"
JSON_LINES = ROOT / "artifacts" / "core" / "json_lines.py"
WRITES = ("update", "pop", "setdefault")


def _modules():
    return package_files()


def environment_reads(path: Path) -> list[str]:
    """file:line of every read of os.environ / os.getenv in `path` (writes are allowed)."""
    tree = parsed(path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            if node.attr == "getenv":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif node.attr == "environ":
                parent = parents.get(node)
                writes = (
                    isinstance(parent, ast.Subscript)
                    and isinstance(parent.ctx, (ast.Store, ast.Del))
                ) or (isinstance(parent, ast.Attribute) and parent.attr in WRITES)
                if not writes:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_settings_module_reads_the_environment():
    reads = [site for path in _modules() if path != SETTINGS for site in environment_reads(path)]
    assert reads == [], "read the environment through artifacts/core/settings.py: " + ", ".join(
        reads
    )


def test_the_rule_sees_reads_and_lets_writes_through():
    probe = ROOT / "tests" / "data" / "environment_probe.py"
    lines = {i + 1: line for i, line in enumerate(probe.read_text().splitlines())}
    flagged = sorted(int(site.rsplit(":", 1)[1]) for site in environment_reads(probe))
    assert flagged == [n for n, line in lines.items() if line.endswith("# read")]
    assert len(flagged) == 4


def test_the_cache_folder_has_one_name():
    for path in _modules():
        text = path.read_text()
        assert "def cache_dir" not in text or path == SETTINGS, path
        assert "cache_dirs" not in text, path


def test_the_cache_layout_is_declared_once():
    """Each area below the cache dir is named in artifacts/core/cache_layout.py, which `aot-cache
    gc` walks: an area named elsewhere would be one gc never collects."""
    spelled = re.compile(r"cache_dir\(\)\s*/\s*[\"']")
    for path in _modules():
        assert not spelled.search(path.read_text()), f"{path}: name it in cache_layout.py"


# -- JSON-lines files ------------------------------------------------------------------------------
LINE_READS = {"readline", "readlines", "splitlines"}
OPENERS = {"open", "fdopen"}
MODE_LETTERS = set("rwxabt+")
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _appends(node: ast.Call) -> bool:
    """open(..., "a"), Path.open("ab"), os.fdopen(fd, mode="a+")..."""
    if _called(node) not in OPENERS:
        return False
    modes = [*node.args, *(k.value for k in node.keywords if k.arg == "mode")]
    return any(
        isinstance(m, ast.Constant)
        and isinstance(m.value, str)
        and "a" in m.value
        and set(m.value) <= MODE_LETTERS
        for m in modes
    )


def json_lines_io(path: Path) -> list[str]:
    """file:line of every JSON-lines read or append in `path`: json.loads/json.load inside a
    loop over a file's lines (a handle of `with open(...)`, readline/readlines/splitlines, or a
    loop variable named for a line), an open() in append mode, and O_APPEND."""
    tree = parsed(path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    handles = {
        item.optional_vars.id
        for node in ast.walk(tree)
        if isinstance(node, (ast.With, ast.AsyncWith))
        for item in node.items
        if isinstance(item.optional_vars, ast.Name)
        and isinstance(item.context_expr, ast.Call)
        and _called(item.context_expr) in OPENERS
    }

    def reads_lines(expr: ast.AST) -> bool:
        if isinstance(expr, ast.Name) and expr.id in handles:
            return True
        return any(isinstance(n, ast.Call) and _called(n) in LINE_READS for n in ast.walk(expr))

    def over_lines(target: ast.AST, source: ast.AST) -> bool:
        named = any(isinstance(n, ast.Name) and "line" in n.id for n in ast.walk(target))
        return named or reads_lines(source)

    def in_loop_over_lines(node: ast.AST) -> bool:
        while (node := parents.get(node)) is not None:
            if isinstance(node, (ast.For, ast.AsyncFor)) and over_lines(node.target, node.iter):
                return True
            if isinstance(node, ast.While) and reads_lines(node.test):
                return True
            if isinstance(node, COMPREHENSIONS) and any(
                over_lines(g.target, g.iter) for g in node.generators
            ):
                return True
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "O_APPEND":
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and _appends(node):
            found.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "json"
            and node.func.attr in ("load", "loads")
            and in_loop_over_lines(node)
        ):
            found.append(node.lineno)
    return [f"{path.relative_to(ROOT)}:{line}" for line in sorted(set(found))]


def test_only_the_json_lines_module_reads_and_appends_json_lines():
    sites = [site for path in _modules() if path != JSON_LINES for site in json_lines_io(path)]
    assert sites == [], (
        "read and append JSON lines with artifacts/core/json_lines.py: " + ", ".join(sites)
    )
    assert json_lines_io(JSON_LINES)  # the rule sees the home's own reader and appender


def test_the_json_lines_rule_sees_io_and_lets_documents_through():
    probe = ROOT / "tests" / "data" / "json_lines_probe.py"
    lines = {i + 1: line for i, line in enumerate(probe.read_text().splitlines())}
    flagged = [int(site.rsplit(":", 1)[1]) for site in json_lines_io(probe)]
    assert flagged == [n for n, line in lines.items() if line.endswith("# io")]
    assert len(flagged) == 7


def test_a_torn_last_line_is_skipped_with_its_file_named(tmp_path):
    from cute_aot.artifacts.core.json_lines import read_objects
    from cute_aot.artifacts.miss_log import read_misses

    miss = {"family": "router_gemm", "key": {"m": 1}, "arch": "sm_90a"}
    log = tmp_path / "misses" / "misses.jsonl"
    log.parent.mkdir()
    # As a writer killed in the middle of its line leaves it, after whole lines and a foreign
    # one that is JSON but no object.
    log.write_text(json.dumps(miss) + "\n[1, 2]\n\n" + json.dumps(miss) + '\n{"family": "rou')
    with pytest.warns(RuntimeWarning, match=rf"{log}: skipped 2 line\(s\)"):
        assert read_objects(log) == [(str(log), miss), (str(log), miss)]
    for source in (log, log.parent, f"file://{log.parent}/"):
        with pytest.warns(RuntimeWarning, match="misses.jsonl: skipped 2"):
            assert read_misses(source) == [miss, miss]


def test_an_append_after_a_torn_line_starts_a_fresh_line(tmp_path):
    from cute_aot.artifacts.core.json_lines import append_line, read_objects

    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"whole": 1}\n{"cut": ')
    line = (json.dumps({"next": 2}, sort_keys=True) + "\n").encode()
    append_line(path, line)
    assert path.read_bytes() == b'{"whole": 1}\n{"cut": \n' + line  # the caller's bytes, whole
    with pytest.warns(RuntimeWarning, match="results.jsonl: skipped 1"):
        assert [found for _, found in read_objects(path)] == [{"whole": 1}, {"next": 2}]
    with pytest.raises(ValueError, match="one line"):
        append_line(path, b'{"a": 1}\n{"b": 2}\n')  # two lines in one write would be two
    assert path.read_bytes().endswith(line)


def test_a_shared_record_file_takes_no_torn_line_and_each_call_once(tmp_path):
    """CUTE_AOT_RECORD=<file>: processes append to one file under a lock; a record a killed
    process cut short is closed before the next one, and a record another process wrote is not
    written again (read back incrementally, past the torn line)."""
    from cute_aot.artifacts.core.json_lines import read_objects
    from cute_aot.runtime.capture.record import Recorder, _subject

    path = tmp_path / "calls.jsonl"
    path.write_bytes(b'{"format": 1, "key_id": "torn')
    first, second = Recorder(path), Recorder(path)  # two processes' recorders
    record = {"key_id": "", "site": "a.py:1", "reason": "not replayable"}
    other = {**record, "site": "b.py:2"}
    first._append(record, _subject(record))
    with pytest.warns(RuntimeWarning, match="calls.jsonl: skipped 1"):
        second._append(record, _subject(record))  # already in the file: not again
    second._append(other, _subject(other))
    written = path.read_bytes().split(b"\n")
    assert written[0] == b'{"format": 1, "key_id": "torn'
    assert written[1] == json.dumps(record, sort_keys=True).encode()
    with pytest.warns(RuntimeWarning, match="calls.jsonl: skipped 1"):
        assert [r["site"] for _, r in read_objects(path)] == ["a.py:1", "b.py:2"]


def test_lines_written_before_read_back_unchanged(tmp_path):
    """The previous commit's lines (json.dumps, sorted keys or not, one newline each) read back
    as exactly what was written; a file that may not lose a line is never rotated."""
    from cute_aot.artifacts.core.json_lines import MAX_LOG_BYTES, append_line, read_objects

    rows = [{"b": 1, "a": [1.5, None]}, {"time": "2026-01-01T00:00:00Z", "key": {"m": 3}}]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(rows[0], sort_keys=True) + "\n" + json.dumps(rows[1]) + "\n")
    assert [found for _, found in read_objects(path)] == rows
    with open(path, "r+b") as handle:
        handle.truncate(MAX_LOG_BYTES + 1)  # past the size, sparse: zeros are no line
    append_line(path, b'{"kept": true}\n', rotate=False)
    assert not (tmp_path / "old.jsonl.1").exists()
    assert path.read_bytes().endswith(b'\x00\n{"kept": true}\n')


def test_tuning_results_use_the_one_json_lines_reader_and_appender(tmp_path):
    """aot-tune's results file: a line that is no object is skipped (the reader crashed on it),
    and a row cut short by an interruption is closed before the next one (the next row was
    glued onto it, and both were lost)."""
    from rich.console import Console

    from cute_aot.aot.tools.aot_tune.cli import Tuner
    from cute_aot.kernels import family

    found = family("router_gemm")
    row = {"family": found.name, "arch": "sm_90a", "problem": [1, 2, 3], "key_id": "k1", "us": 1.0}
    results = tmp_path / "results.jsonl"
    results.write_text('[1, 2]\n"text"\n' + json.dumps(row) + '\n{"family": "router_gemm", "ar')
    tuner = Tuner(found, "sm_90a", results, Console(file=open(os.devnull, "w")))
    assert list(tuner.done.values()) == [row]
    tuner._record({**row, "key_id": "k2"})
    again = Tuner(found, "sm_90a", results, Console(file=open(os.devnull, "w")))
    assert sorted(key_id for _, key_id in again.done) == ["k1", "k2"]


def test_each_setting_s_default_is_a_value_its_reader_takes(settings_scope):
    from cute_aot.artifacts.core import settings
    from cute_aot.runtime.mode import Mode, current_mode

    settings_scope(**{setting.name: None for setting in settings.SETTINGS})
    for setting in settings.SETTINGS:
        # a value, or none and what applies then said in words (never both)
        assert setting.default is None or setting.when_unset is None, setting
    assert settings.mode_name() == settings.MODE.default == "auto"
    assert current_mode() is Mode.AUTO
    flags = (
        settings.REQUIRE_SIGNATURE,
        settings.REVERIFY,
        settings.REMOTE_UNSIGNED,
        settings.DISABLE,
    )
    for flag in flags:
        assert flag.default == "0" and flag.value() is False
    assert settings.CACHE_DIR.default is None and settings.CACHE_DIR.unset_text.startswith("$XDG")


def test_a_value_a_setting_s_kind_does_not_take_is_an_error_naming_it(settings_scope):
    from cute_aot.artifacts.core import settings

    settings_scope(CUTE_AOT_REVERIFY="ture")
    with pytest.raises(settings.SettingError, match="CUTE_AOT_REVERIFY='ture' is not a flag"):
        settings.reverify()
    settings_scope(CUTE_AOT_REVERIFY=" Yes ")
    assert settings.reverify() is True
    # fails closed: a typo must not turn signature checks off, and it is said
    settings_scope(CUTE_AOT_REQUIRE_SIGNATURE="ture")
    with pytest.warns(RuntimeWarning, match="CUTE_AOT_REQUIRE_SIGNATURE='ture'"):
        assert settings.signature_required() is True
    with settings.scope(CUTE_AOT_MODE="sometimes"):
        with pytest.raises(settings.SettingError, match="choose one of auto, aot, jit"):
            settings.MODE.value()


def test_scope_sets_settings_for_this_process_only(monkeypatch, tmp_path):
    import subprocess
    import sys

    from cute_aot.artifacts.core import settings

    monkeypatch.setenv("CUTE_AOT_MODE", "jit")
    with settings.scope(CUTE_AOT_MODE="aot", CUTE_AOT_REPORT=str(tmp_path / "r.json")):
        assert settings.mode_name() == "aot"
        assert settings.report_file() == tmp_path / "r.json"
        with settings.scope(CUTE_AOT_MODE=None):  # unset, whatever the environment says
            assert settings.mode_name() == "auto"
        assert settings.mode_name() == "aot"
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "from cute_aot.artifacts.core import settings as s; print(s.mode_name())",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert child.stdout.strip() == "jit"  # a child process sees the environment alone
    assert settings.mode_name() == "jit" and settings.report_file() is None
    with pytest.raises(settings.SettingError, match="no such setting: CUTE_AOT_MODES"):
        with settings.scope(CUTE_AOT_MODES="aot"):
            pass


def test_the_settings_page_is_generated_from_the_settings_module():
    """docs/settings.md is what docs/gen_settings.py writes from SETTINGS: a setting added,
    removed or reworded without running the script fails here. The README links to the page."""
    import importlib.util

    from cute_aot.artifacts.core import settings

    spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "docs" / "gen_settings.py")
    gen_settings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_settings)
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == gen_settings.render(), "docs/settings.md is stale: python docs/gen_settings.py"
    assert settings.markdown_table() in page
    for setting in settings.SETTINGS:
        assert f"| `{setting.name}` |" in page
    assert "docs/settings.md" in (ROOT / "README.md").read_text()
