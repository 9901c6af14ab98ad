"""artifacts/core/at_exit.py: a process's exit hooks run once, whether it exits or is sent SIGTERM,
even when the signal reaches another thread while the main thread waits in C (a pool worker
waiting for a queue lock that a worker killed before it holds), and a forked child's SIGTERM
is the child's alone. Each case is a real process, really signalled."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROLOGUE = """
import multiprocessing, os, signal, sys, threading, time
from cute_aot.artifacts.core.at_exit import on_exit
out = sys.argv[1]
on_exit(lambda: open(out, "a").write(f"hooks of {os.getpid()}\\n"))
"""


def _started(tmp_path: Path, body: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "hooks.txt"
    script = PROLOGUE + textwrap.dedent(body)
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "ready"
    return process, out


def _wait_in_the_kernel(pid: int, seconds: float = 10) -> None:
    """Until the process's main thread sleeps in a futex (its semaphore wait)."""
    wchan = Path(f"/proc/{pid}/wchan")
    deadline = time.monotonic() + seconds
    while "futex" not in wchan.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "futex" in wchan.read_text()


def _ended(process: subprocess.Popen, timeout: float = 30) -> int:
    try:
        return process.wait(timeout=timeout)
    finally:
        process.kill()
        process.wait()


def test_sigterm_to_another_thread_while_the_main_thread_waits_in_c(tmp_path):
    process, out = _started(
        tmp_path,
        """
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the main thread never takes it
        lock = multiprocessing.Lock()
        lock.acquire()
        print("ready", flush=True)
        lock.acquire()  # sem_wait for ever, as in a terminated pool
        """,
    )
    _wait_in_the_kernel(process.pid)  # else the main thread may still run Python, and take it
    process.send_signal(signal.SIGTERM)
    assert _ended(process) == 128 + signal.SIGTERM  # ended, where it used to hang for ever
    assert out.read_text() == f"hooks of {process.pid}\n"


def test_sigterm_to_a_main_thread_running_python_keeps_its_default_action(tmp_path):
    process, out = _started(
        tmp_path,
        """
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
        """,
    )
    process.send_signal(signal.SIGTERM)
    assert _ended(process) == -signal.SIGTERM
    assert out.read_text() == f"hooks of {process.pid}\n"


def test_a_forked_child_s_sigterm_is_its_own(tmp_path):
    """The child shares the parent's wakeup pipe at fork: it lets it go, so its SIGTERM neither
    ends the parent nor runs the parent's hooks; the parent's run once, at its own exit."""
    process, out = _started(
        tmp_path,
        """
        started, ready = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(ready, b"1")  # past fork's own clearing of signals that came in just then
            time.sleep(120)
            os._exit(0)
        os.read(started, 1)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        time.sleep(1.2)  # past the watcher's grace: a SIGTERM it saw would have ended us
        print("ready", flush=True)
        print(os.WTERMSIG(status), flush=True)
        """,
    )
    assert process.stdout.readline().strip() == str(int(signal.SIGTERM))
    assert _ended(process) == 0
    assert out.read_text() == f"hooks of {process.pid}\n"
