"""Work a process must do before it ends, whether it exits or is terminated.

`multiprocessing.Pool` ends its workers with SIGTERM, whose default action runs no exit hook:
what a worker still holds in memory (records and misses bound for a URL prefix, its report)
would be lost. `on_exit(hook)` runs the hook at a normal exit and, where SIGTERM still has its
default action, on SIGTERM too; the signal's default action (the process ends, killed by
SIGTERM) follows. A handler the program installed itself is never replaced.

A Python signal handler runs on the main thread, between bytecodes. A SIGTERM that the kernel
hands to another thread (a library's native thread) while the main thread waits in C (a pool
worker waiting for its queue's lock, which a worker killed first may hold for ever) would never
run it, nor end the process: the pool's `terminate()` would wait for ever. So CPython's wakeup
fd (it writes each caught signal's number there, from whichever thread took the signal) is read
by a watcher thread: if the main thread has not taken the hooks on within GRACE_S, the watcher
runs them and ends the process itself (exit status 128 + SIGTERM, as a shell reports a SIGTERM).
A program that set a wakeup fd of its own (an asyncio loop) keeps it, and then only the handler
runs.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time

__all__ = ["on_exit"]

GRACE_S = 0.5  # the main thread's handler, where the main thread runs Python, goes first

_hooks: list = []
_lock = threading.RLock()  # re-entered by the SIGTERM handler, which runs on the main thread
_registered = False
_running = False  # the hooks are under way (or done): they run once
_wakeup: tuple[int, int] | None = None  # (read, write) ends of the watched wakeup fd


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


def _claim() -> bool:
    """True for the one caller that runs the hooks (exit, handler or watcher, whichever first)."""
    global _running
    with _lock:
        if _running:
            return False
        _running = True
        return True


def _run_hooks() -> None:
    with _lock:
        hooks, _hooks[:] = list(_hooks), []
    for hook in hooks:
        try:
            hook()
        except Exception:  # one hook's failure does not cost the others
            pass


def _run() -> None:
    if _claim():
        _run_hooks()


def _catch_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; a later call from it will
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated)
        if signal.getsignal(signal.SIGTERM) is _terminated and _wakeup is None:
            _watch_wakeups()
    except (ValueError, OSError):
        pass


def _terminated(signum, frame) -> None:
    """The SIGTERM handler, on the main thread: the hooks, then the signal's default action."""
    if not _claim():
        return  # the process is exiting already, or the watcher has the hooks in hand
    _run_hooks()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _watch_wakeups() -> None:
    global _wakeup
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous != -1:  # the program's own: it keeps it
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return
    _wakeup = (read, write)
    threading.Thread(target=_watch, args=(read,), name="cute-aot-sigterm", daemon=True).start()


def _watch(read: int) -> None:
    while True:
        try:
            taken = os.read(read, 512)  # the numbers of the signals caught, a byte each
        except OSError:
            return
        if not taken:
            return
        if signal.SIGTERM in taken:
            time.sleep(GRACE_S)
            if _claim():  # the main thread did not: it waits in C, and would for ever
                _run_hooks()
                os._exit(128 + signal.SIGTERM)
            return


def _after_fork() -> None:
    # A child is another process: it runs only the hooks it registers itself, and the wakeup
    # fd it shares with its parent is let go (the watcher thread stayed in the parent).
    global _lock, _registered, _running, _wakeup
    _lock = threading.RLock()
    _hooks.clear()
    _registered = _running = False
    if _wakeup is not None:
        read, write = _wakeup
        _wakeup = None
        try:
            previous = signal.set_wakeup_fd(-1)
            if previous not in (-1, write):  # the program's own since: it keeps it
                signal.set_wakeup_fd(previous)
        except ValueError:  # forked from another thread: not this thread's to set
            pass
        for end in (read, write):
            os.close(end)


os.register_at_fork(after_in_child=_after_fork)
