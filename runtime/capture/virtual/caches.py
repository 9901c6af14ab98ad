"""The libraries' own caches, apart for a virtual GPU's process.

Under a virtual GPU a library's disk cache would keep objects compiled for a GPU that is not
there, and its autotuner's files choices timed on stubs. Each variable below points one of those
caches into a folder of this process, removed when it ends; a process it starts makes its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from cute_aot.artifacts.core.atomic import temporary_name

# Each library's cache location, as the library reads it from the environment.
CACHE_VARIABLES = (
    "FLASHINFER_WORKSPACE_BASE",  # FlashInfer: JIT modules, CuTe DSL objects, autotune results
    "FLASHINFER_AUTOTUNE_DIR",  # FlashInfer: calibration files of its tuners
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",  # flash-attention's CuTe DSL cache
    "CUTE_DSL_CACHE_DIR",  # cutlass-dsl's own file cache
    "QUACK_CACHE_DIR",  # quack's compiled objects
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "XDG_CACHE_HOME",  # what the others fall back on (~/.cache)
)
# Caches that would hand back a real function: FlashInfer's CuTe DSL disk cache and quack's
# `.o` cache export what cute.compile returned and load it again through TVM-FFI, which a
# virtual GPU cannot run. Off, so that the workload calls what cute.compile returned (a stub).
CACHES_OFF = {"FLASHINFER_CUTE_DSL_DISABLE_CACHE": "1", "QUACK_CACHE_ENABLED": "0"}


def isolate() -> str:
    """Point every cache variable into a new folder of this process; returns the folder."""
    from cute_aot.artifacts.core.at_exit import on_exit

    # Named as every scratch folder is: a killed process's is removed by the next build.
    folder = os.path.join(tempfile.gettempdir(), temporary_name("cute-aot-virtual", folder=True))
    os.mkdir(folder, 0o700)
    for name in CACHE_VARIABLES:
        os.environ[name] = os.path.join(folder, name.lower())
    os.environ.update(CACHES_OFF)
    on_exit(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder
