"""A virtual GPU: an unmodified workload records its CuTe DSL kernels for a GPU that is not there.

    CUTE_AOT_VIRTUAL=b200 CUTE_AOT_RECORD=records/ python -m pytest flashinfer_tests/...
    aot-build --from-record records/ --arch sm100a           # on the same CPU-only machine

CUTE_AOT_VIRTUAL names a profile of kernels/gpu_profiles.json (`h200`, `b200`), an architecture
(its reference profile: `sm_100a` is `b200`), or a JSON file `{"base": "b200", "attributes":
{...}, "max_active_clusters": {...}}` that overrides answers. The startup hook
(runtime/capture/activation.py) starts it in every process of the workload, before the workload
runs:
- torch (torch_device.py): tensors on `cuda` are fake (shapes, strides, dtypes; no memory), CPU
  tensors stay real; torch.cuda's device queries, streams, events and synchronization answer as
  the profile's GPU, on every thread.
- the CUDA driver (driver.py): cuda-python answers the profile's attributes, and cutlass's
  HardwareInfo its cluster occupancy; the DSL's architecture is the profile's, always explicit.
- cute.compile compiles and is recorded as on a real GPU; what it returns launches nothing.
- the libraries' own caches and tuning files go to a folder of this process, removed at exit.

What the profile cannot answer (a host read of a CUDA tensor's values: `.item()`, `.tolist()`,
control flow on them; a driver call no profile covers; a timing) raises `Unanswerable`, named by
question and call site, and counted in the summary said at exit. No value is invented.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading

from cute_aot.artifacts.core import settings
from cute_aot.runtime.capture.virtual import questions
from cute_aot.runtime.capture.virtual.questions import (
    CHECK_FIELDS,
    QUESTION_FIELDS,
    Unanswerable,
    check_not_made,
    checks_not_made,
)

__all__ = [
    "Unanswerable",
    "active",
    "check_not_made",
    "checks_not_made",
    "compile_calls",
    "start",
    "summary",
    "test_failed",
]

_profile = None  # the GpuProfile answering, once started
_lock = threading.Lock()
_compiles: dict[str, set] = collections.defaultdict(set)  # target -> distinct calls compiled
_calls = 0
# Failed tests of a pytest workload (pytest_plugin.py), by whose failure it is: "workload" (it
# failed in its own code after its kernels compiled, e.g. asserting on numbers a virtual GPU
# does not compute) or "recorder" (it failed before any compile, or inside a library: kernels it
# would have compiled were not recorded).
_failures: dict[str, list[dict]] = {"workload": [], "recorder": []}
_tests: list[dict] = []  # per test of a pytest workload: compiles, checks not made, outcome


def active():
    """The GpuProfile this process answers as, None when it is a real process."""
    return _profile


def compiled(call, function):
    """What cute.compile returns on a virtual GPU (runtime/compile_hook.py): a stub that
    launches nothing, counted for the summary."""
    global _calls
    with _lock:
        _calls += 1
        target = call.target if call is not None else getattr(function, "__name__", "?")
        _compiles[target].add(call.key().id if call is not None else id(function))
        kernels = sum(len(calls) for calls in _compiles.values())
    if sys.stderr.isatty():  # a progress line where someone watches
        print(
            f"\rcute-aot virtual {_profile.name}: {kernels} kernels, last {target}"[:120].ljust(
                120
            ),
            end="",
            file=sys.stderr,
            flush=True,
        )
    return LaunchesNothing(function)


class LaunchesNothing:
    """A compiled function's stand-in: takes any arguments, launches nothing, returns None."""

    def __init__(self, compiled):
        self.__wrapped__ = compiled

    def __call__(self, *args, **kwargs):
        from cute_aot.runtime.capture.virtual import launches

        launches.wrote(args, kwargs)  # a kernel may write any memory it was handed
        return None

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)


def compile_calls() -> int:
    """cute.compile calls made so far in this process."""
    with _lock:
        return _calls


def test_failed(test: str, compiled: int, in_test_code: bool, error: str, site: str) -> str:
    """Count a failed test of the workload: the workload's when it compiled (`compiled` calls)
    and then failed in its own code (`in_test_code`), else the recorder's. Returns which."""
    whose = "workload" if compiled and in_test_code else "recorder"
    with _lock:
        _failures[whose].append({"test": test, "compiled": compiled, "error": error, "site": site})
    return whose


def test_ran(test: str, compiled: int, not_checked: int, outcome: str) -> None:
    """One test of a pytest workload, for the summary: its cute.compile calls, the numeric
    checks it could not make, and its outcome (passed, skipped, or whose failure)."""
    with _lock:
        _tests.append(
            {
                "test": test,
                "compile_calls": compiled,
                "checks_not_made": not_checked,
                "outcome": outcome,
            }
        )


def load_profile(spec: str):
    """CUTE_AOT_VIRTUAL's value -> GpuProfile: a name, an architecture, or a JSON override file."""
    from cute_aot.kernels import gpu_profiles

    if spec.endswith(".json") or os.path.sep in spec:
        try:
            changes = json.loads(open(spec).read())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{settings.VIRTUAL.name}={spec}: cannot read it ({exc})") from exc
        base = gpu_profiles.profile(str(changes.pop("base", "")))
        return gpu_profiles.with_overrides(base, changes)
    return gpu_profiles.profile(spec)


def start(spec: str) -> None:
    """Become the virtual GPU `spec` in this process (capture/activation.py calls it first)."""
    global _profile
    from cute_aot.artifacts.core import at_exit
    from cute_aot.runtime.capture.virtual import caches, driver, torch_device

    with _lock:
        if _profile is not None:
            return
        _profile = load_profile(spec)
        questions.answering_as(_profile.name)
    os.environ["CUTE_DSL_ARCH"] = _profile.arch  # never the DSL's own guess (sm_100)
    caches.isolate()
    torch_device.start(_profile)
    driver.start(_profile)
    at_exit.on_exit(_say_summary)


def summary() -> dict:
    """What this process compiled and could not answer, in an order that does not vary."""
    with _lock:
        return {
            "profile": _profile.describe() if _profile else None,
            "compile_calls": _calls,
            "kernels": sum(len(calls) for calls in _compiles.values()),
            "targets": {target: len(calls) for target, calls in sorted(_compiles.items())},
            "checks_not_made": questions.rows(questions.NOT_CHECKED, CHECK_FIELDS),
            "unanswerable": questions.rows(questions.UNANSWERED, QUESTION_FIELDS),
            "tests": sorted(_tests, key=lambda row: row["test"]),
            "failed_tests": {
                whose: sorted(failed, key=lambda row: row["test"])
                for whose, failed in _failures.items()
            },
        }


def _say_summary() -> None:
    found = summary()
    if sys.stderr.isatty() and found["compile_calls"]:
        print(file=sys.stderr)  # past the progress line
    profile = found["profile"]
    lines = [
        f"cute-aot virtual {profile['profile']} ({profile['arch']}), pid {os.getpid()}: "
        f"{found['compile_calls']} cute.compile calls, {found['kernels']} kernels of "
        f"{len(found['targets'])} targets; {len(found['unanswerable'])} unanswerable "
        "questions" + (":" if found["unanswerable"] else "")
    ]
    lines += [
        f"  {u['site']}: {u['question']} ({u['reason']}) x{u['times']}"
        for u in found["unanswerable"]
    ]
    if found["checks_not_made"]:
        lines.append(
            f"  {sum(c['times'] for c in found['checks_not_made'])} numeric checks not made "
            "(their operands were written on the device), at "
            + ", ".join(f"{c['site']} x{c['times']}" for c in found["checks_not_made"][:5])
            + (" ..." if len(found["checks_not_made"]) > 5 else "")
        )
    workload, recorder = found["failed_tests"]["workload"], found["failed_tests"]["recorder"]
    if workload or recorder:
        lines.append(
            f"  failed tests: {len(workload)} the workload's (after their kernels compiled), "
            f"{len(recorder)} the recorder's (kernels may be missing)" + (":" if recorder else "")
        )
        lines += [f"    {row['test']}: {row['error']} at {row['site']}" for row in recorder]
    print("\n".join(lines), file=sys.stderr)
