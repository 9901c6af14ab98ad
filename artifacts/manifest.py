"""The bundle manifest: what a bundle holds, what built it, and the hashes that vouch for it.

Its fields and canonical JSON are packer code: a change of their bytes bumps PACKER_VERSION
(artifacts/fingerprints.py); reading one back, with its schema checks, is artifacts/bundle.py's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Version of the container layout and manifest schema; readers refuse versions they do not know.
FORMAT_VERSION = 1
# How an entry's exported function is called: "tvm_ffi" (`__tvm_ffi_<symbol>`, what ops and
# families call) or "c" (the DSL's own C ABI under `<symbol>_`, loaded with
# `cute.runtime.load_module`: what `cute.compile` returns to a caller that did not ask for TVM-FFI).
ABIS = ("tvm_ffi", "c")


@dataclass(frozen=True)
class Entry:
    """One kernel in the bundle's library."""

    family: str
    key: dict[str, Any]  # the key's canonical fields (family included)
    key_id: str
    symbol: str  # exported TVM-FFI function name in the library
    sha256: str  # of the key's compiled object, as linked
    size: int
    # Optional, recorded at build time (see aot/binary_info.py): the kernel's fatbin sha256/size,
    # its cubins' SM numbers and, where cuobjdump/nvdisasm were installed, per-function resources
    # and SASS opcode counts. Absent in bundles built without it; omitted from JSON when None.
    gpu_binary: dict[str, Any] | None = None
    # One of ABIS; TVM-FFI, the default, is omitted from JSON (older manifests unchanged).
    abi: str = "tvm_ffi"


@dataclass(frozen=True)
class Manifest:
    name: str
    arch: str
    bundle_version: str
    created_by: str
    toolchain: dict[str, Any]
    families: dict[str, dict[str, Any]]  # family -> {"version": int, "source_hash": str}
    library: dict[str, Any]  # {"sha256", "size"} of the uncompressed shared library
    payload: dict[str, Any]  # {"codec": "zstd", "sha256", "size"} of the stored bytes
    entries: tuple[Entry, ...] = field(default_factory=tuple)
    format_version: int = FORMAT_VERSION
    # {"algorithm": "ed25519", "key_id", "value"} (see artifacts/signing.py); None: unsigned,
    # omitted from JSON so unsigned manifests stay byte-identical to older ones.
    signature: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        data = asdict(self)
        data["entries"] = [_entry_json(entry) for entry in self.entries]
        if data["signature"] is None:
            del data["signature"]
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    def entry_by_id(self) -> dict[str, Entry]:
        return {entry.key_id: entry for entry in self.entries}


def _entry_json(entry: Entry) -> dict:
    data = asdict(entry)
    if data["gpu_binary"] is None:
        del data["gpu_binary"]  # manifests without it stay byte-identical to older ones
    if data["abi"] == "tvm_ffi":
        del data["abi"]
    return data
