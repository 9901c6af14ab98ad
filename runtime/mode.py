"""Serving modes, by API (`set_mode`) or env (`CUTE_AOT_MODE`).

- auto: bundle -> overlay cache -> JIT compile (warning once per key) -> torch, saying so once
- aot:  prebuilt only; a miss raises (no surprise compiles while serving)
- jit:  always compile (kernel development); bundles and the overlay are ignored

The order and what counts as a failure to fall past live in runtime/policy.py. Any change of the
mode moves the resolution epoch (runtime/epoch.py), so no op keeps serving what an earlier mode
chose: `set_mode` at once, a changed `CUTE_AOT_MODE` at the next resolution of any shape (the
hit path never reads the environment: that costs as much as the call).
"""

from __future__ import annotations

import enum
import threading

from cute_aot.artifacts.core import settings
from cute_aot.runtime import epoch


class Mode(str, enum.Enum):
    AUTO = "auto"
    AOT = "aot"
    JIT = "jit"


_BY_WORD = {mode.value: mode for mode in Mode}  # a dict read: Mode(word) costs ~1 µs per call
_lock = threading.Lock()
_seen: list = [None]  # the mode last answered: a different answer moves the epoch


def parse_mode(value: str | Mode) -> Mode:
    """A mode given by the API, read by CUTE_AOT_MODE's own grammar (artifacts/core/settings.py)."""
    if isinstance(value, Mode):
        return value
    return Mode(settings.MODE.parse(str(value), "mode"))


def set_mode(mode: str | Mode | None) -> None:
    """Set the process-wide mode (None: back to CUTE_AOT_MODE, default auto); every op resolves
    its shapes again under it. The mode lives where every setting does: this sets CUTE_AOT_MODE
    for the process (artifacts/core/settings.py)."""
    parsed = None if mode is None else parse_mode(mode)
    with _lock:
        settings.set_in_process(settings.MODE.name, None if parsed is None else parsed.value)
        _seen[0] = None  # the epoch moves here; the next answer is then the one seen
        epoch.advance()


def current_mode() -> Mode:
    mode = _BY_WORD[settings.MODE.value()]
    if _seen[0] is not mode:
        with _lock:
            if _seen[0] is not mode:
                moved = _seen[0] is not None
                _seen[0] = mode
                if moved:
                    epoch.advance()
    return mode
