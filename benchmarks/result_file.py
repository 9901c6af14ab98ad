"""The one way a benchmark hands back its result: printed as JSON, and written to `--out` too
where given (its folder made), indented, for benchmarks/results/ and docs/results.md."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, out_path: Path | None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text + "\n")
