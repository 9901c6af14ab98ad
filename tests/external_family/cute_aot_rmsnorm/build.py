"""RMSNorm, CuTe DSL part: compile a key for an architecture (build machines and JIT only)."""

from __future__ import annotations

from cute_aot_rmsnorm import DTYPE, RMSNormKey


def compile(key: RMSNormKey, arch: str):
    """Cross-compile `key` for `arch` with TVM-FFI; the result exports with `export_to_c`.

    The exported function takes (x, weight, out), the family's ABI order, and launches on the
    caller's current torch stream.
    """
    if key.dtype != DTYPE:
        raise ValueError(f"rmsnorm key {key.id}: only {DTYPE} is implemented, not {key.dtype}")
    from cute_aot_rmsnorm.kernel import compile_rmsnorm  # imports cutlass

    return compile_rmsnorm(key.n, key.eps, key.block_size, arch)
