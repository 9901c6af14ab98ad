"""A build's bundles and report are one unit (issue 42, faults found by injection): two real
`aot-build` processes into one `--out`, and a kill -9 between a bundle's rename and the report's
write. Each fault is caused for real, at a point observed from outside the build: a C compiler
wrapper that holds the link of the second architecture (after the first bundle's rename), or
strace stopping the build (SIGSTOP) after each fsync until the report's temporary file is there.
The builds are those of tests/test_build_faults.py: `aot-build` with stub kernels.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.test_build_faults import (
    BUNDLE,
    ROUTER_SM90,
    _stat,
    descendants,
    env,  # noqa: F401 (a fixture)
    finish,
    gated,
    kill_session,
    leftovers,
    run,
    sha256,
    start,
    wait_for,
)

REPORT = "default.build-report.json"
BOTH_ARCHS = ("--families", "router_gemm", "--arch", "sm_90a", "--arch", "sm_100a", "-j", "1")


def mismatched(out: Path) -> list[str]:
    """The bundles the report in `out` describes with other bytes than the file's (none if there
    is no report)."""
    if not (out / REPORT).exists():
        return []
    report = json.loads((out / REPORT).read_text())
    return [
        record["file"]
        for record in report["bundles"]
        if record["sha256"] != sha256(out / record["file"])
    ]


def children(pid: int) -> list[int]:
    return [child for child in descendants(pid) if (_stat(child) or [0, 0])[1] == str(pid)]


def stopped(pid: int) -> bool:
    """Whether `pid` stays stopped (not merely passing through one of strace's syscall stops)."""
    for _ in range(4):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state not in "tT":
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow  # three builds
def test_a_kill_between_the_bundles_rename_and_the_reports_write_leaves_no_wrong_pair(
    tmp_path,
    env,  # noqa: F811
):
    out, gate = tmp_path / "bundles", tmp_path / "gate"
    status, output = run(env, out, *BOTH_ARCHS, "--bundle-version", "1")
    assert status == 0, output
    first = {arch: sha256(out / f"default-{arch}.cuteaot") for arch in ("sm_90a", "sm_100a")}
    # Held linking sm_100a: sm_90a's new bundle is in place, the report not yet written.
    build = start(gated(env, gate, at=1), out, *BOTH_ARCHS, "--bundle-version", "2")
    try:
        wait_for(lambda: (gate / "link1").exists(), 60, "the build to link sm_100a")
        os.killpg(build.pid, signal.SIGKILL)
        build.wait(10)
    finally:
        kill_session(build)
    assert sha256(out / BUNDLE) != first["sm_90a"]  # the kill came after the rename
    assert mismatched(out) == []  # before: the old report beside the new sm_90a bundle
    assert not (out / REPORT).exists()
    status, output = run(env, out, *BOTH_ARCHS, "--bundle-version", "2")  # takes the claim over
    assert status == 0, output
    assert mismatched(out) == []
    assert len(json.loads((out / REPORT).read_text())["bundles"]) == 2
    assert leftovers(env, out) == []


@pytest.mark.slow  # two builds, one under strace
def test_a_second_build_while_the_first_writes_its_report_refuses_and_pairs_nothing(
    tmp_path,
    env,  # noqa: F811
):
    """Fixed order: the first build has renamed its bundle and is about to rename its report
    when a second build of the same name runs from start to end. Before, the second went ahead
    (its claim covered only the bundles) and both exited 0, the first's report then describing
    the second's bundle."""
    if not shutil.which("strace"):
        pytest.skip("needs strace, to stop a build after an fsync")
    out = tmp_path / "bundles"
    # Only the build's own process is traced (no -f): it is stopped after each of its fsyncs.
    stop_at_fsync = ("strace", "-qq", "-o", "/dev/null", "-e", "trace=fsync")
    stop_at_fsync += ("-e", "inject=fsync:signal=STOP")
    first = start(env, out, *ROUTER_SM90, "--bundle-version", "1", wrap=stop_at_fsync)
    try:
        traced: list[int] = []

        def one_traced() -> bool:  # read once: a second read may race the tracer's start
            traced[:] = children(first.pid)
            return len(traced) == 1

        wait_for(one_traced, 30, "strace to start the build")
        (pid,) = traced
        while True:  # on to the stop after the report's fsync (its temporary file is there)
            wait_for(lambda: stopped(pid) or first.poll() is not None, 60, "an fsync's stop")
            assert first.poll() is None, first.log.read_text()
            if out.exists() and any(p.name.startswith(f".{REPORT}.") for p in out.iterdir()):
                break
            # A second SIGCONT, should strace be slow to resume this stop, only skips another
            # stop without the report's temporary file: one this loop would skip anyway.
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.1)
        assert (out / BUNDLE).exists()
        status, output = run(env, out, *ROUTER_SM90, "--bundle-version", "2")
        os.kill(pid, signal.SIGCONT)
        first_status, first_output = finish(first)
    finally:
        kill_session(first)
    assert status == 1, output
    (line,) = [line for line in output.splitlines() if "another aot-build" in line]
    assert f"pid {pid} " in line and str(out) in line and "'default'" in line
    assert first_status == 0, first_output
    assert mismatched(out) == []
    assert json.loads((out / REPORT).read_text())["bundles"][0]["file"] == BUNDLE
    assert leftovers(env, out) == []
