"""Under a virtual GPU (CUTE_AOT_VIRTUAL), a workload that is a test suite fails tests that
assert on numbers: a virtual GPU computes none. This plugin (registered for every pytest run, it
does nothing elsewhere) tells those failures apart from the ones that cost kernels: a test that
compiled and then failed in its own code is the workload's; one that failed before any compile,
or inside a library, is the recorder's. The virtual summary counts them apart (runtime/virtual).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cute_aot.runtime.capture import virtual
from cute_aot.runtime.capture.virtual import questions

_STARTED = "_cute_aot_compile_calls"
_UNCHECKED = "_cute_aot_checks_not_made"


def pytest_runtest_setup(item) -> None:
    if virtual.active():
        setattr(item, _STARTED, virtual.compile_calls())
        setattr(item, _UNCHECKED, virtual.checks_not_made())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not virtual.active() or report.when != "call":
        return
    compiled = virtual.compile_calls() - getattr(item, _STARTED, virtual.compile_calls())
    not_checked = virtual.checks_not_made() - getattr(item, _UNCHECKED, 0)
    if not report.failed or call.excinfo is None:
        virtual.test_ran(item.nodeid, compiled, not_checked, report.outcome)
        return
    asked = _where_asked(call.excinfo.traceback)
    site = f"{asked.path}:{asked.lineno + 1}"
    in_test_code = Path(str(asked.path)) == Path(str(item.path))
    error = f"{call.excinfo.typename}: {str(call.excinfo.value)[:200]}"
    whose = virtual.test_failed(item.nodeid, compiled, in_test_code, error, site)
    virtual.test_ran(item.nodeid, compiled, not_checked, f"failed ({whose}'s)")


def _where_asked(traceback):
    """The innermost frame of the failure outside torch, cutlass and cute-aot: the test's own
    line, or the library's."""
    for entry in reversed(traceback):
        if not questions.plumbing(entry.frame.f_globals.get("__name__", "")):
            return entry
    return traceback[-1]
