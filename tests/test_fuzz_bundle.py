"""Hypothesis fuzz of everything that reads a bundle before a dlopen: no input may raise anything
outside cute-aot's error hierarchy (a server catches CuteAotError; anything else is a crash).

Three targets, each fed thousands of examples here (benchmarks/fuzz_bundle.py runs more):
- bytes: random edits of a whole bundle file -> read_manifest, read_bundle;
- manifest: random edits of the manifest JSON, re-hashed so they get past the container checks
  -> the full verification (verify_bundle: schema, formats, trust, compatibility, entries, ELF);
- library: random edits of a real ELF shared library, re-hashed -> read_dynamic, check_library.
The base bundle is a real tiny shared library built with the system C compiler, exporting the
entry point of a real router_gemm key: valid as it is, so every edit starts from a passing file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cute_aot.artifacts import bundle as bundle_format
from cute_aot.artifacts import toolchain
from cute_aot.artifacts.bundle import read_bundle, read_manifest
from cute_aot.artifacts.bundle_writer import encode_bundle
from cute_aot.artifacts.core.errors import CuteAotError
from cute_aot.artifacts.elf import ElfError, read_dynamic
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.artifacts.verify import check_library
from cute_aot.kernels import families, family_facts
from cute_aot.kernels.router_gemm import dispatch
from cute_aot.runtime import loader

ARCH = "sm_90a"
EXAMPLES = 1500  # per target here; the script runs as many as asked


# -- the base bundle -----------------------------------------------------------------------------
def tiny_library(folder: Path, symbols: list[str]) -> bytes:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    source = folder / "entries.c"
    source.write_text(
        "".join(
            f"int __tvm_ffi_{s}(void *a, void *b, int n, void *r) {{ return n; }}\n"
            for s in symbols
        )
    )
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(folder / "lib.so"), str(source)], check=True
    )
    return (folder / "lib.so").read_bytes()


@dataclass
class Base:
    folder: Path
    manifest: Manifest
    library: bytes
    data: bytes
    outcomes: Counter = field(default_factory=Counter)  # target -> outcome kind -> count

    @property
    def payload(self) -> bytes:
        return self.data[-self.manifest.payload["size"] :]

    def write(self, data: bytes) -> Path:
        path = self.folder / f"fuzz-{ARCH}.cuteaot"
        path.write_bytes(data)
        return path


def make_base(folder: Path) -> Base:
    keys = [dispatch(2, 256, 4096, ARCH), dispatch(12, 256, 7168, ARCH)]
    library = tiny_library(folder, [key.symbol for key in keys])
    entries = tuple(
        Entry(
            key.FAMILY,
            key.fields(),
            key.id,
            key.symbol,
            hashlib.sha256(key.symbol.encode()).hexdigest(),
            100,
        )
        for key in keys
    )
    manifest = Manifest(
        name="fuzz",
        arch=ARCH,
        bundle_version="1.0.0",
        created_by="cute-aot fuzz",
        toolchain=toolchain.fingerprint(),
        families={name: family_facts(name) for name in families()},
        library={},
        payload={},
        entries=entries,
    )
    manifest, data = encode_bundle(manifest, library)
    return Base(folder, manifest, library, data)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    base = make_base(tmp_path_factory.mktemp("fuzz"))
    loader.verify_bundle(base.write(base.data), ARCH)  # the unedited base passes every check
    return base


# -- strategies ----------------------------------------------------------------------------------
def byte_edits(size: int):
    """Lists of (kind, offset, bytes) edits, offsets biased to the header and manifest."""
    offset = st.one_of(st.integers(0, min(size, 400)), st.integers(0, max(size - 1, 0)))
    edit = st.tuples(
        st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
        offset,
        st.binary(min_size=1, max_size=9),
    )
    return st.lists(edit, min_size=1, max_size=4)


def apply_edits(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for kind, offset, chunk in edits:
        offset = min(offset, len(out))
        if kind == "flip" and offset < len(out):
            out[offset] ^= chunk[0] or 1
        elif kind == "set":
            out[offset : offset + len(chunk)] = chunk
        elif kind == "insert":
            out[offset:offset] = chunk
        elif kind == "delete":
            del out[offset : offset + len(chunk)]
        elif kind == "truncate":
            del out[offset:]
    return bytes(out)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["../x", "/etc/passwd", "a" * 64, "0" * 64, "sm_90a", "zstd", "ed25519"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def json_paths(value, prefix=()):
    """Every (path) into a JSON value, containers included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from json_paths(item, (*prefix, index))


@st.composite
def manifest_edits(draw, manifest: Manifest):
    """The manifest JSON with 1-3 values replaced, deleted or added."""
    data = json.loads(manifest.to_json())
    for _ in range(draw(st.integers(1, 3))):
        # A top-level field first, then a place inside it: drawn from every path alike, the
        # long lists (entries, each family's source modules) would crowd out small fields such
        # as arch and toolchain, whose edits reach the deeper checks.
        top = draw(st.sampled_from(sorted(data)))
        paths = list(json_paths(data[top], (top,)))
        path = draw(st.sampled_from(paths))
        *parents, last = path
        container = data
        for step in parents:
            container = container[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            container[last] = draw(json_values)
        elif action == "delete":
            del container[last]
        elif isinstance(container, dict):
            container[draw(st.text(max_size=10))] = draw(json_values)
        else:
            container.append(draw(json_values))
    return data


def container(raw_manifest: bytes, payload: bytes) -> bytes:
    header = bundle_format.HEADER.pack(
        bundle_format.MAGIC,
        bundle_format.FORMAT_VERSION,
        0,
        len(raw_manifest),
        hashlib.sha256(raw_manifest).digest(),
    )
    return header + raw_manifest + payload


# -- targets (shared with benchmarks/fuzz_bundle.py) ---------------------------------------------
def outcome(base: Base, target: str, call: Callable[[], object], allowed=(CuteAotError,)) -> None:
    """Run one example; anything but success or an allowed error fails the fuzz."""
    try:
        call()
    except allowed as exc:
        base.outcomes[(target, type(exc).__name__)] += 1
    else:
        base.outcomes[(target, "ok")] += 1


def fuzz_bytes(base: Base, edits) -> None:
    path = base.write(apply_edits(base.data, edits))
    outcome(base, "bytes", lambda: read_manifest(path))
    outcome(base, "bytes", lambda: read_bundle(path))


def fuzz_manifest(base: Base, data: dict) -> None:
    raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    path = base.write(container(raw, base.payload))
    outcome(base, "manifest", lambda: loader.verify_bundle(path, ARCH))


def fuzz_library(base: Base, edits) -> None:
    library = apply_edits(base.library, edits)
    outcome(base, "library", lambda: read_dynamic(library), allowed=(ElfError,))
    manifest, data = encode_bundle(base.manifest, library)
    path = base.write(data)
    outcome(base, "library", lambda: check_library(path, manifest, library))


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every CI run
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    database=None,
)


# -- tests ---------------------------------------------------------------------------------------
def tally(base: Base, target: str) -> dict[str, int]:
    """How the examples of a target ended (shown with pytest -s)."""
    counts = {kind: n for (name, kind), n in sorted(base.outcomes.items()) if name == target}
    print(f"\nfuzz {target}: {sum(counts.values())} reads: {counts}")
    return counts


@pytest.mark.slow  # thousands of fuzzed bundles: CI runs it, the quick loop does not
def test_fuzz_bundle_bytes(base):
    @FUZZ_SETTINGS
    @given(edits=byte_edits(len(base.data)))
    def run(edits):
        fuzz_bytes(base, edits)

    run()
    counts = tally(base, "bytes")
    assert sum(counts.values()) >= 2 * EXAMPLES
    assert {"ok", "BundleFormatError", "BundleIntegrityError"} <= set(counts), counts


@pytest.mark.slow  # thousands of fuzzed bundles: CI runs it, the quick loop does not
def test_fuzz_manifest(base):
    @FUZZ_SETTINGS
    @given(data=manifest_edits(base.manifest))
    def run(data):
        fuzz_manifest(base, data)

    run()
    counts = tally(base, "manifest")
    assert sum(counts.values()) >= EXAMPLES
    # the edits reach past the schema into the entry checks; which deeper checks random draws
    # reach depends on the base manifest (its toolchain fields are this machine's), so the
    # compatibility checks are reached by the edits below, on every machine
    assert {"BundleFormatError", "BundleIntegrityError"} <= set(counts), counts


@pytest.mark.parametrize(
    "path, value, error",
    [
        (("arch",), "sm_75", "IncompatibleBundleError"),  # an architecture cute-aot does not know
        (("arch",), "sm_100a", "OtherArchError"),  # known, not this GPU's
        (("toolchain", "tvm_ffi"), "0.0.1", "IncompatibleBundleError"),  # another ABI series
        (("toolchain", "tvm_ffi"), None, "IncompatibleBundleError"),  # no version said
    ],
)
def test_manifest_edits_reach_the_compatibility_checks(base, path, value, error):
    data = json.loads(base.manifest.to_json())
    *parents, last = path
    container = data
    for step in parents:
        container = container[step]
    container[last] = value
    before = base.outcomes.copy()
    fuzz_manifest(base, data)
    assert base.outcomes - before == Counter({("manifest", error): 1})


@pytest.mark.slow  # thousands of fuzzed bundles: CI runs it, the quick loop does not
def test_fuzz_library(base):
    @FUZZ_SETTINGS
    @given(edits=byte_edits(len(base.library)))
    def run(edits):
        fuzz_library(base, edits)

    run()
    counts = tally(base, "library")
    assert sum(counts.values()) >= 2 * EXAMPLES
    assert {"ok", "ElfError", "BundleIntegrityError"} <= set(counts), counts


def test_fuzz_finds_nothing_outside_the_hierarchy_in_a_planted_crash(base, monkeypatch):
    """The harness itself can fail: a reader that raises a bare exception is caught."""

    def broken(path):
        raise KeyError("planted")

    monkeypatch.setattr(bundle_format, "check_fields", lambda path, manifest: broken(path))
    with pytest.raises(KeyError):
        fuzz_bytes(base, [("flip", 10_000_000, b"\x01")])  # an edit past the end: a valid file
