"""Run compile calls in worker processes, as many as cores and memory allow, and never let one
key take the build down with it.

cute.compile is a process-wide singleton and not thread-safe, so parallelism is processes. A key
that raises becomes a failed row. A key that kills its worker (a compiler crash, the OOM killer)
breaks the whole pool; the calls that were in flight are then re-run one at a time, each in its
own process, so the culprit is named and the others still compile.

Workers never outlive the build: an exception in the build (SIGTERM and SIGINT arrive as one,
see cli.py) kills them at once rather than waiting out compiles nobody will use, and on Linux the
kernel kills them when the build itself is killed (SIGKILL).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cute_aot.aot.compile_worker import compile_to_object

# What one compile worker holds after importing cutlass and compiling a router GEMM key.
WORKER_MEMORY_BYTES = 300 << 20
# Calls queued per worker: enough to keep workers busy, few enough that a crash suspects few.
IN_FLIGHT_PER_WORKER = 2
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WORKER_DIED = "the compile worker process died (crashed or was killed, e.g. out of memory)"

Worker = Callable[[str, dict, str, str], dict]
RowSink = Callable[[dict], None]


@dataclass(frozen=True)
class CompileCall:
    """One key for one architecture, its object written into out_dir."""

    key: object  # a family's Key
    arch: str
    out_dir: Path

    def args(self) -> tuple[str, dict, str, str]:
        return self.key.FAMILY, self.key.fields(), self.arch, str(self.out_dir)

    def failed(self, error: str) -> dict:
        return {
            "family": self.key.FAMILY,
            "key_id": self.key.id,
            "symbol": self.key.symbol,
            "arch": self.arch,
            "status": "failed",
            "error": error,
            "seconds": 0.0,
        }


def available_memory() -> int | None:
    """Bytes this process may still use: MemAvailable, capped by a cgroup v2 limit if any."""
    found = []
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:  # containers: /proc/meminfo shows the host, the cgroup is the real bound
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """One worker per usable core, fewer when memory cannot hold that many workers."""
    return jobs_for(usable_cores(), available_memory())


def jobs_for(cores: int, memory: int | None) -> int:
    """Workers for `cores` usable cores and `memory` available bytes (None: unknown): one per
    core, as many as the memory holds at WORKER_MEMORY_BYTES each, at least one."""
    by_memory = cores if memory is None else memory // WORKER_MEMORY_BYTES
    return max(1, min(cores, by_memory))


def run_compiles(
    calls: list[CompileCall], jobs: int, on_row: RowSink, worker: Worker = compile_to_object
) -> None:
    """Compile every call; on_row gets exactly one row per call, in completion order."""
    if not calls:
        return
    if jobs <= 1:
        # -j 1: in this process (no worker start-up; a debugger and tracebacks work as usual).
        for call in calls:
            on_row(_call_here(call, worker))
        return
    queue = deque(calls)
    while queue:
        for suspect in _drain(queue, min(jobs, len(queue)), on_row, worker):
            on_row(_call_alone(suspect, worker))


def _call_here(call: CompileCall, worker: Worker) -> dict:
    try:
        return worker(*call.args())
    except Exception as exc:  # the worker reports errors as rows; this is a bug, still a row
        return call.failed(f"{type(exc).__name__}: {exc}")


def _start_worker(build_pid: int) -> None:
    """In each worker, first. Ctrl-C signals the whole process group: the build alone decides,
    and stops its workers. And a worker dies with its build, even a SIGKILLed one (Linux)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: not Linux
        return
    if os.getppid() != build_pid:  # the build died before prctl took effect
        os._exit(1)


@contextmanager
def _pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    # spawn: workers start clean (no forked locks or CUDA state); each imports cutlass once.
    pool = ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(os.getpid(),),
    )
    try:
        yield pool
    except BaseException:  # SIGTERM, Ctrl-C, a bug: a compile may take minutes more
        _kill_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    if hasattr(pool, "kill_workers"):  # Python 3.14+
        pool.kill_workers()
        return
    processes = list((pool._processes or {}).values())  # no public handle before 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()
    for process in processes:
        process.join()


def _drain(queue: deque, jobs: int, on_row: RowSink, worker: Worker) -> list[CompileCall]:
    """Run queued calls until the queue is empty or a worker dies; returns the suspects."""
    in_flight: dict[Future, CompileCall] = {}
    with _pool(jobs) as pool:
        while queue or in_flight:
            while queue and len(in_flight) < IN_FLIGHT_PER_WORKER * jobs:
                call = queue.popleft()
                try:
                    in_flight[pool.submit(worker, *call.args())] = call
                except BrokenProcessPool:
                    return [call, *_settle(in_flight, on_row)]
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                if isinstance(future.exception(), BrokenProcessPool):
                    return _settle(in_flight, on_row)
                call = in_flight.pop(future)
                on_row(_result_row(future, call))
        return []


def _settle(in_flight: dict[Future, CompileCall], on_row: RowSink) -> list[CompileCall]:
    """After the pool broke: report the calls that finished, return those that did not."""
    suspects = []
    for future, call in in_flight.items():
        if future.done() and not isinstance(future.exception(), BrokenProcessPool):
            on_row(_result_row(future, call))
        else:
            suspects.append(call)
    in_flight.clear()
    return suspects


def _result_row(future: Future, call: CompileCall) -> dict:
    error = future.exception()
    if error is None:
        return future.result()
    return call.failed(f"{type(error).__name__}: {error}")


def _call_alone(call: CompileCall, worker: Worker) -> dict:
    """Re-run a suspect in a fresh one-worker pool: if it dies again, it is the culprit."""
    with _pool(1) as pool:
        future = pool.submit(worker, *call.args())
        wait([future])
    if isinstance(future.exception(), BrokenProcessPool):
        return call.failed(WORKER_DIED)
    return _result_row(future, call)
