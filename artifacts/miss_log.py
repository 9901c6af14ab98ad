"""Reading the miss log: one JSON object per line, each a kernel a server had to compile.

Servers write it (runtime/misses.py); the build (`aot-build --from-misses`) and the operator
(`aot-cache misses`) read it. The reader lives here, below both, so that neither imports the
other: one reader for the format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# What a line must hold to be a miss; anything else (a torn line of a killed writer, a foreign
# line in a shared log) is skipped.
REQUIRED_FIELDS = frozenset({"family", "key", "arch"})


def read_misses(path: str | os.PathLike) -> list[dict]:
    """Every well-formed miss record of a log, in file order."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and REQUIRED_FIELDS <= set(record):
            records.append(record)
    return records
