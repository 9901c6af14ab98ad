"""The fleet miss loop: server processes on several hosts record misses to a shared prefix (one
file per process), and the release build and `aot-cache misses` read the whole prefix.

Real components on loopback only: moto's standalone S3 server, reached through s3fs configured
the way an operator configures it, by the environment (AWS_ENDPOINT_URL and the usual AWS
credential variables); and a local folder, as on NFS.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
from click.testing import CliRunner

from cute_aot.aot.planning import plan_from_misses
from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from cute_aot.artifacts.miss_log import read_misses
from cute_aot.kernels import family
from cute_aot.runtime import misses, process_files

from .conftest import PROBLEMS

ROUTER = family("router_gemm")
BUCKET = "fleet"
_M, _N, _K = PROBLEMS[1]
BUNDLED = f"M={_M},N={_N},K={_K}"  # a key the stub bundles hold (an older release missed it)
SHARED = "M=3,N=128,K=2880"  # missed on both hosts
PER_HOST = {"gpu-a": ["M=2,N=128,K=2880", BUNDLED], "gpu-b": ["M=1,N=8,K=64"]}

# One server process: records its misses (twice, as repeated calls would), says how long the
# op path spent doing so, and exits; its file is written by the exit flush.
SERVER = textwrap.dedent(
    """
    import json, sys, time
    from cute_aot.kernels import family
    from cute_aot.runtime.misses import record_miss

    router = family("router_gemm")
    started = time.perf_counter()
    for problem in json.loads(sys.argv[1]) * 2:
        key = router.dispatch(router.parse_problem(problem), "sm_90a").key
        record_miss(key, "sm_90a", {"problem": problem})
    print(json.dumps({"op_path_s": time.perf_counter() - started}))
    """
)


def _key_id(problem: str) -> str:
    return ROUTER.dispatch(ROUTER.parse_problem(problem), "sm_90a").key.id


def _serve(hosts: dict[str, list[str]], env: dict) -> list[dict]:
    """Run one server process per host at once; each must exit 0 within the test's patience."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(problems)],
            env={**env, "CUTE_AOT_HOST": host},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for host, problems in hosts.items()
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append({"stdout": json.loads(out.strip().splitlines()[-1]), "stderr": err})
    return results


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # By name: the last upload of a process must still resolve one while the process exits.
    endpoint = f"http://localhost:{port}"
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """AWS variables for this process and its children: dummy credentials, no config files."""
    import s3fs

    values = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # an instance keeps the endpoint it was made with
    yield monkeypatch
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(params=["s3", "folder"])
def fleet_prefix(request, tmp_path, aws_env):
    """Where the fleet records: an S3 prefix, or a local folder (as NFS users point it)."""
    if request.param == "folder":
        return str(tmp_path / "fleet-misses") + "/"
    aws_env.setenv("AWS_ENDPOINT_URL", request.getfixturevalue("s3_endpoint"))
    return f"s3://{BUCKET}/test-{time.monotonic_ns()}/misses/"  # the server outlives a test


def test_two_hosts_misses_reach_the_release_build(fleet_prefix, stub_bundles):
    hosts = {host: [SHARED, *problems] for host, problems in PER_HOST.items()}
    env = {**os.environ, "CUTE_AOT_MISS_LOG": fleet_prefix}
    for result in _serve(hosts, env):
        assert "cute-aot:" not in result["stderr"], result["stderr"]  # nothing went wrong
        assert result["stdout"]["op_path_s"] < 0.5  # the op path never waited on the store

    # One file per process, named for its host; every line a whole record with its host.
    names = _listing(fleet_prefix)
    assert len(names) == 2, names
    for host in hosts:
        (name,) = [n for n in names if n.startswith(f"{host}-")]
        assert re.fullmatch(rf"{host}-\d+-\d{{8}}T\d{{6}}Z\.jsonl", name), name
    records = read_misses(fleet_prefix)
    assert sorted(r["host"] for r in records) == ["gpu-a"] * 3 + ["gpu-b"] * 2

    # What aot-build --from-misses builds: the union, each key once.
    wanted = {_key_id(problem) for problems in hosts.values() for problem in problems}
    plan = plan_from_misses(fleet_prefix, (), ())
    assert list(plan) == ["sm_90a"] and len(plan["sm_90a"]) == len(wanted) == 4
    assert {key.id for key in plan["sm_90a"]} == wanted

    folder, _, _ = stub_bundles
    result = CliRunner().invoke(
        aot_cache, ["misses", "--log", fleet_prefix, "--bundle", str(folder), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["records"] == 5 and report["hosts"] == ["gpu-a", "gpu-b"]
    rows = {row["key_id"]: row for row in report["keys"]}
    assert set(rows) == wanted
    assert rows[_key_id(SHARED)]["hosts"] == ["gpu-a", "gpu-b"]
    assert rows[_key_id(SHARED)]["count"] == 2
    assert rows[_key_id(BUNDLED)]["hosts"] == ["gpu-a"] and rows[_key_id(BUNDLED)]["in_bundles"]
    assert not rows[_key_id(PER_HOST["gpu-b"][0])]["in_bundles"]
    for key_id, row in rows.items():
        seen = sorted(r["time"] for r in records if r["key_id"] == key_id)
        assert (row["first_seen"], row["last_seen"]) == (seen[0], seen[-1])


def _listing(prefix: str) -> list[str]:
    from cute_aot.artifacts.core import urls

    fs, root = urls.filesystem(prefix)
    return sorted(path.rsplit("/", 1)[-1] for path in fs.find(root))  # temporaries included


def test_an_unreachable_store_costs_one_warning_and_no_exit_status(aws_env):
    # Nothing listens there: every upload fails (after botocore's retries) until exit gives up.
    aws_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    env = {**os.environ, "CUTE_AOT_MISS_LOG": f"s3://{BUCKET}/misses/"}
    started = time.monotonic()
    (result,) = _serve({"gpu-c": [SHARED, "M=1,N=8,K=64"]}, env)
    assert time.monotonic() - started < process_files.EXIT_FLUSH_S + 10
    assert result["stdout"]["op_path_s"] < 0.5
    assert result["stderr"].count("cute-aot:") == 1, result["stderr"]
    assert "miss log s3://fleet/misses/gpu-c-" in result["stderr"]


def test_a_failed_write_is_retried_at_the_next_interval(
    fresh_runtime, monkeypatch, settings_scope, tmp_path
):
    blocker = tmp_path / "not-yet"  # a file where the folder should be: every write fails
    blocker.write_text("")
    monkeypatch.setattr(process_files, "FLUSH_INTERVAL_S", 0.05)
    settings_scope(
        CUTE_AOT_MISS_LOG=f"{blocker}/",
        CUTE_AOT_HOST="gpu d/../e",  # made safe for a file name
    )
    key = ROUTER.dispatch(ROUTER.parse_problem(SHARED), "sm_90a").key
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def said():
            return [str(w.message) for w in caught if "cute-aot" in str(w.message)]

        misses.record_miss(key, "sm_90a", {})  # the writer thread takes it from here
        _wait_for(said)
        time.sleep(0.2)  # several more intervals fail, silently
        blocker.unlink()
        (path,) = _wait_for(lambda: list(blocker.glob("*.jsonl")))
    assert len(said()) == 1 and "cannot write the miss log" in said()[0], said()
    assert path.name.startswith(f"gpu_d_.._e-{os.getpid()}-")
    assert [r["key_id"] for r in read_misses(f"{blocker}/")] == [_key_id(SHARED)]


def _wait_for(condition, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return found


def test_a_folder_is_read_whole_and_a_file_as_before(tmp_path):
    folder = tmp_path / "misses"
    record = {"family": "router_gemm", "key": {"m": 1}, "arch": "sm_90a", "host": "h"}
    lines = {
        "h-1-20261201T000000Z.jsonl": [record],
        "old/shared.jsonl.1": [{**record, "key": {"m": 2}}],  # a rotated NFS log: read first
        "old/shared.jsonl": [{**record, "key": {"m": 3}}],
        ".h-2-x.jsonl.pid7@abc.tmp": [{**record, "key": {"m": 4}}],  # a writer's temporary
        "notes.txt": [{**record, "key": {"m": 5}}],
    }
    for name, records in lines.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records) + '{"torn')
    assert [r["key"]["m"] for r in read_misses(folder)] == [1, 2, 3]
    assert [r["key"]["m"] for r in read_misses(f"file://{folder}/")] == [1, 2, 3]
    assert [r["key"]["m"] for r in read_misses(folder / "old" / "shared.jsonl")] == [2, 3]
