"""cute-aot's commands run as a user runs them: a fresh interpreter with this repository on its
path, none of this process's CUTE_AOT_* variables, and the cache dir the test gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def aot_build(cwd: Path, *args, cache_dir: Path, timeout: int = 900, **env: str):
    """`aot-build ARGS` in `cwd` (a CompletedProcess, output captured as text)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    clean.update(PYTHONPATH=path, CUTE_AOT_CACHE_DIR=str(cache_dir), **env)
    return subprocess.run(
        [sys.executable, "-m", "cute_aot.aot.cli", *map(str, args)],
        env=clean,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
