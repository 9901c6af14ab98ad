"""Work a process must do before it ends, whether it exits or is terminated.

`multiprocessing.Pool` ends its workers with SIGTERM, whose default action runs no exit hook:
what a worker still holds in memory (records and misses bound for a URL prefix, its report)
would be lost. `on_exit(hook)` runs the hook at a normal exit and, where SIGTERM still has its
default action, on SIGTERM too; the signal's default action (the process ends, killed by
SIGTERM) follows. A handler the program installed itself is never replaced.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading

__all__ = ["on_exit"]

_hooks: list = []
_lock = threading.RLock()  # re-entered by the SIGTERM handler, which runs on the main thread
_registered = False
_running = False  # the hooks are under way (or done): they run once


def on_exit(hook) -> None:
    """Run `hook()` once when this process exits or is terminated (never twice)."""
    global _registered
    with _lock:
        _hooks.append(hook)
        first, _registered = not _registered, True
    if first:
        _register()
    _catch_sigterm()


def _register() -> None:
    # Before concurrent.futures refuses new work at shutdown: asyncio resolves host names in
    # its executor, so s3fs could not reach a store by name from a plain atexit hook.
    # threading's exit hooks run last registered first: import the executor's hook before ours.
    import concurrent.futures.thread  # noqa: F401

    try:
        threading._register_atexit(_run)
    except (AttributeError, RuntimeError):  # not CPython 3.9+, or the process is exiting
        atexit.register(_run)


def _run() -> None:
    global _running
    with _lock:
        if _running:
            return
        _running = True
        hooks, _hooks[:] = list(_hooks), []
    for hook in hooks:
        try:
            hook()
        except Exception:  # one hook's failure does not cost the others
            pass


def _catch_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; a later call from it will
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated)
    except (ValueError, OSError):
        pass


def _terminated(signum, frame) -> None:
    if _running:
        return  # the process is exiting already (a pool terminates workers that are): let it
    _run()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _after_fork() -> None:
    # A child is another process: it runs only the hooks it registers itself.
    global _lock, _registered, _running
    _lock = threading.RLock()
    _hooks.clear()
    _registered = _running = False


os.register_at_fork(after_in_child=_after_fork)
