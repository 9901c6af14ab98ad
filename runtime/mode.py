"""Serving modes, by API (`set_mode`) or env (`CUTE_AOT_MODE`).

- auto: bundle -> overlay cache -> JIT compile (warning once per key) -> torch, saying so once
- aot:  prebuilt only; a miss raises (no surprise compiles while serving)
- jit:  always compile (kernel development); bundles and the overlay are ignored
"""

from __future__ import annotations

import enum

from cute_aot.artifacts import settings
from cute_aot.artifacts.errors import CuteAotError

MODE_ENV = settings.MODE.name


class Mode(str, enum.Enum):
    AUTO = "auto"
    AOT = "aot"
    JIT = "jit"


_override: Mode | None = None


def parse_mode(value: str | Mode) -> Mode:
    try:
        return Mode(str(value.value if isinstance(value, Mode) else value).strip().lower())
    except ValueError:
        raise CuteAotError(
            f"unknown cute-aot mode {value!r}; choose one of {', '.join(m.value for m in Mode)}"
        ) from None


def set_mode(mode: str | Mode | None) -> None:
    """Set the process-wide mode (None: back to CUTE_AOT_MODE, default auto)."""
    global _override
    _override = None if mode is None else parse_mode(mode)


def current_mode() -> Mode:
    if _override is not None:
        return _override
    return parse_mode(settings.mode_name() or Mode.AUTO)
