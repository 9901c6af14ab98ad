"""Where a problem's kernel would come from, and why: the logic behind `aot-cache explain`.

Generic over kernel families: the dispatch decision and its reason are the family's own
(`family.dispatch(problem, arch)`), so the explanation cannot drift from the rule a server runs.
From there it follows Registry.resolve step by step (mode, bundle search order, signature policy,
compatibility, staleness, overlay, JIT) over manifests read as data: it never imports cutlass,
never loads a library and needs no GPU. What each mode does is asked of runtime/policy.py, for
the mode the operator names, so the explanation cannot drift from the policy a server runs.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from cute_aot.aot.tools.aot_cache.facts.inventory import BundleSource, key_text
from cute_aot.artifacts.core.errors import CuteAotError, TableError
from cute_aot.artifacts.manifest import Entry
from cute_aot.kernels import Adapter, KernelFamily, capability
from cute_aot.kernels.contract import Problem, dispatch_with
from cute_aot.kernels.keys import KernelKey
from cute_aot.kernels.tables import Table
from cute_aot.runtime import loader, misses, overlay, policy
from cute_aot.runtime.jit import jit_available
from cute_aot.runtime.mode import Mode
from cute_aot.runtime.registry import stale_reasons


def explain(
    family: KernelFamily, problem: Problem, arch: str, mode: Mode, bundles: list[BundleSource]
) -> dict:
    """Dispatch decision, key, and source (bundle | overlay | jit | error) with the reason.

    An architecture the family is not built for is an "error" decision (no key), not an
    exception: explaining several architectures at once must still answer for the others.
    """
    if not family.supports(arch):
        why = (
            f"family {family.name} is not built for {arch}: it supports "
            f"{', '.join(family.archs) or 'no architecture'}; a server on an {arch} GPU cannot "
            "serve this problem with it"
        )
        return {
            **_decision(arch, None, f"{family.name} is not built for {arch}"),
            "source": "error",
            "why": why,
        }
    judge = _judge(bundles, family.name, arch, mode)
    adapter = capability(family, Adapter)  # its library compiles what no bundle holds
    bypassed = policy.bypassed(mode)
    table, table_path = (None, None) if bypassed else _bundle_table(family, bundles, judge)
    dispatch = dispatch_with(family, problem, arch, table)
    key = dispatch.key
    decision = _decision(arch, key, dispatch.reason)
    if table_path is not None:
        decision["table"] = {"path": str(table_path), **table.record()}
        decision["notes"].append(
            f"dispatched with the {family.name} table of {table_path} ({table.describe()}), "
            "the first usable bundle that carries one"
        )
    if bypassed:
        why = "mode jit compiles every kernel in the process; bundles and the overlay are ignored"
        if adapter:
            why = f"mode jit: bundles are ignored and {adapter.serves} compiles as it would alone"
        return {**decision, "source": "jit", "why": why}
    found, searched = _search_bundles(key, arch, bundles, judge, decision["notes"])
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
    if policy.prebuilt_only(mode):
        shape = f"{family.name}:{family.shape_syntax}" if family.shape_syntax else family.name
        why = (
            f"mode aot and {missing}: the call raises KernelNotFoundError; build it "
            f"(aot-build --shape {shape}, or --from-misses with the miss log)"
        )
        return {**decision, "source": "error", "why": why}
    if adapter:  # our overlay is not used
        why = (
            f"a miss: {missing}; {adapter.serves} compiles it itself as without cute-aot (a "
            f"stall of seconds), and the miss is recorded in {misses.miss_log_path()}"
        )
        return {**decision, "source": "jit", "why": why}
    overlay_file = overlay.overlay_path(key, arch)
    if overlay_file.is_file():
        why = f"{missing}; an earlier JIT compile published it to the overlay cache"
        return {**decision, "source": "overlay", "path": str(overlay_file), "why": why}
    if jit_available():
        how = (
            "JIT-compiled in the serving process (a stall of seconds) and published to "
            f"{overlay_file}"
        )
    else:
        how = (
            f"nvidia-cutlass-dsl is not installed here, so mode auto runs {family.name}'s torch "
            "reference instead"
        )
    why = (
        f"a miss: {missing} and the overlay has no entry; {how}; the miss is recorded "
        f"in {misses.miss_log_path()}"
    )
    return {**decision, "source": "jit", "why": why}


def _decision(arch: str, key: KernelKey | None, reason: str) -> dict:
    """The fields every decision has; key None: no key (the family is not built for arch)."""
    return {
        "arch": arch,
        "key_id": key.id if key else None,
        "symbol": key.symbol if key else None,
        "key": key.fields() if key else None,
        "describe": key_text(key) if key else None,
        "dispatch": reason,
        "source": None,
        "path": None,
        "why": "",
        "notes": [],
    }


def _judge(bundles: list[BundleSource], family_name: str, arch: str, mode: Mode):
    """index -> (usable, why not or None): whether the runtime would use bundle `index` for
    `family_name` on `arch`, judged once (the table and the key search both ask)."""

    @functools.cache
    def judge(index: int) -> tuple[bool, str | None]:
        path, from_folder, manifest = bundles[index]
        notes: list[str] = []
        usable = _usable(path, from_folder, manifest, family_name, arch, mode, notes)
        return usable, (notes[0] if notes else None)

    return judge


def _bundle_table(
    family: KernelFamily, bundles: list[BundleSource], judge
) -> tuple[Table | None, Path | None]:
    """The table a server would dispatch with: that of the first usable bundle carrying one."""
    for index, (path, _, manifest) in enumerate(bundles):
        if judge(index)[0]:
            record = manifest.families.get(family.name, {}).get("table")
            if record is not None:
                try:
                    return Table.from_record(record, str(path)), path
                except TableError:
                    return None, None  # the server warns and uses the package's table
    return None, None


def _usable(path, from_folder, manifest, family_name, arch, mode, notes) -> bool:
    """Whether the runtime would use this bundle for `family_name` on `arch`; why not, to
    notes."""
    if isinstance(manifest, str):
        notes.append(f"unreadable: {manifest}")
        return False
    if manifest.arch != arch:
        if not from_folder:  # Registry.load refuses a named file of another architecture
            notes.append(
                f"{path} is built for {manifest.arch}: loading it by name on an {arch} GPU "
                "raises IncompatibleBundleError"
            )
        return False
    try:
        with warnings.catch_warnings():  # an untrusted signer is said once by the server
            warnings.simplefilter("ignore")
            loader.check_trust(path, manifest)
        loader.check_compatible(path, manifest, arch)
    except CuteAotError as exc:  # signature policy, tvm-ffi ABI
        notes.append(f"would not load: {exc}")
        return False
    stale = stale_reasons(manifest).get(family_name)
    if stale:
        # as Registry._refuse_stale asks: a stale bundle, neither named nor by architecture
        raises = policy.on_load_failure(policy.STALE, mode=mode) == policy.RAISE
        fate = (
            f"raises StaleBundleError at load (mode {mode.value})"
            if raises
            else "is not used for it"
        )
        notes.append(f"{path} {fate}: {stale}")
        return False
    return True


def _search_bundles(
    key: KernelKey, arch: str, bundles: list[BundleSource], judge, notes: list[str]
) -> tuple[tuple[Path, Entry] | None, int]:
    """The runtime's bundle search: ((path, entry) of the first usable bundle holding the key,
    or None; how many usable bundles were searched). Why others were passed over goes to notes."""
    searched = 0
    for index, (path, _, manifest) in enumerate(bundles):
        if not isinstance(manifest, str) and manifest.arch == arch:
            searched += 1  # the runtime's count: bundles of this architecture
        usable, why_not = judge(index)
        if why_not:
            notes.append(why_not)
        if not usable:
            continue
        entry = manifest.entry_by_id().get(key.id)
        if entry is not None:
            return (path, entry), searched
    return None, searched
