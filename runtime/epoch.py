"""The resolution epoch: one counter that every load, clear and mode change moves.

Every cache of resolutions (an op's shape table and its C table, a served library's lookups)
remembers the epoch it was filled in and is empty again once the epoch has moved: nothing needs
to be told, so there is no list of callbacks to register, leak or forget to unregister. A
resolution computed while the epoch moved (a load during a slow JIT compile) is never remembered.

The hit path reads `GENERATION[0]`: one list index, no call.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

GENERATION = [0]
_lock = threading.Lock()


def current() -> int:
    return GENERATION[0]


def advance() -> int:
    """Move the epoch: every resolution remembered so far is stale from now on."""
    with _lock:
        GENERATION[0] += 1
        return GENERATION[0]


class Resolutions:
    """A dict of resolutions valid for one epoch, for code that keeps its own (a served library's
    lookups): `get` answers MISSING once the epoch has moved; `put` keeps a value only if the
    epoch it was computed in is still the current one."""

    MISSING: Any = object()

    def __init__(self) -> None:
        self._epoch = current()
        self._values: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    # The epoch to pass to `put` for a value computed from now on (for code that holds a
    # Resolutions but does not import this module).
    now = staticmethod(current)

    def get(self, key: Hashable) -> Any:
        values = self._values if self._epoch == GENERATION[0] else {}
        return values.get(key, self.MISSING)

    def put(self, key: Hashable, value: Any, computed_in: int) -> None:
        with self._lock:
            if computed_in != GENERATION[0]:
                return
            if self._epoch != computed_in:
                self._values, self._epoch = {}, computed_in
            self._values[key] = value
