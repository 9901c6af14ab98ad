"""Warnings said once per subject, so a server's log is not flooded on every call."""

from __future__ import annotations

import threading
import warnings

_said: set = set()
_lock = threading.Lock()


def warn_once(subject, message: str) -> bool:
    with _lock:
        if subject in _said:
            return False
        _said.add(subject)
    warnings.warn(f"cute-aot: {message}", RuntimeWarning, stacklevel=3)
    return True


def forget() -> None:
    """Tests: make every notice say itself again."""
    with _lock:
        _said.clear()
