"""Stub kernels: real, linkable objects exporting a TVM-FFI function per key, made with the system
C compiler in milliseconds. Format, loader and CLI tests build bundles from them with the real
build, link and pack; only tests about the kernels themselves need cross-compiled CuTe DSL code.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

from cute_aot.kernels import family

# The TVM-FFI "safe call" ABI: (handle, args, num_args, result) -> 0 on success. The result is
# an int (type index 1): the key's own number (`stub_value`), so a test that calls a loaded
# function knows which key's code it reached.
STUB_SOURCE = """
#include <stdint.h>
void *TVMFFIEnvGetStream(int32_t device_type, int32_t device_id);
int __tvm_ffi_{symbol}(void *handle, const void *args, int32_t num_args, void *result) {{
  if (num_args < 0) TVMFFIEnvGetStream(2, 0); /* needs libtvm_ffi, as a real kernel does */
  ((int64_t *)result)[0] = 1;
  ((int64_t *)result)[1] = {value}LL;
  return 0;
}}
"""


def stub_value(key_id: str) -> int:
    """What the stub function of key `key_id` returns when called."""
    return int(key_id[:15], 16)


def stub_compile(family_name: str, key_fields: dict, arch: str, out_dir: str) -> dict:
    """Stand-in for compile_to_object (same arguments, same row)."""
    key = family(family_name).Key.from_fields(key_fields)
    row = {"family": family_name, "key_id": key.id, "symbol": key.symbol, "arch": arch}
    source = Path(out_dir) / f"{key.symbol}.c"
    source.write_text(STUB_SOURCE.format(symbol=key.symbol, value=stub_value(key.id)))
    target = Path(out_dir) / f"{key.symbol}.o"
    subprocess.run(
        ["gcc", "-c", "-O2", "-fPIC", source.name, "-o", target.name], cwd=out_dir, check=True
    )
    source.unlink()
    data = target.read_bytes()
    return {
        **row,
        "status": "ok",
        "object": str(target),
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "seconds": 0.0,
    }


class RecordingKernel:
    """Stands in for a bundle's TVM-FFI function where nothing may launch: records the
    arguments of each call."""

    def __init__(self, key_id: str):
        self.key_id = key_id
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def without_cutlass(monkeypatch) -> None:
    """nvidia-cutlass-dsl as not installed, for one test (a server without the [build] extra):
    importlib finds no `cutlass` and importing it fails. The package cute-aot's JIT imports is
    what is faked, not cute-aot: its own check (`jit.jit_available`) runs as on such a server."""
    monkeypatch.setitem(sys.modules, "cutlass", None)


def with_cutlass_found(monkeypatch) -> None:
    """nvidia-cutlass-dsl as installed, for one test whose family's compile is a stand-in that
    never imports it: importlib finds `cutlass` (where it is not installed, an empty module)."""
    if importlib.util.find_spec("cutlass") is None:
        module = types.ModuleType("cutlass")
        module.__spec__ = importlib.util.spec_from_loader("cutlass", loader=None)
        monkeypatch.setitem(sys.modules, "cutlass", module)


@contextlib.contextmanager
def installed_families(site: Path, **points: str) -> Iterator[Path]:
    """Families installed for the block as another project's package installs them: a
    distribution's metadata in `site` (a `.dist-info` folder whose entry_points.txt names each
    `name = "module:object"` under cute_aot.families), `site` on sys.path. cute-aot finds them
    through importlib.metadata as it finds any plug-in. Yields the `.dist-info` folder (removing
    it uninstalls them, as pip does); discovery is forgotten when the block starts and ends."""
    from cute_aot import kernels

    info = site / "cute_aot_test_families-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: cute-aot-test-families\nVersion: 0\n"
    )
    lines = [f"{name} = {value}\n" for name, value in points.items()]
    (info / "entry_points.txt").write_text("[cute_aot.families]\n" + "".join(lines))
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    kernels.forget_families()
    try:
        yield info
    finally:
        sys.path.remove(str(site))
        importlib.invalidate_caches()
        kernels.forget_families()


def loaded_bundle(key, function, arch: str, *, path="fake.cuteaot", name="fake", facts=None):
    """A bundle as the registry holds one after every check, serving `key` with the Python
    `function` (None: its entry is there, its function is not, as in a damaged library);
    `facts`: its family's facts (default: the installed family's)."""
    from cute_aot.artifacts import toolchain
    from cute_aot.artifacts.manifest import Entry, Manifest
    from cute_aot.kernels import family_facts
    from cute_aot.runtime.loader import LoadedBundle

    entry = Entry(key.FAMILY, key.fields(), key.id, key.symbol, "ab" * 32, 1)
    manifest = Manifest(
        name,
        arch,
        "1",
        "test",
        toolchain.fingerprint(),
        {key.FAMILY: facts if facts is not None else family_facts(key.FAMILY)},
        {},
        {},
        (entry,),
    )
    module = {} if function is None else {key.symbol: function}
    return LoadedBundle(Path(path), manifest, "memfd:fake", module, {key.id: entry})
