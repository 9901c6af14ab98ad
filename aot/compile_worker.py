"""What runs inside a compile worker process: one key for one architecture -> one object file.

cute.compile is a process-wide singleton and not thread-safe, so parallelism is processes.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from cute_aot.aot.binary_info import inspect_object
from cute_aot.artifacts.export import export_object
from cute_aot.kernels import family


def compile_to_object(family_name: str, key_fields: dict, arch: str, out_dir: str) -> dict:
    """Compile and export one key; returns a report row (never raises: errors are data here)."""
    started = time.perf_counter()
    key = family(family_name).Key.from_fields(key_fields)
    row = {"family": family_name, "key_id": key.id, "symbol": key.symbol, "arch": arch}
    try:
        compiled = family(family_name).compile(key, arch)
        exported = export_object(compiled, key, out_dir)
    except Exception as exc:  # reported with its key; the build decides what failure means
        row.update(
            status="failed",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            seconds=time.perf_counter() - started,
        )
        return row
    row.update(
        status="ok",
        **exported,
        # Registers, shared memory, SASS mix (cuobjdump/nvdisasm, when installed): known here
        # only, since linking renames the local symbol that marks each kernel's fatbin.
        gpu_binary=inspect_object(Path(exported["object"])),
        seconds=time.perf_counter() - started,
    )
    return row
