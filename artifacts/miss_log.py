"""Reading miss logs: one JSON object per line, each a kernel a server had to compile.

Servers write them (runtime/misses.py); the build (`aot-build --from-misses`) and the operator
(`aot-cache misses`) read them, through the one JSON-lines reader (artifacts/json_lines.py),
which lives below both so that neither imports the other. A source is a log file (its rotated
generation `<log>.1` first), a folder, or a URL prefix of any fsspec protocol, where each server
process writes a file of its own: every `*.jsonl` under it is read, in name order.
"""

from __future__ import annotations

import os

from cute_aot.artifacts.json_lines import read_objects

# What a line must hold to be a miss; an object without them (a foreign line in a shared log)
# is skipped.
REQUIRED_FIELDS = frozenset({"family", "key", "arch"})


def read_misses(source: str | os.PathLike) -> list[dict]:
    """Every well-formed miss record of a log file, a folder or a URL prefix, in file order."""
    return [record for _, record in read_objects(source) if REQUIRED_FIELDS <= set(record)]
