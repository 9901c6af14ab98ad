"""What a virtual GPU cannot answer, and the checks it cannot make: each named by the question
and the workload's call site that asked, and counted for the summary said at exit."""

from __future__ import annotations

import collections
import functools
import sys
import threading

_lock = threading.Lock()
_gpu_name = "?"  # the profile answering (virtual.start)
UNANSWERED: collections.Counter = collections.Counter()  # (site, question, reason) -> times
NOT_CHECKED: collections.Counter = collections.Counter()  # (site, check) -> times


def answering_as(name: str) -> None:
    """The GPU name the questions of this process are asked of."""
    global _gpu_name
    _gpu_name = name


def rows(counted: collections.Counter, fields: tuple) -> list[dict]:
    """A counter of this module as summary rows, read under its lock."""
    with _lock:
        return counted_rows(dict(counted), fields)


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
        UNANSWERED[site, question, reason] += 1
    return kind(
        f"virtual GPU {_gpu_name}: {question} cannot be answered ({reason}), asked at {site}"
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
        NOT_CHECKED[site, check] += 1


def checks_not_made() -> int:
    """Numeric checks not made so far in this process."""
    with _lock:
        return sum(NOT_CHECKED.values())
