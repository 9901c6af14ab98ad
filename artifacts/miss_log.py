"""Reading miss logs: one JSON object per line, each a kernel a server had to compile.

Servers write them (runtime/misses.py); the build (`aot-build --from-misses`) and the operator
(`aot-cache misses`) read them, through the one JSON-lines reader (artifacts/core/json_lines.py),
which lives below both so that neither imports the other. A source is a log file (its rotated
generation `<log>.1` first), a folder, or a URL prefix of any fsspec protocol, where each server
process writes a file of its own: every `*.jsonl` under it is read, in name order.

MISS_SCHEMA is what a miss line holds, checked where every reader reads it (`read_misses`): a
line of another shape is skipped with one warning naming its file, line and field.
"""

from __future__ import annotations

import os

from cute_aot.artifacts.core.json_lines import Field, LineSchema, read_lines

_SCALARS = (str, int, float, bool, type(None))


def _check_key_fields(fields: dict) -> None:
    """A key's fields are scalars (kernels/keys.py): anything else is no key of any family."""
    for name, value in fields.items():
        if not isinstance(value, _SCALARS):
            raise TypeError(f"key field {name!r} is {type(value).__name__}, not a scalar")


# The fields a reader reads (runtime/misses.py writes them; `aot-cache misses --out` writes the
# first four): which fields a key has, per family, is its Key's to say (Key.from_fields).
MISS_SCHEMA = LineSchema(
    "miss log",
    {
        "family": Field((str,)),
        "key": Field((dict,), check=_check_key_fields),
        "arch": Field((str,)),
        "key_id": Field((str,), required=False),
        "host": Field((str,), required=False),
        "time": Field((str,), required=False),
        "problem": Field((dict,), required=False),
    },
)


def read_misses(source: str | os.PathLike) -> list[dict]:
    """Every well-formed miss record of a log file, a folder or a URL prefix, in file order."""
    return [record for _, record in read_lines(source, MISS_SCHEMA)]
