"""One place for each decision: a test per decision that fails when a second copy appears.

- The environment is read in artifacts/settings.py only (CUTE_AOT_* variables and the few of
  other programs cute-aot reads: CC, CUDA_HOME, LD_LIBRARY_PATH, COLUMNS, the DSL's own). Other
  modules may set variables for the processes they start (aot-build's workers, a virtual GPU's
  caches), never read them.
- The cache folder has one name: settings.cache_dir.
- JSON-lines files are read by artifacts/miss_log.read_objects and appended to by
  runtime/process_files.append_line (aot-tune's results too).
"""

import ast
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aot", "artifacts", "kernels", "runtime")
SETTINGS = ROOT / "artifacts" / "settings.py"
WRITES = ("update", "pop", "setdefault")


def _modules():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def environment_reads(path: Path) -> list[str]:
    """file:line of every read of os.environ / os.getenv in `path` (writes are allowed)."""
    tree = ast.parse(path.read_text(), str(path))
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
    assert reads == [], "read the environment through artifacts/settings.py: " + ", ".join(reads)


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


def test_tuning_results_use_the_one_json_lines_reader_and_appender(tmp_path):
    """aot-tune's results file: a line that is no object is skipped (the reader crashed on it),
    and a row cut short by an interruption is closed before the next one (the next row was
    glued onto it, and both were lost)."""
    from rich.console import Console

    from cute_aot.kernels import family
    from cute_aot.runtime.tuning.cli import Tuner

    found = family("router_gemm")
    row = {"family": found.name, "arch": "sm_90a", "problem": [1, 2, 3], "key_id": "k1", "us": 1.0}
    results = tmp_path / "results.jsonl"
    results.write_text('[1, 2]\n"text"\n' + json.dumps(row) + '\n{"family": "router_gemm", "ar')
    tuner = Tuner(found, "sm_90a", results, Console(file=open(os.devnull, "w")))
    assert list(tuner.done.values()) == [row]
    tuner._record({**row, "key_id": "k2"})
    again = Tuner(found, "sm_90a", results, Console(file=open(os.devnull, "w")))
    assert sorted(key_id for _, key_id in again.done) == ["k1", "k2"]


def test_each_setting_s_default_is_a_value_its_reader_takes(monkeypatch):
    from cute_aot.artifacts import settings
    from cute_aot.runtime.mode import Mode, current_mode

    for setting in settings.SETTINGS:
        monkeypatch.delenv(setting.name, raising=False)
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
        assert flag.default == "0" and settings._flag(flag) is False
    assert settings.CACHE_DIR.default is None and settings.CACHE_DIR.unset_text.startswith("$XDG")
