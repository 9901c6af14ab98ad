"""Stopping a command: SIGTERM and SIGINT unwind `aot-build` (and `merge`) as `Stopped`, so its
compile workers are killed and its scratch removed; a second signal ends the process at once."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import click

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived: the command unwinds (its compile workers are killed, scratch
    removed, no bundle half-written). A KeyboardInterrupt, so no `except Exception` keeps going."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def stop_on_signals(ctx: click.Context) -> None:
    """Raise Stopped on SIGTERM and SIGINT until the command ends; a second one ends the process
    at once (the default), e.g. if cleaning up hangs."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers belong to the main thread; left as they are

    def stop(signum, frame):
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        raise Stopped(signum)

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    ctx.call_on_close(lambda: [signal.signal(n, handler) for n, handler in previous.items()])
