"""Router GEMM, CuTe DSL part: compile a key for an architecture (build machines and JIT only)."""

from __future__ import annotations

from cute_aot.kernels.router_gemm import RouterGemmKey


def compile(key: RouterGemmKey, arch: str):
    """Cross-compile `key` for `arch` with TVM-FFI; the result exports with `export_to_c`.

    The exported function takes (x, w, out) and launches on the caller's current torch stream.
    """
    if key.backend == "dot":
        from cute_aot.kernels.router_gemm.dot_product import compile_dot_product

        return compile_dot_product(key.m, key.k, key.block_size, key.pdl, arch)
    if key.backend == "splitk":
        from cute_aot.kernels.router_gemm.split_k import compile_split_k

        return compile_split_k(key.split_k, key.num_stages, key.pdl, arch)
    raise ValueError(f"router_gemm key {key.id} has unknown backend {key.backend!r}")
