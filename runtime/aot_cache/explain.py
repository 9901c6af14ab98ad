"""Where a problem's kernel would come from, and why: the logic behind `aot-cache explain`.

Follows Registry.resolve step by step (mode, bundle search order, signature policy, compatibility,
staleness, overlay, JIT) over manifests read as data: it never imports cutlass, never loads a library and needs no GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

from cute_aot.artifacts.errors import CuteAotError
from cute_aot.artifacts.manifest import Manifest
from cute_aot.kernels import family as family_module
from cute_aot.kernels.arch import arch_family
from cute_aot.runtime import loader, misses, overlay
from cute_aot.runtime.jit import jit_available
from cute_aot.runtime.mode import Mode
from cute_aot.runtime.registry import stale_reasons

# (bundle path, whether it came from a folder, its manifest or why it could not be read)
BundleSource = tuple[Path, bool, "Manifest | str"]


def _table_row(rows: list[dict], m: int, k: int, n: int) -> dict | None:
    return next((r for r in rows if r["k"] == k and r["n"] == n and m in r["m"]), None)


def router_gemm_reason(problem: tuple[int, ...], arch: str, key) -> str:
    """Why router_gemm's dispatch chose `key`, in terms of its tuned tables."""
    from cute_aot.kernels.router_gemm import tuned_tables

    m, k, n = problem
    tables = tuned_tables()
    defaults, table_name = tables["defaults"], arch_family(arch)
    table = tables[table_name]
    if key.backend == "dot":
        if m <= defaults["dot_max_m"]:
            rule = f"M={m} <= dot_max_m={defaults['dot_max_m']}"
        else:
            rule = f"K={k} < dot_below_k={defaults['dot_below_k']}"
        row = _table_row(table["dot_block_size"], m, k, n)
        if row:
            tactic = (
                f"{table_name} table row (K={k}, N={n}, M in {row['m']}): block {row['block_size']}"
            )
        else:
            tactic = f"no {table_name} table row for (K={k}, N={n}, M={m}): default block {defaults['block_size']}"
        return f"{rule} -> dot-product kernel (M, K compiled in); {tactic}"
    row = _table_row(table["split_k"], m, k, n)
    if row:
        tactic = (
            f"{table_name} table row (K={k}, N={n}, M in {row['m']}): "
            f"split_k={row['split_k']}, stages={row['num_stages']}"
        )
    else:
        tactic = (
            f"no {table_name} table row for (K={k}, N={n}, M={m}): defaults "
            f"split_k={defaults['split_k']}, stages={defaults['num_stages']}"
        )
    return (
        f"M={m} > dot_max_m={defaults['dot_max_m']} and K={k} >= dot_below_k="
        f"{defaults['dot_below_k']} -> cluster split-K kernel (sizes symbolic); {tactic}"
    )


# family -> why its dispatch rule picked a key; families without one get a plain statement.
DISPATCH_REASONS: dict[str, Callable] = {"router_gemm": router_gemm_reason}


def explain(
    family_name: str,
    problem: tuple[int, ...],
    dtypes: tuple[str, str],
    arch: str,
    mode: Mode,
    bundles: list[BundleSource],
) -> dict:
    """Dispatch decision, key, and source (bundle | overlay | jit | error) with the reason."""
    key = family_module(family_name).dispatch(*problem, arch, *dtypes)
    reason = DISPATCH_REASONS.get(family_name)
    decision = {
        "arch": arch,
        "key_id": key.id,
        "symbol": key.symbol,
        "key": key.fields(),
        "describe": key.describe(),
        "dispatch": reason(problem, arch, key) if reason else f"{family_name}.dispatch rule",
        "source": None,
        "path": None,
        "why": "",
        "notes": [],
    }
    if mode is Mode.JIT:
        why = "mode jit compiles every kernel in the process; bundles and the overlay are ignored"
        return {**decision, "source": "jit", "why": why}
    found, searched = _search_bundles(family_name, key, arch, mode, bundles, decision["notes"])
    if searched:
        where = f"searched {searched} usable {arch} bundle(s)"
        missing = f"none of the {searched} usable {arch} bundle(s) holds the key"
    else:
        where = missing = f"no usable {arch} bundle"
    if found:
        path, entry = found
        why = (
            f"entry {entry.symbol} of the first loaded {arch} bundle that holds the key "
            f"({where}; manifests only: `aot-cache verify` checks the hashes)"
        )
        return {**decision, "source": "bundle", "path": str(path), "why": why}
    if mode is Mode.AOT:
        why = (
            f"mode aot and {missing}: the call raises KernelNotFoundError; build "
            "it (aot-build --shape K,N, or --from-misses with the miss log)"
        )
        return {**decision, "source": "error", "why": why}
    overlay_file = overlay.overlay_path(key, arch)
    if overlay_file.is_file():
        why = f"{missing}; an earlier JIT compile published it to the overlay cache"
        return {**decision, "source": "overlay", "path": str(overlay_file), "why": why}
    if jit_available():
        how = f"JIT-compiled in the serving process (a stall of seconds) and published to {overlay_file}"
    else:
        how = "nvidia-cutlass-dsl is not installed here, so mode auto runs torch.mm instead"
    why = (
        f"a miss: {missing} and the overlay has no entry; {how}; the miss is recorded "
        f"in {misses.miss_log_path()}"
    )
    return {**decision, "source": "jit", "why": why}


def _search_bundles(family_name, key, arch, mode, bundles, notes):
    """The runtime's bundle search: (path, entry) of the first usable bundle holding the key."""
    searched = 0
    for path, from_folder, manifest in bundles:
        if isinstance(manifest, str):
            notes.append(f"unreadable: {manifest}")
            continue
        if manifest.arch != arch:
            if not from_folder:  # Registry.load refuses a named file of another architecture
                notes.append(
                    f"{path} is built for {manifest.arch}: loading it by name on an {arch} GPU "
                    "raises IncompatibleBundleError"
                )
            continue
        searched += 1
        try:
            with warnings.catch_warnings():  # an untrusted signer is said once by the server
                warnings.simplefilter("ignore")
                loader.check_trust(path, manifest)
            loader.check_compatible(path, manifest, arch)
        except CuteAotError as exc:  # signature policy, tvm-ffi ABI
            notes.append(f"would not load: {exc}")
            continue
        stale = stale_reasons(manifest).get(family_name)
        if stale:
            fate = (
                "raises StaleBundleError at load (mode aot)"
                if mode is Mode.AOT
                else "is not used for it"
            )
            notes.append(f"{path} {fate}: {stale}")
            continue
        entry = manifest.entry_by_id().get(key.id)
        if entry is not None:
            return (path, entry), searched
    return None, searched
