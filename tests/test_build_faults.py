"""`aot-build` under faults caused for real: two builds into one folder, a full disk, kill -9,
SIGTERM and SIGINT, a build of other families into a folder of bundles.

Every build here is a real `aot-build` process (this module run with `python -m`, see the end)
whose compile worker is the stub of tests/stubs.py, optionally slowed down. A build is held in
the middle of linking by a C compiler wrapper that waits for a file, or in the middle of writing
its bundle by strace delaying fsync.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.stubs import stub_compile

REPO = Path(__file__).resolve().parents[1]
COMPILE_SECONDS_ENV = "CUTE_AOT_TEST_COMPILE_SECONDS"
STARTED_ENV = "CUTE_AOT_TEST_STARTED_DIR"
ROUTER_SM90 = ("--families", "router_gemm", "--arch", "sm_90a", "-j", "1")
BUNDLE = "default-sm_90a.cuteaot"

# Links like gcc, except that link number $GATE_AT (0-based) first waits for the file $GATE/go.
GATED_CC = """#!/bin/sh
case " $* " in *" -shared "*) ;; *) exec gcc "$@" ;; esac
n=$(ls "$GATE" | grep -c '^link')
touch "$GATE/link$n"
if [ "$n" -eq "$GATE_AT" ]; then
  while [ ! -e "$GATE/go" ]; do sleep 0.05; done
fi
exec gcc "$@"
"""


def slow_stub_compile(family_name: str, key_fields: dict, arch: str, out_dir: str) -> dict:
    """stub_compile after a pause, long enough to signal a build in the middle of compiling."""
    if os.environ.get(STARTED_ENV):
        Path(os.environ[STARTED_ENV], str(os.getpid())).touch()
    time.sleep(float(os.environ.get(COMPILE_SECONDS_ENV) or 0))
    return stub_compile(family_name, key_fields, arch, out_dir)


@pytest.fixture
def env(tmp_path) -> dict:
    """The builds' environment: a TMPDIR of this test's own, so leftovers are ours to count."""
    (tmp_path / "tmp").mkdir()
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp")}


def gated(env: dict, gate: Path, at: int) -> dict:
    gate.mkdir(exist_ok=True)
    cc = gate.parent / "gated-cc"
    cc.write_text(GATED_CC)
    cc.chmod(0o755)
    return {**env, "CC": str(cc), "GATE": str(gate), "GATE_AT": str(at)}


def hold_fsync(seconds: float) -> tuple[str, ...]:
    """A command prefix under which every fsync first waits `seconds` (strace fault injection)."""
    if not shutil.which("strace"):
        pytest.skip("needs strace, to hold a build inside fsync")
    return strace_fsync(f"delay_enter={int(seconds * 1e6)}")


def strace_fsync(injection: str) -> tuple[str, ...]:
    """A command prefix under which every fsync gets strace's `inject=fsync:<injection>`."""
    return (
        "strace",
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-e",
        "trace=fsync",
        "-e",
        f"inject=fsync:{injection}",
    )


def start(env: dict, out: Path, *args: str, wrap: tuple[str, ...] = ()) -> subprocess.Popen:
    """`aot-build --out OUT ARGS` with stub kernels, in a session of its own (one group to kill)."""
    log = out.parent / f"{out.name}.{time.monotonic_ns()}.log"
    command = [*wrap, sys.executable, "-m", "tests.test_build_faults", "--out", str(out)]
    with open(log, "w") as output:
        process = subprocess.Popen(
            [*command, "--no-cache", "--quiet", *args],
            cwd=REPO,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.log = log
    return process


def finish(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    """(exit status, output) of a started build."""
    try:
        status = process.wait(timeout)
    finally:
        kill_session(process)
    return status, process.log.read_text()


def run(env: dict, out: Path, *args: str) -> tuple[int, str]:
    return finish(start(env, out, *args))


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the session this test started for `process`."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(env: dict, out: Path) -> list[str]:
    """Scratch of builds in TMPDIR and temporary (hidden) names in --out."""
    scratch = [p.name for p in Path(env["TMPDIR"]).iterdir() if "cute-aot" in p.name]
    hidden = [p.name for p in out.iterdir() if p.name.startswith(".")] if out.exists() else []
    return sorted(scratch + hidden)


# -- processes, read from /proc ------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name, or None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def descendants(pid: int) -> dict[int, str]:
    """{pid: start time} of every process below `pid`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        fields = _stat(child)
        if fields:
            found[child] = fields[19]
            todo += children.get(child, [])
    return found


def running(processes: dict[int, str]) -> list[int]:
    """Those of `processes` still running (not gone, not a zombie, not a reused pid)."""
    alive = []
    for pid, started in processes.items():
        fields = _stat(pid)
        if fields and fields[0] != "Z" and fields[19] == started:
            alive.append(pid)
    return alive


# -- 1. two builds into one --out ----------------------------------------------------------------


def test_a_second_build_of_one_name_into_one_out_refuses_naming_the_first(tmp_path, env):
    """Bundles and report are one unit: a second build of the same name into the same --out
    refuses in one line naming the build that holds it (before, it replaced the bundle while the
    first build's report went on describing its own); the first finishes, its report true."""
    out, gate = tmp_path / "bundles", tmp_path / "gate"
    both = ("--families", "router_gemm", "--arch", "sm_90a", "--arch", "sm_100a", "-j", "1")
    first = start(gated(env, gate, at=1), out, *both)  # held before linking sm_100a
    try:
        wait_for(lambda: (gate / "link1").exists(), 60, "the first build to link sm_100a")
        status, output = run(env, out, *ROUTER_SM90, "--model", "deepseek-v4-flash")
        assert status == 1, output
        (line,) = [line for line in output.splitlines() if "another aot-build" in line]
        assert f"pid {first.pid} " in line and str(out) in line and "'default'" in line
        (gate / "go").touch()
        status, output = finish(first)
    finally:
        kill_session(first)
    assert status == 0, output
    report = json.loads((out / "default.build-report.json").read_text())
    assert {record["arch"] for record in report["bundles"]} == {"sm_90a", "sm_100a"}
    for record in report["bundles"]:
        path = out / f"default-{record['arch']}.cuteaot"
        assert (record["sha256"], record["size"]) == (sha256(path), path.stat().st_size)
    assert leftovers(env, out) == []  # the claim went with the build


# -- 2. a full disk ------------------------------------------------------------------------------


def test_a_full_disk_fails_in_one_line_and_leaves_nothing_half_written(tmp_path, env):
    out = tmp_path / "full"
    out.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(out)], capture_output=True
    )
    wrap: tuple[str, ...] = ()
    if mounted.returncode != 0:  # no tmpfs: the first fsync (the bundle's) says the disk is full
        if not shutil.which("strace"):
            pytest.skip(f"cannot mount a tmpfs ({mounted.stderr.decode().strip()}) nor run strace")
        wrap = strace_fsync("error=ENOSPC")
    try:
        status, output = finish(start(env, out, *ROUTER_SM90, wrap=wrap))
        left = sorted(p.name for p in out.iterdir())
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(out)], check=True)
    assert status != 0
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if "No space left on device" in line]
    assert str(out / BUNDLE) in line
    assert left == []


def test_a_rebuild_on_a_full_disk_keeps_the_old_bundle_and_its_report(tmp_path, env):
    """A rebuild whose new bundle cannot be written (the disk filled up after the first build)
    fails in one line; the old bundle stays, and so does the report that describes it."""
    from tests.faults import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", "1m") as out:
        status, output = run(env, out, *ROUTER_SM90)
        assert status == 0, output
        report = out / "default.build-report.json"
        before = {path.name: path.read_bytes() for path in (out / BUNDLE, report)}
        fill(out)
        # Room for the build's claim (a page), none for a bundle: the write itself fails.
        os.truncate(out / "filler", (out / "filler").stat().st_size - 8192)
        status, output = run(env, out, *ROUTER_SM90, "--bundle-version", "2")
        after = {name: (out / name).read_bytes() for name in before if (out / name).exists()}
        (out / "filler").unlink()
    assert status != 0
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if "No space left on device" in line]
    assert str(out / BUNDLE) in line
    assert after == before
    recorded = json.loads(before[report.name])["bundles"][0]["sha256"]
    assert recorded == hashlib.sha256(before[BUNDLE]).hexdigest()


# -- 3. kill -9 ----------------------------------------------------------------------------------


def test_kill_9_while_linking_leaves_nothing_that_the_next_build_keeps(tmp_path, env):
    out, gate = tmp_path / "bundles", tmp_path / "gate"
    build = start(gated(env, gate, at=0), out, *ROUTER_SM90)
    try:
        wait_for(lambda: (gate / "link0").exists(), 60, "the build to link")
        os.killpg(build.pid, signal.SIGKILL)  # the build and the linker it waits on
        build.wait(10)
    finally:
        kill_session(build)
    assert leftovers(env, out)  # the fault: the killed build's scratch is still there
    status, output = run(env, out, *ROUTER_SM90)
    assert status == 0, output
    assert leftovers(env, out) == []


def writing_bundle(out: Path, bundle: str) -> bool:
    """Whether a build is writing `bundle`: its temporary is there (a build claim's temporary,
    written and then linked, ends in .tmp too, and comes first)."""
    return out.exists() and any(
        p.name.startswith(f".{bundle}.") and p.suffix == ".tmp" for p in out.iterdir()
    )


@pytest.mark.slow
def test_kill_9_while_writing_the_bundle_leaves_nothing_that_the_next_build_keeps(tmp_path, env):
    out = tmp_path / "bundles"
    build = start(env, out, *ROUTER_SM90, wrap=hold_fsync(60))
    try:
        wait_for(lambda: writing_bundle(out, BUNDLE), 60, "the build to write its bundle")
        os.killpg(build.pid, signal.SIGKILL)
        build.wait(10)
    finally:
        kill_session(build)
    assert [p for p in leftovers(env, out) if p.startswith(f".{BUNDLE}.")]  # the fault
    status, output = run(env, out, *ROUTER_SM90)
    assert status == 0, output
    assert leftovers(env, out) == []
    assert sorted(p.name for p in out.iterdir()) == [BUNDLE, "default.build-report.json"]


@pytest.mark.slow
def test_a_build_never_removes_a_live_concurrent_builds_files(tmp_path, env):
    out, gate = tmp_path / "bundles", tmp_path / "gate"
    linking = start(gated(env, gate, at=0), out, *ROUTER_SM90)  # its objects in TMPDIR
    writing = start(env, out, *ROUTER_SM90, "--name", "slow", wrap=hold_fsync(5))  # a .tmp in out
    try:
        wait_for(lambda: (gate / "link0").exists(), 60, "a build to link")
        wait_for(
            lambda: writing_bundle(out, "slow-sm_90a.cuteaot"), 60, "a build to write its bundle"
        )
        scratch = [p for p in Path(env["TMPDIR"]).iterdir() if f".pid{linking.pid}@" in p.name]
        assert scratch
        status, output = run(env, out, *ROUTER_SM90, "--name", "other")
        assert status == 0, output
        assert all(p.exists() for p in scratch)
        (gate / "go").touch()
        # Had the third build removed their files, these would fail to link or to rename.
        assert finish(linking)[0] == 0
        assert finish(writing)[0] == 0
    finally:
        kill_session(linking)
        kill_session(writing)
    assert {BUNDLE, "slow-sm_90a.cuteaot", "other-sm_90a.cuteaot"} <= set(os.listdir(out))


# -- 4. signals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_ends_the_build_and_its_compile_workers(tmp_path, env, signum):
    out, started = tmp_path / "bundles", tmp_path / "started"
    started.mkdir()
    slow = {**env, COMPILE_SECONDS_ENV: "300", STARTED_ENV: str(started)}
    build = start(slow, out, "--families", "router_gemm", "--arch", "sm_90a", "-j", "2")
    try:
        wait_for(lambda: len(list(started.iterdir())) >= 2, 120, "two workers compiling")
        family = descendants(build.pid)
        assert len(family) >= 2
        os.kill(build.pid, signum)  # the build alone, as `kill` or a CI runner's cancel does
        status = build.wait(10)
        wait_for(lambda: not running(family), 5, f"the workers to end: {running(family)}")
    finally:
        kill_session(build)
    assert status != 0
    # Nothing written; a SIGKILLed build leaves only its claim, which the next build takes over.
    assert not out.exists() or [p.name for p in out.iterdir() if not p.name.startswith(".")] == []
    if signum != signal.SIGKILL:
        assert leftovers(env, out) == []
    else:
        assert [p.name for p in out.iterdir()] == [".default.build-claim"]
        status, output = run(env, out, *ROUTER_SM90)
        assert status == 0, output
        assert leftovers(env, out) == []


# -- 5. a build of other families ----------------------------------------------------------------


@pytest.mark.slow
def test_a_build_of_other_families_never_silently_replaces_a_bundle(tmp_path, env):
    out = tmp_path / "bundles"
    status, output = run(env, out, "--families", "router_gemm,gemm_sm90", "--arch", "sm90a")
    assert status == 0, output
    before = sha256(out / BUNDLE)
    # docs/flashinfer.md's command, into the folder that holds the other families' bundle
    readme = (
        "--arch",
        "sm90a",
        "--families",
        "flashinfer_gdn_decode",
        "--model",
        "qwen3-next-80b-a3b",
    )
    status, output = run(env, out, *readme)
    assert status != 0
    assert "gemm_sm90" in output and "router_gemm" in output and "--name" in output
    assert sha256(out / BUNDLE) == before
    status, output = run(env, out, *readme, "--name", "flashinfer")
    assert status == 0, output
    assert sha256(out / BUNDLE) == before and (out / "flashinfer-sm_90a.cuteaot").exists()
    # The same families again (or more) replace their bundle as before.
    status, output = run(
        env, out, "--families", "router_gemm,gemm_sm90,gemm_sm90_fp8", "--arch", "sm90a"
    )
    assert status == 0, output


# -- 6. numpy ------------------------------------------------------------------------------------


def test_numpy_is_installed_with_cute_aot_since_torch_warns_without_it():
    # tvm_ffi imports torch, which warns "Failed to initialize NumPy" when numpy is missing:
    # every build worker and every server that loads a bundle imports tvm_ffi.
    without_numpy = "import sys; sys.modules['numpy'] = None; import tvm_ffi"
    result = subprocess.run([sys.executable, "-c", without_numpy], capture_output=True, text=True)
    assert "Failed to initialize NumPy" in result.stderr
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"numpy\b", requirement) for requirement in project["dependencies"])


if __name__ == "__main__":  # `python -m tests.test_build_faults ARGS`: aot-build, stub kernels
    from cute_aot.aot import cli
    from tests.test_build_faults import slow_stub_compile

    cli.main(obj={"worker": slow_stub_compile})  # its compile worker (aot/cli.py compile_worker)
