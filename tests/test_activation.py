"""Activation by the environment alone: an unmodified program (tests/user_kernels/plain_program.py,
which imports nothing of cute-aot) is recorded, built and served through the installed startup
hook, in every process it starts: as a subprocess, in a spawn pool started by a parent that
imports nothing of cute-aot either, and under pytest-xdist. Real processes throughout; compiles
are counted by the program's own CUTE_AOT_REPORT, not by anything the program imports.
"""

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from cute_aot.artifacts.core import settings

REPO = Path(__file__).resolve().parents[1]
STARTUP = REPO / "runtime" / "capture" / "cute-aot-startup.pth"


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    env.update(PYTHONPATH=str(REPO), CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def _run(args, env, cwd, timeout=900) -> subprocess.CompletedProcess:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _program(tmp_path, *args, **env) -> list[dict]:
    done = _run(
        [sys.executable, "-m", "tests.user_kernels.plain_program", *args],
        _env(tmp_path, **env),
        tmp_path,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _build(tmp_path, record, out, **env) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "cute_aot.aot.cli",
        "--from-record",
        str(record),
        "--arch",
        "sm90a",
        "--out",
        str(out),
        "--name",
        "recorded",
        "--quiet",
        "--no-cache",
    ]
    return subprocess.run(
        command,
        env=_env(tmp_path, **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _serving(bundles: Path, report: Path) -> dict:
    return {
        "CUTE_AOT_BUNDLES": str(bundles),
        "CUTE_AOT_INTERCEPT": "1",
        "CUTE_AOT_MODE": "aot",
        "CUTE_AOT_REPORT": str(report),
    }


def _records(folder: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


# -- the startup file ------------------------------------------------------------------------------
def test_the_startup_file_asks_for_exactly_the_activating_variables():
    """The .pth names the variables itself (it must not import anything to find them): they are
    the settings' own list, and the line imports cute-aot only behind that test."""
    (line,) = STARTUP.read_text().splitlines()
    named = re.search(r"for name in \(([^)]*)\)", line).group(1)
    assert [n.strip(' "') for n in named.split(",") if n.strip()] == [
        s.name for s in settings.ACTIVATING
    ]
    assert line.startswith("import os; any(") and ") and __import__(" in line


def test_the_wheel_carries_the_startup_file_at_the_top_of_site_packages():
    import zipfile

    wheel = _wheel()
    names = zipfile.ZipFile(wheel).namelist()
    assert "cute-aot-startup.pth" in names
    record = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("RECORD"))).decode()
    assert "\ncute-aot-startup.pth," in "\n" + record  # so that uninstalling removes it


_WHEELS: dict = {}


def _wheel() -> Path:
    if "cute_aot" not in _WHEELS:
        import tempfile

        out = Path(tempfile.mkdtemp(prefix="cute-aot-wheel-"))
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(out),
                str(REPO),
            ],
            dict(os.environ),
            out,
            timeout=600,
        )
        (_WHEELS["cute_aot"],) = out.glob("cute_aot-*.whl")
    return _WHEELS["cute_aot"]


# -- nothing happens unless asked ------------------------------------------------------------------
_PROBE = """
import json, sys
import cutlass
from cutlass.base_dsl.compiler import CompileCallable
print(json.dumps({"cute_aot": sorted(m for m in sys.modules if m.startswith("cute_aot")),
                  "compile": CompileCallable._compile.__module__,
                  "finders": [type(f).__name__ for f in sys.meta_path]}))
"""


@pytest.mark.parametrize(
    "variables",
    [
        {},
        {"CUTE_AOT_HOST": "x", "CUTE_AOT_MODE": "aot"},
        {"CUTE_AOT_RECORD": "r.jsonl", "CUTE_AOT_DISABLE": "1"},
    ],
    ids=["nothing set", "no activating variable", "disabled"],
)
def test_no_hook_unless_the_environment_asks(tmp_path, variables):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    env = _env(tmp_path, **variables)
    done = _run([sys.executable, "-c", _PROBE], env, tmp_path)
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["compile"].startswith("cutlass."), seen  # cutlass-dsl's own, unpatched
    assert "_AfterImport" not in seen["finders"]
    if "CUTE_AOT_DISABLE" not in variables:
        assert seen["cute_aot"] == [], seen  # not even imported: one lookup per variable
    assert not (tmp_path / "r.jsonl").exists()


def test_the_hook_is_installed_when_cutlass_is_imported(tmp_path):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    probe = "import sys; print(sorted({'cutlass', 'torch'} & set(sys.modules))); " + _PROBE
    done = _run([sys.executable, "-c", probe], _env(tmp_path, CUTE_AOT_REPORT="r.json"), tmp_path)
    before, after = done.stdout.splitlines()[-2:]
    assert before == "[]"  # the startup hook imports neither cutlass nor torch
    seen = json.loads(after)
    assert seen["compile"] == "cute_aot.runtime.compile_hook"
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["compiles"], report["hits"], report["misses"]) == (0, 0, 0)
    assert "cute-aot" not in done.stderr  # all is well: nothing said


def test_serving_with_no_bundle_is_said_once(tmp_path):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    done = _run(
        [sys.executable, "-c", "import cutlass; import cutlass.cute"],
        _env(tmp_path, CUTE_AOT_INTERCEPT="1"),
        tmp_path,
    )
    said = [line for line in done.stderr.splitlines() if "cute-aot:" in line]
    assert len(said) == 1 and "CUTE_AOT_BUNDLES is unset" in said[0], done.stderr


# -- record, build, serve: an unmodified program ---------------------------------------------------
@pytest.mark.slow
def test_a_subprocess_is_recorded_built_and_served(tmp_path):
    records = tmp_path / "records"
    recorded = _program(tmp_path, "64", "128", CUTE_AOT_RECORD=f"{records}/")
    assert [r["type"] for r in recorded] == ["TVMFFIJitCompiledFunctionWithKwargs"] * 2
    lines = _records(records)
    assert len(lines) == 2 and all(line["recreatable"] for line in lines)
    assert {line["target"] for line in lines} == {"tests.user_kernels.scale:scale"}

    # cute-aot's own build runs under the same variables, inherited: it neither records nor is
    # served (mode aot would refuse the very keys it builds), workers included
    inherited = {
        **_serving(tmp_path / "none", tmp_path / "build-report.json"),
        "CUTE_AOT_RECORD": f"{records}/",
    }
    built = _build(tmp_path, records, tmp_path / "bundles", **inherited)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert _records(records) == lines
    assert not (tmp_path / "build-report.json").exists()

    report = tmp_path / "report.json"
    served = _program(tmp_path, "64", "128", **_serving(tmp_path / "bundles", report))
    assert [r["type"] for r in served] == ["function"] * 2  # the bundle's TVM-FFI functions
    summary = json.loads(report.read_text())
    assert (summary["compiles"], summary["hits"], summary["misses"]) == (0, 2, 0)
    assert summary["targets"] == {
        "tests.user_kernels.scale:scale": {"compiles": 0, "hits": 2, "misses": 0}
    }

    # a kernel defined in __main__ cannot be imported by a replay: named, not silently skipped
    _program(tmp_path, "--in-main", "64", CUTE_AOT_RECORD=str(tmp_path / "main.jsonl"))
    (line,) = [json.loads(x) for x in (tmp_path / "main.jsonl").read_text().splitlines()]
    assert line["recreatable"] is False and "__main__" in line["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("start", ["spawn", "forkserver", "fork"])
def test_a_pool_of_a_parent_that_imports_nothing_is_recorded_and_served(tmp_path, start):
    """The parent imports cutlass, never cute-aot. spawn and forkserver workers run the startup
    hook themselves; fork workers inherit the parent's hook, and report their own work."""
    records, blocks = tmp_path / "records", ["32", "64", "128", "256"]
    pool = ["--pool", "4", "--start", start]
    recorded = _program(tmp_path, *pool, *blocks, CUTE_AOT_RECORD=f"{records}/")
    workers = {r["pid"] for r in recorded}
    assert len(workers) >= 2, recorded  # compiled in the pool's processes, not the parent
    lines = _records(records)
    assert sorted(json.loads(line["key"]["call"])["args"][-1][1]["value"] for line in lines) == [
        32,
        64,
        128,
        256,
    ]  # every worker's record is on disk, though the pool ends its workers with SIGTERM
    assert {p.name.split("-")[-1].split(".")[0] for p in records.glob("*.jsonl")} <= {
        str(pid) for pid in workers
    }
    assert _build(tmp_path, records, tmp_path / "bundles").returncode == 0

    report = tmp_path / "report.json"
    served = _program(tmp_path, *pool, *blocks, **_serving(tmp_path / "bundles", report))
    assert [r["type"] for r in served] == ["function"] * 4
    summary = json.loads(report.read_text())
    assert (summary["compiles"], summary["hits"], summary["misses"]) == (0, 4, 0)
    serving = {f"{p['host']}-{p['pid']}" for p in summary["processes"].values() if p["hits"]}
    assert {key.rsplit("-", 1)[1] for key in serving} == {str(r["pid"]) for r in served}
    if start != "forkserver":  # whose server process may end (and report) after the parent
        assert len(summary["processes"]) == 5  # the parent and four workers, each at its end


@pytest.mark.slow
def test_pytest_xdist_workers_are_recorded_and_served(tmp_path):
    pytest.importorskip("xdist", reason="needs pytest-xdist")
    records, out = tmp_path / "records", tmp_path / "results.jsonl"

    def suite(**env):
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            "--noconftest",
            str(REPO / "tests" / "user_kernels" / "xdist_workload.py"),
        ]
        _run(command, _env(tmp_path, WORKLOAD_OUT=str(out), **env), tmp_path)
        results = [json.loads(line) for line in out.read_text().splitlines()]
        out.unlink()
        return results

    recorded = suite(CUTE_AOT_RECORD=f"{records}/")
    assert len({r["pid"] for r in recorded}) == 2 and len(_records(records)) == 4
    assert _build(tmp_path, records, tmp_path / "bundles").returncode == 0
    report = tmp_path / "report.json"
    served = suite(**_serving(tmp_path / "bundles", report))
    assert sorted(r["type"] for r in served) == ["function"] * 4
    summary = json.loads(report.read_text())
    assert (summary["compiles"], summary["hits"], summary["misses"]) == (0, 4, 0)


# -- a wheel in a fresh venv -----------------------------------------------------------------------
@pytest.mark.slow
def test_a_wheel_installed_into_a_fresh_venv_activates_and_uninstalls_without_a_trace(tmp_path):
    """The regular install: the built wheel, pip-installed into a new venv (its dependencies
    reached through a path file naming this interpreter's site-packages, so nothing is
    downloaded), records an unmodified program; uninstalled, nothing of it runs any more."""
    cutlass = pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    import site

    home = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    purelib = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            {},
            tmp_path,
        ).stdout.strip()
    )
    before = sorted(p.name for p in purelib.iterdir())
    dependencies = [*site.getsitepackages(), str(Path(cutlass.__path__[0]).parent)]
    (purelib / "dependencies.pth").write_text("\n".join(dependencies) + "\n")
    before.append("dependencies.pth")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run(
        [*pip, "install", "-q", "--no-deps", "--no-index", str(_wheel())],
        dict(os.environ),
        tmp_path,
    )
    assert (purelib / "cute-aot-startup.pth").is_file()

    env = {k: v for k, v in _env(tmp_path).items() if k != "PYTHONPATH"}
    program = [
        str(python),
        "-c",
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from tests.user_kernels.plain_program import main; main(['64'])",
        str(REPO),
    ]
    _run(program, {**env, "CUTE_AOT_RECORD": str(tmp_path / "calls.jsonl")}, tmp_path)
    assert len((tmp_path / "calls.jsonl").read_text().splitlines()) == 1

    _run([*pip, "uninstall", "-q", "-y", "cute-aot"], dict(os.environ), tmp_path)
    left = sorted(p.name for p in purelib.iterdir() if p.name != "__pycache__")
    assert [name for name in left if name not in before and name != "cute_aot"] == []
    assert not any((purelib / "cute_aot").rglob("*.py"))  # pip may leave empty folders only
    done = _run(program, {**env, "CUTE_AOT_RECORD": str(tmp_path / "after.jsonl")}, tmp_path)
    assert not (tmp_path / "after.jsonl").exists() and "cute-aot" not in done.stderr


@pytest.mark.parametrize(
    "bad",
    [
        {"CUTE_AOT_VIRTUAL": "h100"},
        {"CUTE_AOT_INTERCEPT": "maybe"},
        {"CUTE_AOT_RECORD": "records/", "CUTE_AOT_DISABLE": "perhaps"},
        {"CUTE_AOT_REPORT": "report.json", "CUTE_AOT_VIRTUAL": "sm_75"},
    ],
    ids=lambda bad: ",".join(f"{k}={v}" for k, v in bad.items()),
)
def test_a_bad_startup_value_is_one_line_and_never_stops_python(tmp_path, bad):
    """The startup hook runs in every Python process of the environment, pip's included: a value
    it cannot take is one line that names the variable and says what was done, and pip runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--version"],
        env={**env, **bad},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pip ")
    (line,) = done.stderr.splitlines()
    variable = next(name for name in bad if name in line)
    assert line.startswith(f"cute-aot: {variable}") and line.endswith(
        "cute-aot is off in this process"
    )
