"""Activation by the environment: what the installed startup hook runs in every Python process.

The wheel carries `cute-aot-startup.pth` (setup.py puts it at the top of site-packages), which
site runs at interpreter start. It imports this module only when one of the variables that need
the `cute.compile` hook is set (settings.ACTIVATING, which it names: a test keeps the two equal),
so any other process pays one environment lookup per name. `activate()` then does nothing if
CUTE_AOT_DISABLE is set or CUTE_AOT_INTERCEPT is not a true value alone. When it is wanted, the
hook is installed the moment `cutlass` is first imported (a finder on sys.meta_path runs it right
after `cutlass/__init__` has executed), or at once where cutlass is already imported. So an
unmodified program, and every process it starts (spawn, forkserver, subprocess, pytest-xdist
workers: each runs site again; fork children inherit the hook), records or is served from its first
compile. Neither cutlass nor torch is imported here.

cute-aot's own tools (aot-build, aot-tune) run under `settings.tool_process()`, which sets
CUTE_AOT_DISABLE=1: their compiles, and those of every process they start, are never recorded
nor served (the cute.compile hook, if already installed, lets them through).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import threading

from cute_aot.artifacts.core import settings
from cute_aot.runtime.capture.import_hook import after_import

__all__ = ["activate", "state"]

STARTUP_FILE = "cute-aot-startup.pth"
_lock = threading.RLock()
_installed = False  # the cute.compile hook and what the variables ask of it, in this process
_activated = False  # activate() has run here (the hook waits for cutlass, or is installed)
_refused = False  # the environment held a value activation cannot take: off, said once


def state() -> tuple[bool, str]:
    """(whether this environment activates the hook, why), for `aot-cache env`."""
    wanted = settings.activating()
    if settings.disabled():
        return False, f"{settings.DISABLE.name}=1"
    if not wanted:
        return False, "no activation variable set (" + ", ".join(
            s.name for s in settings.ACTIVATING
        ) + ")"
    return True, ", ".join(wanted) + " set"


def startup_file() -> str | None:
    """Where the startup hook is installed (a site directory's .pth), None if in none."""
    import site

    folders = [*site.getsitepackages(), site.getusersitepackages()]
    for folder in folders:
        candidate = os.path.join(folder, STARTUP_FILE)
        if os.path.isfile(candidate):
            return candidate
    return None


def activate() -> None:
    """Install the cute.compile hook now or when cutlass is imported, if the environment asks;
    first become a virtual GPU where CUTE_AOT_VIRTUAL names one (before torch is imported).
    Never stops the interpreter (the startup hook runs in every Python process, pip's too): a
    value it cannot take is one line on stderr, and the process runs on without cute-aot."""
    global _refused
    if _refused:
        return
    try:
        _activate()
    except Exception as exc:
        _refused = True
        print(f"cute-aot: {exc}; cute-aot is off in this process", file=sys.stderr)


def _activate() -> None:
    global _activated
    active, _ = state()
    if not active:
        return
    with _lock:
        if _activated:
            return
        _activated = True
        if settings.virtual_profile():
            _start_virtual(settings.virtual_profile())
        after_import("cutlass", _install)
        # Asked at exit, not now: site may not have put cutlass-dsl on sys.path yet (its own
        # .pth runs after this one).
        atexit.register(_say_if_cutlass_missing)


def _start_virtual(spec: str) -> None:
    from cute_aot.runtime.capture import virtual

    try:
        virtual.start(spec)
    except Exception as exc:  # a profile that does not exist: said once, then off (activate)
        raise ValueError(f"{settings.VIRTUAL.name}={spec}: {exc}") from exc


def _say_if_cutlass_missing() -> None:
    if not _installed and state()[0] and importlib.util.find_spec("cutlass") is None:
        _warn(
            f"{state()[1]}, but nvidia-cutlass-dsl is not installed in this environment: "
            "no cute.compile call could be recorded or served"
        )


def _install() -> None:
    """The hook and what each variable asks of it; a failure is one warning, never the caller's
    import error (the program runs on as it would without cute-aot)."""
    global _installed
    with _lock:
        if _installed or not state()[0]:
            return
        _installed = True
        try:
            from cute_aot.runtime import compile_hook
            from cute_aot.runtime.capture import virtual

            compile_hook.install_hook()
            if virtual.active():
                compile_hook.on_virtual_gpu(virtual.compiled)
            if settings.record_location():
                from cute_aot.runtime.capture.record import record_from_env

                record_from_env()
            if settings.intercept() and virtual.active():
                _warn(
                    f"{settings.INTERCEPT.name}=1 on a virtual GPU ({settings.VIRTUAL.name}): "
                    "nothing is served, every compile is recorded"
                )
            elif settings.intercept():
                compile_hook.intercept()
                if not _bundles_named():
                    _warn(
                        f"{settings.INTERCEPT.name}=1, but no bundle is named "
                        f"({settings.BUNDLES.name} is unset) nor installed: every cute.compile "
                        "call misses"
                    )
            if settings.report_file():
                from cute_aot.runtime.capture import report

                report.write_at_exit()
        except Exception as exc:
            _warn(
                f"the cute.compile hook could not be installed ({type(exc).__name__}: {exc}); "
                "kernels compile as without cute-aot"
            )


def _bundles_named() -> bool:
    from cute_aot.runtime.sources import environment_sources

    try:
        return bool(environment_sources())
    except Exception:
        return True  # unknown: no warning


def _warn(message: str) -> None:
    from cute_aot.artifacts.core.notices import warn_once

    warn_once(("activation", message), message)
