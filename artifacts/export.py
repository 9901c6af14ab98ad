"""A compiled kernel -> one object file: the first step of packing, on a build machine or on a
server's JIT miss alike."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cute_aot.artifacts.core.atomic import scratch_folder, temporary_name


def export_object(compiled, key, out_dir: str | Path) -> dict:
    """Export a compiled kernel as `<out_dir>/<symbol>.o` (atomically); its path, sha256, size."""
    target = Path(out_dir) / f"{key.symbol}.o"
    tmp = Path(out_dir) / temporary_name(f".{key.symbol}.o")
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

    from cutlass.runtime import find_runtime_libraries

    for library in find_runtime_libraries(enable_tvm_ffi=False):
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    with scratch_folder("cute-aot-export", parent=target.parent) as folder:
        compiled.export_to_c(str(folder), "kernel", function_prefix=symbol)
        os.replace(Path(folder) / "kernel.o", target)
