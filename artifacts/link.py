"""Link the TVM-FFI objects of one (bundle, architecture) into ONE self-contained shared library.

The library needs only libtvm_ffi at load time: the CuTe DSL's static CUDA-dialect runtime and the
static CUDA runtime are linked in, plus our definition of the single error helper that otherwise
lives in the 43 MB libcute_dsl_runtime.so, and the ops' C hit path (shape_dispatch.c). Only the
`__tvm_ffi_<symbol>` entry points are exported, and for keys of the DSL's C ABI (a recorded
`cute.compile` made without TVM-FFI) their `<symbol>_*` functions and metadata, which
`cute.runtime.load_module` looks up by that prefix.
"""

from __future__ import annotations

import subprocess
from importlib import metadata, resources
from pathlib import Path

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.atomic import scratch_folder
from cute_aot.artifacts.core.errors import BuildError

CUTLASS_CU13_LIBS = "nvidia-cutlass-dsl-libs-cu13"


def _dist_file(dist: str, filename: str) -> Path:
    """A file shipped by an installed distribution, found without importing it."""
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise BuildError(
            f"linking needs the {dist} distribution; install the build extra: "
            "pip install 'cute-aot[build]'"
        ) from None
    for file in files:
        if file.name == filename:
            return Path(file.locate()).resolve()
    raise BuildError(f"{dist} does not ship {filename}")


def link_inputs() -> dict[str, Path]:
    return {
        "dialect_runtime": _dist_file(CUTLASS_CU13_LIBS, "libcuda_dialect_runtime_static.a"),
        "cuda_runtime": _dist_file("nvidia-cuda-runtime", "libcudart_static.a"),
        "tvm_ffi": _dist_file("apache-tvm-ffi", "libtvm_ffi.so"),
        # tvm/ffi/c_api.h, for the ops' C hit path (shape_dispatch.c)
        "tvm_ffi_c_api": _dist_file("apache-tvm-ffi", "c_api.h"),
    }


def version_script(c_abi_symbols: list[str]) -> str:
    """What the library exports: every TVM-FFI entry point, and each C-ABI key's prefix."""
    patterns = ["__tvm_ffi_*"]
    for symbol in c_abi_symbols:
        patterns += [f"{symbol}_*", f"_mlir_{symbol}_*"]
    return "{ global: " + "; ".join(patterns) + "; local: *; };\n"


def link_library(
    objects: list[Path], output: Path | None = None, c_abi_symbols: list[str] = ()
) -> bytes:
    """Link `objects` (in the given order); returns the library's bytes, also written to
    `output` if given. `c_abi_symbols`: the keys exported with the DSL's C ABI."""
    compiler = settings.c_compiler()
    if not compiler:
        raise BuildError("linking needs a C compiler (gcc or cc, or set CC)")
    inputs = link_inputs()
    package = resources.files(__package__)
    with scratch_folder("cute-aot-link") as scratch:
        sources = []
        for name in ("cute_dsl_shim.c", "shape_dispatch.c"):
            sources.append(Path(scratch) / name)
            sources[-1].write_bytes(package.joinpath(name).read_bytes())
        exports = Path(scratch) / "exports.map"
        exports.write_text(version_script(list(c_abi_symbols)))
        tmp_output = Path(scratch) / "library.so"
        command = [
            compiler,
            "-shared",
            "-fPIC",
            "-O2",
            "-o",
            str(tmp_output),
            f"-I{inputs['tvm_ffi_c_api'].parents[2]}",  # <include>/tvm/ffi/c_api.h
            *map(str, objects),
            *map(str, sources),
            str(inputs["dialect_runtime"]),
            str(inputs["cuda_runtime"]),
            str(inputs["tvm_ffi"]),
            "-lpthread",
            "-ldl",
            "-lrt",
            f"-Wl,--version-script={exports}",
            "-Wl,--no-undefined",
            "-Wl,--build-id=sha1",
            # The library finds libtvm_ffi by soname: the server's tvm_ffi has loaded it already.
            "-Wl,-soname,cute_aot_bundle.so",
        ]
        result = subprocess.run(command, capture_output=True, text=True, cwd=scratch)
        if result.returncode != 0:
            what = output.name if output else "the library"
            raise BuildError(f"linking {what} failed:\n{result.stderr.strip()}")
        data = tmp_output.read_bytes()
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_bytes(data)
    return data
