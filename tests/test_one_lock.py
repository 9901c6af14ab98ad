"""One locking rule and one temporary-name scheme (artifacts/core/atomic.py), caused for real.

Every lock of the package (build claims, the CUTE_AOT_REPORT merge, the shared record file, one
fetch per URL) is a file published with link() naming its holder, taken over when its holder
died, released by unlink: never flock or lockf, which NFS keeps unreliably. Each is contended by
real processes here; holders are killed with SIGKILL; a read-only folder is made read-only for
real (a read-only mount where the tests run as root, whom permissions do not stop).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tokenize
from pathlib import Path

import pytest

from cute_aot.artifacts.core import atomic
from cute_aot.artifacts.core.atomic import Claimed, claimed, remove_dead_leftovers
from tests import test_integrity, test_remote_bundles
from tests.conftest import child_env
from tests.test_remote_bundles import RANK, _cached, http_store, signed, trusted

keys = test_integrity.keys  # fixtures of other modules, found by pytest under these names
__all__ = ["http_store", "keys", "signed", "trusted"]

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aot", "artifacts", "kernels", "runtime")


def _start(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _together(code: str, count: int, *args: str) -> list[str]:
    """`count` processes running `code`, released at one instant; their stdouts."""
    go = Path(args[0]) / "go"
    workers = [_start(code, *args, str(n)) for n in range(count)]
    deadline = time.monotonic() + 60
    while len(list(go.parent.glob("ready-*"))) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [worker.communicate(timeout=120) for worker in workers]
    for worker, (_, err) in zip(workers, results, strict=True):
        assert worker.returncode == 0, err
    return [out for out, _ in results]


_READY = """
from pathlib import Path
import sys, time
(Path(sys.argv[1]) / f"ready-{sys.argv[-1]}").touch()
while not (Path(sys.argv[1]) / "go").exists():
    time.sleep(0.002)
"""


def _holder(lock: Path) -> subprocess.Popen:
    """A process holding `lock` until killed."""
    holder = _start(
        """
        import sys, time
        from cute_aot.artifacts.core.atomic import claimed
        with claimed(sys.argv[1]):
            print("held", flush=True)
            time.sleep(600)
        """,
        str(lock),
    )
    assert holder.stdout.readline().strip() == "held", holder.stderr.read()
    return holder


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)


def _debris(folder: Path) -> list[str]:
    """Lock temporaries and takeover guards left in `folder`."""
    return sorted(p.name for p in folder.iterdir() if ".pid" in p.name or "takeover" in p.name)


# -- the three sites, contended by processes ---------------------------------------------------
def test_report_merges_from_processes_lose_nothing(tmp_path):
    """Each process merges 25 summaries (each under a name of its own) into one report at once:
    a merge that read the file before another's rename would drop that one's summaries."""
    report = tmp_path / "report.json"
    code = (
        _READY
        + """
from cute_aot.runtime.capture import report
for i in range(25):
    name = f"{sys.argv[-1]}.{i}"
    report.summary = lambda: {"pid": name, "host": "h", "compiles": 1, "hits": 2, "misses": 0}
    report.write_report(Path(sys.argv[2]))
"""
    )
    _together(code, 4, str(tmp_path), str(report))
    merged = json.loads(report.read_text())
    assert len(merged["processes"]) == 100
    assert (merged["compiles"], merged["hits"]) == (100, 200)
    assert not (tmp_path / "report.json.lock").exists() and _debris(tmp_path) == []


def test_the_shared_record_file_holds_each_record_once(tmp_path):
    """Four processes record the same 30 calls, each in its own order, into one file."""
    shared = tmp_path / "calls.jsonl"
    code = (
        _READY
        + """
import random
from cute_aot.runtime.capture.record import Recorder
subjects = [f"k{i:02d}" for i in range(30)]
random.Random(int(sys.argv[-1])).shuffle(subjects)
recorder = Recorder(sys.argv[2])
for subject in subjects:
    recorder._append({"key_id": subject, "pid": sys.argv[-1]}, subject)
"""
    )
    _together(code, 4, str(tmp_path), str(shared))
    lines = [json.loads(line)["key_id"] for line in shared.read_text().splitlines()]
    assert sorted(lines) == [f"k{i:02d}" for i in range(30)]  # each once, none lost
    assert not (tmp_path / "calls.jsonl.lock").exists() and _debris(tmp_path) == []


def test_two_fetchers_of_one_url_download_once(http_store, signed, trusted, tmp_path):
    shutil.copytree(signed, http_store.root / "release")
    http_store.delay = 0.5  # the second asks while the first downloads
    url = f"{http_store.url}/release/{test_remote_bundles.NAME}"
    results = test_remote_bundles._ranks(url, tmp_path, count=2)
    assert results[0] == results[1] and len(results[0]) == 1
    assert http_store.gets == {f"/release/{test_remote_bundles.NAME}": 1}
    assert list((trusted / "remote" / "locks").iterdir()) == []  # released, nothing left


# -- holders killed --------------------------------------------------------------------------
def test_a_fetcher_killed_mid_download_is_taken_over_at_once(http_store, signed, trusted, tmp_path):
    """Not after remote.LOCK_WAIT: its pid is dead, so its lock, and its partial download, go."""
    from cute_aot.runtime import remote

    shutil.copytree(signed, http_store.root / "release")
    url = f"{http_store.url}/release/{test_remote_bundles.NAME}"
    http_store.delay = 5.0
    http_store.handle_error = lambda *_: None  # the killed rank's connection breaks: expected
    (tmp_path / "go").touch()
    first = subprocess.Popen(
        [sys.executable, "-c", RANK, url, str(tmp_path / "ready"), str(tmp_path / "go")],
        env=child_env(),  # this test's cache dir and trusted keys (`trusted`, set in-process)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not http_store.gets and time.monotonic() < deadline:  # it holds the lock, downloading
        time.sleep(0.01)
    assert http_store.gets, first.stderr.read() if first.poll() is not None else "no GET"
    (lock,) = (trusted / "remote" / "locks").iterdir()
    _kill(first)
    assert json.loads(lock.read_text())["pid"] == first.pid  # left behind by the killed holder
    # its download's temporary, as it would be had bytes arrived
    partial = (
        f".download.{atomic.owner_tag().replace(f'pid{os.getpid()}', f'pid{first.pid}')}.x1.tmp"
    )
    (trusted / "remote" / partial).write_bytes(b"half")

    http_store.delay = 0.0
    started = time.monotonic()
    (copy,) = remote.fetch(url)
    assert time.monotonic() - started < 10
    assert copy.read_bytes() == (signed / test_remote_bundles.NAME).read_bytes()
    assert _cached(trusted)["other"] == []  # its partial download removed
    assert list((trusted / "remote" / "locks").iterdir()) == []


def test_a_killed_report_writer_does_not_stop_the_next(tmp_path):
    from cute_aot.runtime.capture import report

    _kill(_holder(tmp_path / "report.json.lock"))
    started = time.monotonic()
    report.write_report(tmp_path / "report.json")
    assert time.monotonic() - started < report.LOCK_STALE  # by its dead pid, not its age
    assert len(json.loads((tmp_path / "report.json").read_text())["processes"]) == 1


def test_waiters_of_a_killed_holder_take_over_one_at_a_time(tmp_path):
    """Six processes wait on a lock whose holder is then killed: they all judge it stale at once,
    yet only one removes it, and each then holds it alone (a marker made with O_EXCL inside)."""
    lock = tmp_path / "shared.lock"
    holder = _holder(lock)
    code = (
        _READY
        + """
import os
from cute_aot.artifacts.core.atomic import claimed
inside = Path(sys.argv[1]) / "inside"
for _ in range(10):
    with claimed(sys.argv[2], wait=60):
        os.close(os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # fails if two are in
        time.sleep(0.001)
        inside.unlink()
print("ok")
"""
    )
    workers = [_start(code, str(tmp_path), str(lock), str(n)) for n in range(6)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    (tmp_path / "go").touch()
    time.sleep(0.3)  # every worker is waiting on the live holder now
    _kill(holder)
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert (worker.returncode, out.strip()) == (0, "ok"), err
    assert not lock.exists() and _debris(tmp_path) == []


def _taking_over(lock: Path, then_hold: bool) -> subprocess.Popen:
    """A process in the middle of taking over `lock` from its dead holder: it holds the takeover
    guard (as atomic._take_over does) and, if `then_hold`, after 0.3 s puts its own lock in the
    dead one's place in one rename, then holds it; else it stays inside the guard."""
    taker = _start(
        """
        import json, os, socket, sys, time
        from pathlib import Path
        from cute_aot.artifacts.core.atomic import claimed, owner_tag
        lock = Path(sys.argv[1])
        with claimed(f"{lock}.takeover"):
            print("taking over", flush=True)
            time.sleep(0.3)
            if sys.argv[2] == "hold":
                mine = {"owner": owner_tag(), "pid": os.getpid(), "host": socket.gethostname(),
                        "since": "now", "token": "winner"}
                (lock.parent / "winner.tmp").write_text(json.dumps(mine))
                os.replace(lock.parent / "winner.tmp", lock)
            time.sleep(600)
        """,
        str(lock),
        "hold" if then_hold else "stay",
    )
    assert taker.stdout.readline().strip() == "taking over", taker.stderr.read()
    return taker


def test_a_lost_takeover_names_the_winner_not_the_dead_holder(tmp_path):
    lock = tmp_path / ".default.build-claim"
    dead = _holder(lock)
    _kill(dead)
    winner = _taking_over(lock, then_hold=True)
    try:
        with pytest.raises(Claimed) as raised:
            with claimed(lock):
                pass
    finally:
        _kill(winner)
    assert raised.value.holder["pid"] == winner.pid
    assert f"pid {winner.pid} " in str(raised.value) and f"pid {dead.pid} " not in str(raised.value)


def test_a_build_that_loses_a_takeover_names_no_dead_build(tmp_path):
    """The takeover's winner has not linked its claim yet: the losing build says so, and names
    neither the dead build nor anyone else."""
    from tests.test_build_faults import ROUTER_SM90, run

    out = tmp_path / "bundles"
    out.mkdir()
    lock = out / ".default.build-claim"
    dead = _holder(lock)
    _kill(dead)
    taker = _taking_over(lock, then_hold=False)
    try:
        status, output = run({**os.environ, "TMPDIR": str(tmp_path)}, out, *ROUTER_SM90)
    finally:
        _kill(taker)
    assert status == 1, output
    (line,) = [line for line in output.splitlines() if "another aot-build" in line]
    assert f"pid {dead.pid} " not in line
    assert "taking over a dead build's claim; which one is not known yet" in line


def test_a_lock_of_another_machine_is_waited_for_then_taken_over_by_age(tmp_path):
    """Its holder cannot be asked whether it lives: a young lock is waited for, then named; one
    older than the bound is taken over."""
    lock = tmp_path / "x.lock"
    lock.write_text(
        json.dumps({"owner": "pid1@0123456789ab", "pid": 1, "host": "node-7", "since": "then"})
    )
    started = time.monotonic()
    with pytest.raises(Claimed, match="held by pid 1 on node-7 since then"):
        with claimed(lock, wait=0.3, stale_after=60):
            pass
    assert time.monotonic() - started >= 0.3 and lock.exists()
    old = time.time() - 61
    os.utime(lock, (old, old))
    with claimed(lock, wait=0, stale_after=60):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_build_claim_left_empty_by_an_older_version_is_taken_over_by_age(tmp_path):
    """The previous code created the claim, then wrote it: a kill in between left a file naming
    nobody, which no build could ever take over."""
    lock = tmp_path / ".default.build-claim"
    lock.touch()
    with pytest.raises(Claimed):
        with claimed(lock):
            pass
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with claimed(lock, stale_after=600):
        pass


def test_a_lock_on_a_read_only_folder_fails_clearly(tmp_path):
    """An OSError naming the lock, at once (no wait, no retry loop), nothing left behind."""
    folder = tmp_path / "ro"
    folder.mkdir()
    code = """
        import json, sys
        from cute_aot.artifacts.core.atomic import claimed
        try:
            with claimed(sys.argv[1] + "/report.json.lock", wait=30):
                print(json.dumps({"held": True}))
        except OSError as exc:
            print(json.dumps({"errno": exc.errno, "filename": exc.filename, "text": str(exc)}))
    """
    if os.geteuid() != 0:
        folder.chmod(0o555)
        command = [sys.executable, "-c", textwrap.dedent(code), str(folder)]
    elif shutil.which("unshare"):  # root writes anywhere: a read-only mount, in a namespace
        command = [
            "unshare",
            "-rm",
            "sh",
            "-c",
            'mount -t tmpfs -o ro none "$1" && exec "$2" -c "$3" "$1"',
            "sh",
            str(folder),
            sys.executable,
            textwrap.dedent(code),
        ]
    else:
        pytest.skip("running as root without unshare: no folder is read-only to this test")
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    folder.chmod(0o755)
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot mount a read-only folder here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout)
    assert failed.get("errno") in (errno.EACCES, errno.EROFS), failed
    assert failed["filename"] == f"{folder}/report.json.lock"
    assert "cannot take the lock" in failed["text"]
    assert time.monotonic() - started < 20
    assert list(folder.iterdir()) == []


# -- temporary names ---------------------------------------------------------------------------
def test_a_compile_worker_killed_mid_export_leaves_what_the_next_build_removes(tmp_path):
    """The exported object's temporary (artifacts/export.py) has the one scheme's name: the
    reaper knows it as a dead writer's."""
    out = tmp_path / "objects"
    out.mkdir()
    worker = _start(
        """
        import sys, time
        from types import SimpleNamespace
        from cute_aot.artifacts.export import export_object

        class Compiled:
            def export_to_c(self, path, **_):
                open(path, "wb").write(b"half an object")
                print("writing", flush=True)
                time.sleep(600)

        export_object(Compiled(), SimpleNamespace(symbol="k_sym", abi="tvm_ffi"), sys.argv[1])
        """,
        str(out),
    )
    assert worker.stdout.readline().strip() == "writing", worker.stderr.read()
    _kill(worker)
    (left,) = out.iterdir()
    assert re.fullmatch(rf"\.k_sym\.o\.pid{worker.pid}@.+\.[0-9a-f]{{8}}\.tmp", left.name), left
    assert remove_dead_leftovers(out) == [left] and list(out.iterdir()) == []


def test_temporary_names_are_reaped_only_once_their_writer_is_dead(tmp_path):
    name = atomic.temporary_name(".bundle.cuteaot")
    folder = atomic.temporary_name("cute-aot-build", folder=True)
    assert re.fullmatch(rf"\.bundle\.cuteaot\.{atomic.owner_tag()}\.[0-9a-f]{{8}}\.tmp", name)
    (tmp_path / name).touch()
    (tmp_path / folder).mkdir()
    assert remove_dead_leftovers(tmp_path) == []  # this process lives
    with pytest.raises(ValueError):
        atomic.temporary_name("bundle.cuteaot")  # neither hidden nor cute-aot scratch


# -- no second locking model, no second naming scheme ---------------------------------------------
_LOCK_NAMES = {"filelock", "FileLock", "SoftFileLock", "flock", "lockf"}
_TEMP_CALLS = {"mkstemp", "mkdtemp", "TemporaryDirectory", "NamedTemporaryFile", "TemporaryFile"}


def _names(path: Path) -> list[tuple[str, int]]:
    """The names in `path`'s code (comments and strings are not code)."""
    with tokenize.open(path) as source:
        return [
            (t.string, t.start[0])
            for t in tokenize.generate_tokens(source.readline)
            if t.type == tokenize.NAME
        ]


def test_no_file_lock_but_atomic_claimed():
    found = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line in _names(path)
        if name in _LOCK_NAMES
    ]
    assert found == [], "lock with artifacts/atomic.claimed (NFS keeps no flock): " + str(found)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r'^\s*"filelock\b', pyproject, re.M), "filelock is a dependency again"


def test_no_temporary_name_but_atomic_temporary_name():
    found = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line in _names(path)
        if name in _TEMP_CALLS
    ]
    assert found == [], "name temporaries with atomic.temporary_name (the reaper's): " + str(found)
