"""CUTE_AOT_REPORT: what every process's `cute.compile` calls cost, written when it ends.

At exit (or SIGTERM), each process whose hook was active adds its counts to the report file, a
JSON object: the totals of compiles (real `cute.compile` executions made through the hook),
hits (calls served from a bundle) and misses (served processes that found no kernel), per
target (`module:function` compiled) and per family (runtime/policy.py's counters), and each
process's own under `processes`. Processes merge into the file under a lock (`<report>.lock`,
artifacts/atomic.claimed), each replacing it whole (a reader sees the previous version or the
next), so a server and all its workers give one report: `compiles: 0` says the whole program was
served.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.at_exit import on_exit
from cute_aot.artifacts.core.atomic import atomic_write, claimed
from cute_aot.artifacts.core.notices import warn_once

__all__ = ["summary", "write_at_exit", "write_report"]

REPORT_FORMAT = 1
TOTALS = ("compiles", "hits", "misses")
# A merge holds the lock for milliseconds: one held longer belongs to a process that hangs or
# died on another machine, and is taken over; a wait past that is said, not waited out at exit.
LOCK_STALE = 30.0
LOCK_WAIT = 60.0


def summary() -> dict:
    """This process's counts."""
    from cute_aot.runtime import compile_hook, policy
    from cute_aot.runtime.capture import virtual
    from cute_aot.runtime.mode import current_mode

    targets = compile_hook.per_target()
    return {
        "pid": os.getpid(),
        "host": settings.host_name(),
        "argv": sys.argv[:8],
        "mode": current_mode().value,
        **{total: sum(counts[total] for counts in targets.values()) for total in TOTALS},
        "targets": targets,
        "families": policy.counters(),
        **({"virtual": virtual.summary()} if virtual.active() else {}),
    }


def write_report(path: Path) -> None:
    """Merge this process's summary into the report at `path`."""
    mine = summary()
    path.parent.mkdir(parents=True, exist_ok=True)
    with claimed(f"{path}.lock", wait=LOCK_WAIT, stale_after=LOCK_STALE):
        try:
            report = json.loads(path.read_text())
            processes = report["processes"] if isinstance(report, dict) else {}
        except (OSError, ValueError, KeyError):
            processes = {}
        processes[f"{mine['host']}-{mine['pid']}"] = mine
        atomic_write(
            path, (json.dumps(_merged(processes), indent=1, sort_keys=True) + "\n").encode()
        )


def _counted_over(processes: dict, name: str, fields: tuple) -> list[dict]:
    """The virtual summaries' rows `name` of every process, each subject's times summed."""
    from cute_aot.runtime.capture.virtual import questions

    counted: dict[tuple, int] = {}
    for process in processes.values():
        for row in process.get("virtual", {}).get(name, []):
            subject = tuple(row[field] for field in fields)
            counted[subject] = counted.get(subject, 0) + row["times"]
    return questions.counted_rows(counted, fields)


def _merged(processes: dict) -> dict:
    targets: dict[str, dict[str, int]] = {}
    families: dict[str, dict[str, int]] = {}
    for process in processes.values():
        for into, counted in (
            (targets, process.get("targets", {})),
            (families, process.get("families", {})),
        ):
            for name, counts in counted.items():
                total = into.setdefault(name, {})
                for outcome, number in counts.items():
                    total[outcome] = total.get(outcome, 0) + number
    # virtual GPUs: each question not answered, and each check not made, counted over processes
    from cute_aot.runtime.capture.virtual import CHECK_FIELDS, QUESTION_FIELDS

    unanswerable = _counted_over(processes, "unanswerable", QUESTION_FIELDS)
    not_checked = _counted_over(processes, "checks_not_made", CHECK_FIELDS)
    failed: dict[str, list] = {}  # virtual GPUs: a test suite's failures, by whose they are
    for process in processes.values():
        for whose, tests in process.get("virtual", {}).get("failed_tests", {}).items():
            failed.setdefault(whose, []).extend(tests)
    tests = sorted(  # virtual GPUs: each test of a suite, with its compiles and checks not made
        (
            row
            for process in processes.values()
            for row in process.get("virtual", {}).get("tests", [])
        ),
        key=lambda row: row["test"],
    )
    return {
        "format": REPORT_FORMAT,
        **{total: sum(p.get(total, 0) for p in processes.values()) for total in TOTALS},
        "targets": targets,
        "families": families,
        **({"unanswerable": unanswerable} if unanswerable else {}),
        **(
            {"failed_tests": {w: sorted(t, key=lambda r: r["test"]) for w, t in failed.items()}}
            if any(failed.values())
            else {}
        ),
        **({"tests": tests} if tests else {}),
        **({"checks_not_made": not_checked} if not_checked else {}),
        "processes": processes,
    }


_armed = False  # write_at_exit ran in this process (or the parent it was forked from)


def write_at_exit() -> None:
    """Write this process's summary when it exits or is terminated (CUTE_AOT_REPORT)."""
    global _armed
    path = settings.report_file()
    if path is None:
        return
    _armed = True

    def write() -> None:
        try:
            write_report(path)
        except Exception as exc:
            warn_once(("report", str(path)), f"cannot write the report {path} ({exc})")

    on_exit(write)


def _after_fork() -> None:
    """A fork child is another process: it reports its own work, at its own end."""
    from cute_aot.runtime import compile_hook, policy

    compile_hook.reset_counts()
    policy.reset_counters()
    if _armed:
        write_at_exit()


os.register_at_fork(after_in_child=_after_fork)
