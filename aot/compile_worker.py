"""What runs inside a compile worker process: one key for one architecture -> one object file.

cute.compile is a process-wide singleton and not thread-safe, so parallelism is processes.
"""

from __future__ import annotations

import hashlib
import os
import time
import traceback
from pathlib import Path

from cute_aot.aot.binary_info import inspect_object
from cute_aot.kernels import family


def export_object(compiled, key, out_dir: str | Path) -> dict:
    """Export a compiled kernel as `<out_dir>/<symbol>.o` (atomically); its path, sha256, size."""
    target = Path(out_dir) / f"{key.symbol}.o"
    tmp = Path(out_dir) / f".{key.symbol}.{os.getpid()}.tmp.o"
    try:
        if key.abi == "c":
            _export_c_abi(compiled, key.symbol, tmp)
        else:
            compiled.export_to_c(
                str(tmp), function_name=key.symbol, export_only_tvm_ffi_symbols=True
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    data = target.read_bytes()
    return {"object": str(target), "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _export_c_abi(compiled, symbol: str, target: Path) -> None:
    """The DSL's C-ABI export (functions and metadata under the prefix `symbol`) into `target`.

    It writes `<name>.h` and `<name>.o` into a folder; the object is made by the DSL's JIT
    linker, which must resolve the CUDA calls against libcute_dsl_runtime.so: loaded
    globally here, since a CPU-only machine has no CUDA library that would provide them."""
    import ctypes
    import tempfile

    from cutlass.runtime import find_runtime_libraries

    for library in find_runtime_libraries(enable_tvm_ffi=False):
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        compiled.export_to_c(folder, "kernel", function_prefix=symbol)
        os.replace(Path(folder) / "kernel.o", target)


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
