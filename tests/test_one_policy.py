"""One resolution policy (runtime/policy.py): the only place that decides by the mode, and the
only counters.

- The call-time ladder as a table: (mode, what is available, what fails) -> the source that
  serves or the error raised, and the counts, driven through the real `resolution.resolve` and the
  real registry (bundles and overlay entries added to it; JIT stood in for, or made unavailable
  as it is without cutlass-dsl).
- Load-time failures as a table: the policy's decision for each kind, and the registry loading
  real bundles, damaged files and missing folders under each mode.
- A scan of the package: a mode test, or a counter, anywhere else fails.
"""

from __future__ import annotations

import ast
import dataclasses
import warnings
from fnmatch import fnmatch

import pytest

from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.bundle_writer import write_bundle
from cute_aot.artifacts.core.errors import (
    BundleError,
    JitUnavailableError,
    KernelNotFoundError,
    OtherArchError,
    StaleBundleError,
    UnsupportedProblemError,
)
from cute_aot.kernels import family
from cute_aot.runtime import REGISTRY, jit, policy, resolution, set_mode
from cute_aot.runtime.loader import LoadedBundle
from cute_aot.runtime.serving import Serving
from tests.package_source import ROOT, package_files, parsed
from tests.stubs import loaded_bundle, without_cutlass

ARCH = "sm_90a"
ROUTER = family("router_gemm")
KEY = ROUTER.dispatch(ROUTER.parse_problem("M=2,N=8,K=64"), ARCH).key


# -- the call-time ladder ------------------------------------------------------------------------
def kernel(name: str):
    def function(*args):
        return name

    function.__name__ = name
    return function


KERNELS = {name: kernel(name) for name in ("bundle", "overlay", "jit", "reference")}
BROKEN = "broken"  # an entry whose function cannot be looked up (a damaged library)


def _loaded(function, path: str) -> LoadedBundle:
    """A bundle as the registry holds one after every check: `function` serves KEY (None: its
    entry is there, its function is not, as in a damaged library)."""
    return loaded_bundle(KEY, function, ARCH, path=path, name="ladder")


def _arrange(monkeypatch, have: set, broken: set) -> list:
    """Registry and JIT as the row says; returns the publish flags JIT was asked with."""
    if "bundle" in have:
        REGISTRY.add(_loaded(None if "bundle" in broken else KERNELS["bundle"], "b.cuteaot"))
    if "overlay" in have:
        overlay = _loaded(None if "overlay" in broken else KERNELS["overlay"], "o.cuteaot")
        REGISTRY.overlay_bundles[(ARCH, KEY.id)] = overlay
    published = []
    if "jit" in have:

        def compiled(key, arch, publish):  # a compile, without cutlass-dsl's seconds
            if "jit" in broken:
                raise RuntimeError("the compiler crashed")
            published.append(publish)
            return KERNELS["jit"]

        monkeypatch.setattr(jit, "jit_available", lambda: True)
        monkeypatch.setattr(jit, "compiled_function", compiled)
    else:  # the real JIT, on a server without cutlass-dsl
        without_cutlass(monkeypatch)
    return published


def _find_key(broken: set):
    def find_key():
        if "problem" in broken:
            raise UnsupportedProblemError("router_gemm serves no such problem")
        return KEY

    return find_key


# (mode, available, failing, library served) -> (source or error, (hits, misses, bypasses,
# degradations)). "library": the family serves another library's function, which compiles
# itself on a miss (resolve answers None).
ALL = {"bundle", "overlay", "jit", "reference"}
LADDER = [
    # mode auto: the first step that serves, each failure one degradation
    ("auto", ALL, set(), False, "bundle", (1, 0, 0, 0)),
    ("auto", ALL - {"bundle"}, set(), False, "overlay", (1, 0, 0, 0)),
    ("auto", {"jit", "reference"}, set(), False, "jit", (0, 1, 0, 0)),
    ("auto", {"reference"}, set(), False, "reference", (0, 1, 0, 1)),
    ("auto", set(), set(), False, JitUnavailableError, (0, 1, 0, 0)),
    ("auto", ALL, {"bundle"}, False, "overlay", (1, 0, 0, 1)),
    ("auto", ALL, {"bundle", "overlay"}, False, "jit", (0, 1, 0, 2)),
    ("auto", ALL, {"bundle", "overlay", "jit"}, False, "reference", (0, 1, 0, 3)),
    ("auto", {"jit"}, {"jit"}, False, JitUnavailableError, (0, 1, 0, 0)),
    ("auto", ALL, {"problem"}, False, "reference", (0, 0, 0, 1)),
    ("auto", {"bundle", "jit"}, {"problem"}, False, UnsupportedProblemError, (0, 0, 0, 0)),
    ("auto", ALL, set(), True, "bundle", (1, 0, 0, 0)),
    ("auto", ALL - {"bundle"}, set(), True, "library", (0, 1, 0, 0)),
    ("auto", ALL, {"bundle"}, True, "library", (0, 1, 0, 1)),
    # mode aot: the bundle or an error, never a compile nor a reference
    ("aot", ALL, set(), False, "bundle", (1, 0, 0, 0)),
    ("aot", ALL - {"bundle"}, set(), False, KernelNotFoundError, (0, 0, 0, 0)),
    ("aot", ALL, {"bundle"}, False, KeyError, (0, 0, 0, 0)),  # the bundle's own failure
    ("aot", ALL, {"problem"}, False, UnsupportedProblemError, (0, 0, 0, 0)),
    ("aot", ALL - {"bundle"}, set(), True, KernelNotFoundError, (0, 0, 0, 0)),
    # mode jit: bundles and the overlay bypassed, never published
    ("jit", ALL, set(), False, "jit", (0, 0, 1, 0)),
    ("jit", ALL, set(), True, "library", (0, 0, 1, 0)),
    ("jit", ALL - {"jit"}, set(), False, JitUnavailableError, (0, 0, 1, 0)),
    ("jit", ALL, {"problem"}, False, UnsupportedProblemError, (0, 0, 0, 0)),
]


def _row_id(row) -> str:
    mode, have, broken, library, expected, _ = row
    failing = f"-{'+'.join(sorted(broken))}-fails" if broken else ""
    outcome = expected if isinstance(expected, str) else expected.__name__
    served = "-lib" if library else ""
    return f"{mode}-{'+'.join(sorted(have)) or 'nothing'}{failing}{served}->{outcome}"


@pytest.mark.parametrize("row", LADDER, ids=[_row_id(row) for row in LADDER])
def test_the_ladder(row, fresh_runtime, monkeypatch):
    mode, have, broken, library, expected, counts = row
    published = _arrange(monkeypatch, have, broken)
    set_mode(mode)
    reference = (lambda: KERNELS["reference"]) if "reference" in have else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what is said, and once, is tested elsewhere
        if isinstance(expected, str):
            served = resolution.resolve(
                KEY.FAMILY,
                ARCH,
                _find_key(broken),
                lambda: {"m": 2},
                reference,
                serves_library="flashinfer" if library else None,
            )
            assert served.source == expected
            assert served.function is KERNELS.get(expected)  # None: the library compiles
        else:
            with pytest.raises(expected):
                resolution.resolve(
                    KEY.FAMILY,
                    ARCH,
                    _find_key(broken),
                    None,
                    reference,
                    serves_library="flashinfer" if library else None,
                )
    got = policy.counters().get(KEY.FAMILY, {})
    keys = (policy.HIT, policy.MISS, policy.BYPASS, policy.DEGRADED)
    assert tuple(got.get(k, 0) for k in keys) == counts
    if published:  # mode jit compiles for this process only; auto publishes to the overlay
        assert published == [mode != "jit"]


# -- load time -----------------------------------------------------------------------------------
KINDS = (policy.STALE, policy.DAMAGED, policy.UNREACHABLE, policy.ABSENT, policy.OTHER_ARCH)
R, F = policy.RAISE, policy.FALL_BACK
# kind -> {mode: action} for a bundle found in a folder or named by CUTE_AOT_BUNDLES (not by
# the caller: every named bundle that fails raises, in every mode)
ON_LOAD = {
    policy.STALE: {"auto": F, "aot": R, "jit": F},
    policy.DAMAGED: {"auto": F, "aot": R, "jit": F},
    policy.UNREACHABLE: {"auto": F, "aot": R, "jit": F},
    policy.ABSENT: {"auto": F, "aot": F, "jit": F},  # a folder not mounted yet: tried again
    policy.OTHER_ARCH: {"auto": F, "aot": R, "jit": F},  # named by CUTE_AOT_BUNDLES
}


@pytest.mark.parametrize("mode", ["auto", "aot", "jit"])
@pytest.mark.parametrize("kind", KINDS)
def test_load_failures_by_kind_and_mode(kind, mode, fresh_runtime):
    set_mode(mode)
    assert policy.on_load_failure(kind) == ON_LOAD[kind][mode]
    assert policy.on_load_failure(kind, named=True) == R
    in_folder = policy.on_load_failure(kind, in_folder=True)
    assert in_folder == (policy.IGNORE if kind == policy.OTHER_ARCH else ON_LOAD[kind][mode])


@pytest.mark.parametrize("mode", ["auto", "aot", "jit"])
def test_a_named_mode_is_decided_whatever_the_current_one(mode, fresh_runtime):
    """What `aot-cache explain --mode` asks: the same table, for a mode this process is not in."""
    for current in ("auto", "aot", "jit"):
        set_mode(current)
        for kind in KINDS:
            assert policy.on_load_failure(kind, mode=mode) == ON_LOAD[kind][mode]
            assert policy.on_load_failure(kind, named=True, mode=mode) == R
        assert policy.bypassed(mode) is (mode == "jit")
        assert policy.prebuilt_only(mode) is (mode == "aot")
        assert policy.decided_mode(mode).value == mode
        assert policy.decided_mode().value == current


@pytest.mark.parametrize(
    "mode, case, outcome",
    [
        ("auto", "damaged in a folder", "skipping bundle"),
        ("aot", "damaged in a folder", BundleError),
        ("auto", "damaged, named", BundleError),
        ("auto", "other arch in a folder", None),
        ("aot", "other arch in a folder", None),
        ("auto", "other arch, named", OtherArchError),
        ("auto", "stale, named", "not used for router_gemm"),
        ("aot", "stale, named", StaleBundleError),
        ("aot", "missing folder in CUTE_AOT_BUNDLES", "cannot be read now"),
    ],
)
def test_the_registry_loads_by_the_policy(
    mode, case, outcome, fresh_runtime, stub_bundles, tmp_path, settings_scope
):
    _, paths, _ = stub_bundles
    sm90 = next(p for p in paths if ARCH in p.name)
    other = next(p for p in paths if ARCH not in p.name)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / sm90.name).write_bytes(sm90.read_bytes())
    if case.startswith("damaged"):
        (folder / "damaged.cuteaot").write_bytes(b"not a bundle" * 100)
    if case.startswith("other arch"):
        (folder / other.name).write_bytes(other.read_bytes())
    if case.startswith("stale"):  # built by another version of the family
        manifest, library = read_bundle(sm90)
        stale = {name: {**facts, "version": "0"} for name, facts in manifest.families.items()}
        write_bundle(
            folder / "stale.cuteaot", dataclasses.replace(manifest, families=stale), library
        )
    named = {
        "damaged, named": folder / "damaged.cuteaot",
        "other arch, named": folder / other.name,
        "stale, named": folder / "stale.cuteaot",
    }.get(case, folder)
    set_mode(mode)

    def load():
        if case.startswith("missing"):
            settings_scope(CUTE_AOT_BUNDLES=str(tmp_path / "not-mounted"))
            REGISTRY.load_from_env()
            return
        REGISTRY.load(named, gpu_arch=ARCH)

    if isinstance(outcome, type):
        with pytest.raises(outcome):
            load()
    elif outcome is None:  # nothing said: one folder ships every architecture
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load()
        assert [b.arch for b in REGISTRY.bundles] == [ARCH]
    else:
        with pytest.warns(RuntimeWarning, match=outcome):
            load()


# -- the counters --------------------------------------------------------------------------------
def test_a_served_family_reads_the_policys_counters(fresh_runtime):
    serving = Serving(ROUTER)
    policy.count(ROUTER.name, policy.HIT)
    policy.count(ROUTER.name, policy.HIT, "module:kernel")
    policy.count(ROUTER.name, policy.MISS)
    assert (serving.hits, serving.misses) == (2, 1)
    assert policy.targets()["module:kernel"] == {"compiles": 0, "hits": 1, "misses": 0}
    policy.reset_counters()
    assert (serving.hits, serving.misses) == (0, 0)


# -- one home: the scan --------------------------------------------------------------------------
HOME = {"runtime/policy.py", "runtime/mode.py"}  # the policy, and the mode it reads
# Readings of the mode that decide no fallback, each with why: (module, fnmatch pattern; the
# tools' modules by name anywhere under aot/tools/, which moves them between subfolders).
ALLOWED = {
    # the exit report shows the mode the process ran in
    ("runtime/capture/report.py", "current_mode"),
    # `aot-cache env` shows the mode a server here would run in
    ("aot/tools/*/inventory.py", "current_mode"),
}


def _allowed(where: str, what: str) -> bool:
    return any(fnmatch(where, pattern) and what == w for pattern, w in ALLOWED)


MEMBERS = {"AUTO", "AOT", "JIT"}
COUNTERS = {"hits", "misses", "bypasses", "degradations"}


def _modules():
    for path in package_files():
        yield path.relative_to(ROOT).as_posix(), parsed(path)


def mode_tests(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each reading of the mode in `tree`: a call of current_mode (or of the
    raw setting, mode_name), and every use of a Mode member."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name in {"current_mode", "mode_name"}:
                found.append((node.lineno, name))
        elif isinstance(node, ast.Attribute) and node.attr in MEMBERS:
            owner = node.value
            owner_name = (
                owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            )
            if owner_name == "Mode":
                found.append((node.lineno, f"Mode.{node.attr}"))
    return found


def counts_kept(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each `<...>hits += ...` and the like: a counter kept outside."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign):
            target = node.target
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in COUNTERS:
                found.append((node.lineno, name))
    return found


def test_the_scan_finds_a_copy():
    copy = "if current_mode() is Mode.AOT:\n    raise\nself.hits += 1\n"
    tree = ast.parse(copy)
    assert mode_tests(tree) == [(1, "current_mode"), (1, "Mode.AOT")]
    assert counts_kept(tree) == [(3, "hits")]
    assert mode_tests(ast.parse("mode.Mode.JIT\nsettings.mode_name()")) == [
        (1, "Mode.JIT"),
        (2, "mode_name"),
    ]


def test_only_the_policy_decides_by_mode():
    modules = dict(_modules())
    found = sorted(
        f"{where}:{line}: {what}"
        for where, tree in modules.items()
        if where not in HOME and where != "artifacts/core/settings.py"  # declares the mode setting
        for line, what in mode_tests(tree)
        if not _allowed(where, what)
    )
    assert not found, (
        "the mode is tested outside runtime/policy.py; ask the policy (on_load_failure, "
        "bypassed, prebuilt_only: mode= for a mode this process is not in; unservable, resolve), "
        "or allow it here with why:\n" + "\n".join(found)
    )
    unused = sorted(
        f"{pattern}: {what}"
        for pattern, what in ALLOWED
        if not any(
            fnmatch(where, pattern) and what in {w for _, w in mode_tests(tree)}
            for where, tree in modules.items()
        )
    )
    assert not unused, "allowed, but no longer there (moved? remove it):\n" + "\n".join(unused)


def test_the_runtime_counts_only_in_the_policy():
    found = sorted(
        f"{where}:{line}: {what}"
        for where, tree in _modules()
        if where.startswith("runtime/") and where != "runtime/policy.py"
        for line, what in counts_kept(tree)
    )
    assert not found, "counters kept outside runtime/policy.py:\n" + "\n".join(found)
