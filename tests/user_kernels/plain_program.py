"""An unmodified program: it compiles the user kernel (tests/user_kernels/scale.py) with
`cute.compile` and imports nothing of cute-aot. Whatever cute-aot does to it, the environment
alone asks (the startup hook). Tensors are the DSL's fake tensors (no GPU, no data), compiled for
sm_90a with TVM-FFI; nothing is launched.

    python -m tests.user_kernels.plain_program 128 256          # one process
    python -m tests.user_kernels.plain_program --pool 4 128 256  # a spawn pool of 4 compiles them
    python -m tests.user_kernels.plain_program --pool 4 --start fork 128 256  # or forkserver
    python -m tests.user_kernels.plain_program --in-main 128     # a kernel of __main__'s own

Prints one JSON line per block: {"block": B, "type": what cute.compile returned, "pid": P}.
"""

import json
import multiprocessing
import os
import sys

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

from tests.user_kernels.scale import scale


@cute.jit
def scale_in_main(
    x: cute.Tensor, y: cute.Tensor, factor: cutlass.Float32, stream, block: cutlass.Constexpr = 128
):
    scale(x, y, factor, stream, block)


def compile_block(block: int, in_main: bool = False) -> dict:
    n = cute.sym_int()
    x, y = (make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16) for _ in range(2))
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    target = scale_in_main if in_main else scale
    options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
    compiled = options(target, x, y, 2.0, stream, block=block)
    return {"block": block, "type": type(compiled).__name__, "pid": os.getpid()}


def main(argv: list[str]) -> None:
    pool, start, in_main = 0, "spawn", False
    if argv[:1] == ["--pool"]:
        pool, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--start"]:
        start, argv = argv[1], argv[2:]
    if argv[:1] == ["--in-main"]:
        in_main, argv = True, argv[1:]
    blocks = [int(block) for block in argv]
    if pool:
        with multiprocessing.get_context(start).Pool(pool) as workers:
            results = workers.map(compile_block, blocks)
    else:
        results = [compile_block(block, in_main) for block in blocks]
    for result in results:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
