"""A virtual GPU: an unmodified workload records its CuTe DSL kernels for a GPU that is not there.

    CUTE_AOT_VIRTUAL=b200 CUTE_AOT_RECORD=records/ python -m pytest flashinfer_tests/...
    aot-build --from-record records/ --arch sm100a           # on the same CPU-only machine

CUTE_AOT_VIRTUAL names a profile of kernels/gpu_profiles.json (`h200`, `b200`), an architecture
(its reference profile: `sm_100a` is `b200`), or a JSON file `{"base": "b200", "attributes":
{...}, "max_active_clusters": {...}}` that overrides answers. The startup hook
(runtime/activation.py) starts it in every process of the workload, before the workload runs:

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
import functools
import json
import os
import sys
import threading

from cute_aot.artifacts import settings

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
_unanswered: collections.Counter = collections.Counter()  # (site, question, reason) -> times
_compiles: dict[str, set] = collections.defaultdict(set)  # target -> distinct calls compiled
_calls = 0
_not_checked: collections.Counter = collections.Counter()  # (site, check) -> times
# Failed tests of a pytest workload (pytest_plugin.py), by whose failure it is: "workload" (it
# failed in its own code after its kernels compiled, e.g. asserting on numbers a virtual GPU
# does not compute) or "recorder" (it failed before any compile, or inside a library: kernels it
# would have compiled were not recorded).
_failures: dict[str, list[dict]] = {"workload": [], "recorder": []}
_tests: list[dict] = []  # per test of a pytest workload: compiles, checks not made, outcome


class Unanswerable(RuntimeError):
    """A question the virtual GPU has no true answer for; says what was asked, and where."""


class UnansweredAttribute(Unanswerable, AttributeError):
    """A device property the profile does not hold (hasattr() is False, as for a missing one)."""


# Frames of these packages are how a question reaches us, not where the workload asked it.
_PLUMBING = ("torch", "cuda", "cutlass", "tvm_ffi", "importlib", "contextlib")


def plumbing(module: str) -> bool:
    """Whether code of `module` is how a question reaches us rather than where it was asked."""
    return module.split(".")[0] in _PLUMBING or module.startswith("cute_aot.runtime")


def _workload_frame():
    """The first frame outside torch, the driver bindings, cutlass and cute-aot (None: none)."""
    frame = sys._getframe(2)
    while frame is not None and plumbing(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    return frame


def asked_at() -> str:
    """file:line of the workload's frame that asked."""
    frame = _workload_frame()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def in_assert() -> bool:
    """Whether the truth value being asked decides an assertion in the workload's own frame: a
    jump taken when it is true over code that raises AssertionError (an `assert` statement, as
    Python compiles it or as pytest rewrites it), reached from the value itself or from a call
    whose result it tests (`assert torch.equal(a, b)`)."""
    frame = _workload_frame()
    return frame is not None and _skips_a_raise(frame.f_code, frame.f_lasti)


@functools.cache
def _skips_a_raise(code, offset: int) -> bool:
    import dis

    instructions = list(dis.get_instructions(code))
    at = next((n for n, i in enumerate(instructions) if i.offset == offset), None)
    if at is None:
        return False
    jump = instructions[at]
    if jump.opname.startswith("CALL"):  # `assert torch.equal(a, b)`: the call's value is tested
        jump = _test_of_result(instructions[at + 1 :])
    if jump is None or "IF_TRUE" not in jump.opname or not isinstance(jump.argval, int):
        return False
    offset = jump.offset
    skipped = [i for i in instructions if offset < i.offset < jump.argval]
    loads_error = any(
        i.opname == "LOAD_ASSERTION_ERROR" or i.argval == "AssertionError" for i in skipped
    )
    return loads_error and any(i.opname == "RAISE_VARARGS" for i in skipped)


def _test_of_result(following) -> object:
    """The jump that tests a call's result, if the result goes straight to one: directly, through
    TO_BOOL, or through a temporary (how pytest rewrites an assert); None otherwise."""
    rest = [i for i in following if i.opname not in ("CACHE", "EXTENDED_ARG", "TO_BOOL")]
    if len(rest) > 2 and rest[0].opname == "STORE_FAST" and rest[1].opname == "LOAD_FAST":
        if rest[0].argval == rest[1].argval:
            rest = rest[2:]
    return rest[0] if rest else None


def unanswerable(question: str, reason: str, kind=Unanswerable) -> Unanswerable:
    """The error to raise for `question`, counted with its site for the summary."""
    site = asked_at()
    with _lock:
        _unanswered[site, question, reason] += 1
    return kind(
        f"virtual GPU {_profile.name if _profile else '?'}: {question} cannot be "
        f"answered ({reason}), asked at {site}"
    )


# What a counted subject is made of, in the summary's rows (each with its "times").
QUESTION_FIELDS = ("site", "question", "reason")
CHECK_FIELDS = ("site", "check")


def counted_rows(counted: dict, fields: tuple) -> list[dict]:
    """{(value of each field): times} as rows {field: value, ..., "times": n}, in order."""
    return [
        {**dict(zip(fields, subject, strict=True)), "times": n}
        for subject, n in sorted(counted.items())
    ]


def check_not_made(check: str) -> None:
    """A numeric check of values nobody computed: counted with its site, not made."""
    site = asked_at()
    with _lock:
        _not_checked[site, check] += 1


def checks_not_made() -> int:
    """Numeric checks not made so far in this process."""
    with _lock:
        return sum(_not_checked.values())


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
        from cute_aot.runtime.virtual import launches

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
    """Become the virtual GPU `spec` in this process (runtime/activation.py calls it first)."""
    global _profile
    from cute_aot.runtime import at_exit
    from cute_aot.runtime.virtual import caches, driver, torch_device

    with _lock:
        if _profile is not None:
            return
        _profile = load_profile(spec)
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
            "checks_not_made": counted_rows(_not_checked, CHECK_FIELDS),
            "unanswerable": counted_rows(_unanswered, QUESTION_FIELDS),
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
