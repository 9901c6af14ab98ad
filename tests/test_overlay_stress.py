"""8 processes miss the same keys at the same moment against one overlay folder."""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from cute_aot.artifacts.bundle import read_bundle
from cute_aot.kernels.router_gemm import dispatch
from cute_aot.runtime.overlay import overlay_path

pytestmark = pytest.mark.slow

ARCH = "sm_90a"
PROBLEMS = [(1, 128, 2880), (2, 128, 2880)]  # (M, N, K)
WORKERS = 8

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from cute_aot.kernels.router_gemm import dispatch
    from cute_aot.runtime import REGISTRY, jit
    from cute_aot.runtime.resolution import key_function
    go = sys.argv[1]
    while not os.path.exists(go):  # start together
        time.sleep(0.01)
    resolved = []
    for m, n, k in {problems!r}:
        key = dispatch(m, n, k, "{arch}")
        resolved.append([key.id, callable(key_function(key, "{arch}"))])
    print(json.dumps({{"resolved": resolved, "compiles": jit.compile_count,
                       "published": jit.published}}))
    """
).format(problems=PROBLEMS, arch=ARCH)


def test_concurrent_misses_publish_each_key_once(tmp_path, settings_scope):
    cache = tmp_path / "shared-cache"
    settings_scope(CUTE_AOT_CACHE_DIR=str(cache))  # this process reads what the workers wrote
    env = {"CUTE_AOT_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    go = tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    time.sleep(1.0)
    go.touch()
    reports = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=600)
        assert worker.returncode == 0, stderr
        reports.append(json.loads(stdout.strip().splitlines()[-1]))

    keys = [dispatch(*problem, ARCH) for problem in PROBLEMS]
    for report in reports:  # every process got a function for every key
        assert [r[0] for r in report["resolved"]] == [key.id for key in keys]
        assert all(r[1] is True for r in report["resolved"])
    for key in keys:  # each key published by exactly one process
        assert sum(report["published"].count(key.id) for report in reports) == 1
        manifest, _ = read_bundle(overlay_path(key, ARCH))  # complete and verified
        assert [entry.key_id for entry in manifest.entries] == [key.id]
    files = sorted(p.name for p in overlay_path(keys[0], ARCH).parent.iterdir())
    assert files == sorted(f"{key.id}.cuteaot" for key in keys)  # no temporary left behind
    print(f"compiles per process: {[r['compiles'] for r in reports]}")
