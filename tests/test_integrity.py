"""The corruption matrix: every bad bundle ends in a typed error naming the problem before any
dlopen, and in mode auto a server skips it with one warning and falls back to JIT.

Bad files are made from a real cross-compiled bundle (tests/conftest.py `small_bundles`). Where
hashes are recomputed after an edit, the file is what a careless or hostile writer produces: the
container checks pass and the deeper checks must catch it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cute_aot.artifacts import bundle as bundle_format
from cute_aot.artifacts import signing
from cute_aot.artifacts.bundle import parse_manifest, read_bundle, read_manifest
from cute_aot.artifacts.bundle_writer import encode_bundle
from cute_aot.artifacts.core.errors import (
    BundleError,
    BundleFormatError,
    BundleIntegrityError,
    BundleSizeError,
    CuteAotError,
    IncompatibleBundleError,
    KeyFileError,
    MissingLibraryError,
    OtherArchError,
    SignatureError,
)
from cute_aot.artifacts.elf import read_dynamic
from cute_aot.artifacts.manifest import Entry, Manifest
from cute_aot.artifacts.verify import check_dynamic
from cute_aot.kernels import family
from cute_aot.kernels.router_gemm import dispatch
from cute_aot.runtime import REGISTRY, jit, loader, set_mode
from cute_aot.runtime.loader import open_bundle
from cute_aot.runtime.resolution import key_function
from tests.fake_gpu import fake_gpu_of
from tests.stubs import stub_value

ARCH = "sm_90a"
E_MACHINE_OFFSET = 18  # ELF header: e_machine, u16
EM_AARCH64 = 183


# -- material ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Good:
    path: Path
    manifest: Manifest
    library: bytes

    @property
    def data(self) -> bytes:
        return self.path.read_bytes()

    @property
    def payload(self) -> bytes:
        return self.data[-self.manifest.payload["size"] :]

    @property
    def manifest_offset(self) -> int:
        return bundle_format.HEADER.size


@pytest.fixture(scope="module")
def good(stub_bundles) -> Good:
    _, paths, _ = stub_bundles
    path = next(p for p in paths if ARCH in p.name)
    manifest, library = read_bundle(path)
    return Good(path, manifest, library)


@dataclass(frozen=True)
class Keys:
    release: Ed25519PrivateKey
    release_pub: Path
    stranger: Ed25519PrivateKey
    folder: Path


def _public_pem(key) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _private_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Keys:
    folder = tmp_path_factory.mktemp("keys")
    release, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    (folder / "release.pem").write_bytes(_private_pem(release))
    (folder / "trusted").mkdir()
    pub = folder / "trusted" / "release.pub.pem"
    pub.write_bytes(_public_pem(release))
    return Keys(release, pub, stranger, folder)


@pytest.fixture
def no_dlopen(monkeypatch):
    """Fails the test if any library is handed to the dynamic loader."""
    reached = []

    def refuse(path, fd):
        reached.append(path)
        raise AssertionError(f"dlopen reached for {path}")

    monkeypatch.setattr(loader, "_dlopen_descriptor", refuse)
    return reached


@pytest.fixture
def trust_env(settings_scope):
    """No trusted keys and no signature required; returns `settings_scope` to set them."""
    settings_scope(CUTE_AOT_TRUSTED_KEYS=None, CUTE_AOT_REQUIRE_SIGNATURE=None)
    return settings_scope


def raw_container(raw_manifest: bytes, payload: bytes, version=None, reserved=0) -> bytes:
    """A container around arbitrary manifest bytes, with a correct manifest hash."""
    header = bundle_format.HEADER.pack(
        bundle_format.MAGIC,
        bundle_format.FORMAT_VERSION if version is None else version,
        reserved,
        len(raw_manifest),
        hashlib.sha256(raw_manifest).digest(),
    )
    return header + raw_manifest + payload


def edited_json(good: Good, edit: Callable[[dict], None]) -> bytes:
    """The good bundle with its manifest JSON edited (and rehashed), payload unchanged."""
    data = json.loads(good.manifest.to_json())
    edit(data)
    raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return raw_container(raw, good.payload)


def rebuilt(manifest: Manifest, library: bytes, **changes) -> bytes:
    """A bundle of this manifest (changed) and library, every hash recomputed."""
    return encode_bundle(dataclasses.replace(manifest, **changes), library)[1]


def with_entries(good: Good, edit: Callable[[list[Entry]], list[Entry]]) -> bytes:
    return rebuilt(good.manifest, good.library, entries=tuple(edit(list(good.manifest.entries))))


def replace_entry(index: int, **changes) -> Callable[[list[Entry]], list[Entry]]:
    def edit(entries):
        entries[index] = dataclasses.replace(entries[index], **changes)
        return entries

    return edit


def flip(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0xFF
    return bytes(out)


def gcc_library(tmp_path: Path, symbols: list[str], needed=(), runpath=None) -> bytes:
    """A real tiny shared library exporting __tvm_ffi_<symbol> for each symbol."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    work = tmp_path / "gcc"
    work.mkdir(exist_ok=True)
    source = work / "entries.c"
    source.write_text(
        "".join(
            f"int __tvm_ffi_{s}(void *a, void *b, int n, void *r) {{ return 0; }}\n"
            for s in symbols
        )
    )
    command = [compiler, "-shared", "-fPIC", "-o", str(work / "lib.so"), str(source)]
    command += ["-Wl,--no-as-needed"]
    for soname in needed:  # a stub library carrying that soname, linked in by path
        stub = work / soname
        (work / "stub.c").write_text("int cute_aot_stub(void) { return 0; }\n")
        subprocess.run(
            [
                compiler,
                "-shared",
                "-fPIC",
                "-o",
                str(stub),
                str(work / "stub.c"),
                f"-Wl,-soname,{soname}",
            ],
            check=True,
        )
        command.append(str(stub))
    if runpath:
        command += [f"-Wl,-rpath,{runpath}", "-Wl,--enable-new-dtags"]
    subprocess.run(command, check=True)
    return (work / "lib.so").read_bytes()


# -- the matrix ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Patches:
    """What a case changes for its test: attributes and modules, and settings (in-process)."""

    monkeypatch: pytest.MonkeyPatch
    settings: Callable  # the settings_scope fixture


@dataclass(frozen=True)
class Case:
    make: Callable  # (tmp_path, good, keys, Patches) -> bytes of the bad bundle file
    error: type[BundleError]
    message: str  # regex the error's message must match
    gpu_arch: str = ARCH


def _zeros_frame(size: int) -> bytes:
    """One zstd frame inflating to `size` zero bytes, made without holding them in memory."""
    compressor = zstandard.ZstdCompressor(level=19).compressobj(size=size)
    chunk = bytes(16 << 20)
    parts = [
        compressor.compress(chunk[: min(len(chunk), size - done)])
        for done in range(0, size, len(chunk))
    ]
    return b"".join(parts) + compressor.flush()


def _bomb_bundle(good: Good, claimed_size: int, inflated_size: int) -> bytes:
    payload = _zeros_frame(inflated_size)
    raw = json.loads(good.manifest.to_json())
    raw["library"] = {
        "sha256": hashlib.sha256(bytes(claimed_size)).hexdigest(),
        "size": claimed_size,
    }
    raw["payload"] = {
        "codec": "zstd",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "size": len(payload),
    }
    return raw_container(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode(), payload)


def _signed(good: Good, key: Ed25519PrivateKey, **changes) -> bytes:
    manifest = signing.sign_manifest(good.manifest, key)
    tampered = dataclasses.replace(manifest, **changes)  # the signature no longer covers it
    return raw_container(tampered.to_json(), good.payload)


def _require(settings_scope, keys: Keys, trusted: Path | None = None) -> None:
    settings_scope(
        CUTE_AOT_REQUIRE_SIGNATURE="1", CUTE_AOT_TRUSTED_KEYS=str(trusted or keys.release_pub)
    )


def _other_key(good: Good):
    """A valid key of the family that the good bundle's library does not hold."""
    held = {entry.key_id for entry in good.manifest.entries}
    key = next(
        dispatch(m, 128, 2048 - 8, ARCH)
        for m in range(1, 5)
        if dispatch(m, 128, 2048 - 8, ARCH).id not in held
    )
    return key


def _unresolvable(monkeypatch):
    monkeypatch.setattr(loader, "_loaded_libraries", lambda: set())
    monkeypatch.setattr(loader, "library_search_dirs", lambda: [])


MATRIX: dict[str, Case] = {
    # container
    "truncated header": Case(
        lambda t, g, k, m: g.data[:20], BundleFormatError, "truncated: shorter than a bundle header"
    ),
    "truncated manifest": Case(
        lambda t, g, k, m: g.data[: g.manifest_offset + 50],
        BundleFormatError,
        "truncated inside the manifest",
    ),
    "truncated payload": Case(
        lambda t, g, k, m: g.data[:-100], BundleFormatError, "truncated payload"
    ),
    "trailing bytes": Case(lambda t, g, k, m: g.data + b"\0", BundleFormatError, "trailing bytes"),
    "bad magic": Case(lambda t, g, k, m: b"NOTABNDL" + g.data[8:], BundleFormatError, "bad magic"),
    "unknown format version": Case(
        lambda t, g, k, m: g.data[:8] + struct.pack("<I", 99) + g.data[12:],
        BundleFormatError,
        "unknown bundle format version 99",
    ),
    "unknown manifest version": Case(
        lambda t, g, k, m: edited_json(g, lambda d: d.update(format_version=2)),
        BundleFormatError,
        "unknown manifest format version 2",
    ),
    "reserved header field": Case(
        lambda t, g, k, m: g.data[:12] + struct.pack("<I", 1) + g.data[16:],
        BundleFormatError,
        "reserved header field",
    ),
    "flipped byte in payload": Case(
        lambda t, g, k, m: flip(g.data, len(g.data) - 1000),
        BundleIntegrityError,
        "payload hash mismatch",
    ),
    "flipped byte in manifest": Case(
        lambda t, g, k, m: flip(g.data, g.manifest_offset + 40),
        BundleIntegrityError,
        "manifest hash mismatch",
    ),
    "flipped byte in manifest hash": Case(
        lambda t, g, k, m: flip(g.data, 30), BundleIntegrityError, "manifest hash mismatch"
    ),
    "manifest not JSON": Case(
        lambda t, g, k, m: raw_container(b"{not json", g.payload),
        BundleFormatError,
        "not valid JSON",
    ),
    "manifest nested too deep": Case(
        lambda t, g, k, m: raw_container(b"[" * 100_000 + b"]" * 100_000, g.payload),
        BundleFormatError,
        "not valid JSON",
    ),
    "library hash mismatch": Case(
        lambda t, g, k, m: edited_json(g, lambda d: d["library"].update(sha256="0" * 64)),
        BundleIntegrityError,
        "library hash mismatch",
    ),
    "library size mismatch": Case(
        lambda t, g, k, m: edited_json(
            g, lambda d: d["library"].update(size=d["library"]["size"] - 1)
        ),
        BundleIntegrityError,
        "decompresses to more than",
    ),
    "payload record with extra field": Case(
        lambda t, g, k, m: edited_json(g, lambda d: d["payload"].update(note="x")),
        BundleFormatError,
        "manifest payload must be",
    ),
    "garbage after the zstd frame": Case(
        lambda t, g, k, m: _payload_swapped(g, g.payload + b"garbage!"),
        BundleIntegrityError,
        "payload does not decompress",
    ),
    "a second zstd frame": Case(
        lambda t, g, k, m: _payload_swapped(g, g.payload + g.payload),
        BundleIntegrityError,
        "decompresses to more than",
    ),
    "decompression bomb (ratio)": Case(
        lambda t, g, k, m: _bomb_bundle(g, 64 << 20, 64 << 20),
        BundleFormatError,
        "decompression bomb",
    ),
    "decompression bomb (overlong frame)": Case(
        lambda t, g, k, m: _bomb_bundle(g, 200_000, 64 << 20),
        BundleIntegrityError,
        "decompresses to more than 200001 bytes",
    ),
    # entries
    "entry key/id mismatch": Case(
        lambda t, g, k, m: with_entries(
            g,
            replace_entry(
                0, key={**g.manifest.entries[0].key, "pdl": not g.manifest.entries[0].key["pdl"]}
            ),
        ),
        BundleIntegrityError,
        "canonical JSON gives id",
    ),
    "entry symbol mismatch": Case(
        lambda t, g, k, m: with_entries(g, replace_entry(0, symbol="router_gemm_" + "0" * 20)),
        BundleIntegrityError,
        "the key's symbol is",
    ),
    "entry key field of wrong type": Case(
        lambda t, g, k, m: with_entries(
            g, replace_entry(0, key={**g.manifest.entries[0].key, "split_k": "6"})
        ),
        BundleIntegrityError,
        "key field 'split_k' must be int",
    ),
    "entry key of another family": Case(
        lambda t, g, k, m: with_entries(
            g, replace_entry(0, key={**g.manifest.entries[0].key, "family": "gemm"})
        ),
        BundleIntegrityError,
        "key says family 'gemm'",
    ),
    "entry of an unlisted family": Case(
        lambda t, g, k, m: rebuilt(g.manifest, g.library, families={}),
        BundleFormatError,
        "family not listed",
    ),
    "entry missing a field": Case(
        lambda t, g, k, m: edited_json(g, lambda d: d["entries"][0].pop("sha256")),
        BundleFormatError,
        r"missing fields \['sha256'\]",
    ),
    "missing entry (symbol not exported)": Case(
        lambda t, g, k, m: with_entries(
            g,
            lambda entries: (
                entries
                + [
                    Entry(
                        "router_gemm",
                        _other_key(g).fields(),
                        _other_key(g).id,
                        _other_key(g).symbol,
                        "ab" * 32,
                        1,
                    )
                ]
            ),
        ),
        BundleIntegrityError,
        "does not export __tvm_ffi_router_gemm_.*missing entry",
    ),
    "entry of an unknown ABI": Case(
        lambda t, g, k, m: edited_json(g, lambda d: d["entries"][0].update(abi="cdecl")),
        BundleFormatError,
        r"abi 'cdecl' is not one of \('tvm_ffi', 'c'\)",
    ),
    "entry claiming the C ABI for a TVM-FFI key": Case(
        lambda t, g, k, m: with_entries(g, replace_entry(0, abi="c")),
        BundleIntegrityError,
        "abi 'c', the key's is 'tvm_ffi'",
    ),
    "entry symbol with ..": Case(
        lambda t, g, k, m: with_entries(g, replace_entry(0, symbol="../../lib/evil")),
        BundleFormatError,
        "not a plain C identifier",
    ),
    "entry symbol an absolute path": Case(
        lambda t, g, k, m: with_entries(g, replace_entry(0, symbol="/etc/ld.so.preload")),
        BundleFormatError,
        "not a plain C identifier",
    ),
    "entry key id with a slash": Case(
        lambda t, g, k, m: with_entries(g, replace_entry(0, key_id="../" + "a" * 17)),
        BundleFormatError,
        "is not hex",
    ),
    "library sha256 path traversal": Case(
        lambda t, g, k, m: edited_json(
            g, lambda d: d["library"].update(sha256="../../../../tmp/evil")
        ),
        BundleFormatError,
        "is not 64 hex",
    ),
    "library sha256 with a trailing newline": Case(
        lambda t, g, k, m: edited_json(
            g, lambda d: d["library"].update(sha256=d["library"]["sha256"] + "\n")
        ),
        BundleFormatError,
        "is not 64 hex",
    ),
    "entry symbol with a trailing newline": Case(
        lambda t, g, k, m: with_entries(
            g, replace_entry(0, symbol=g.manifest.entries[0].symbol + "\n")
        ),
        BundleFormatError,
        "not a plain C identifier",
    ),
    "arch with a path": Case(
        lambda t, g, k, m: edited_json(g, lambda d: d.update(arch="../sm_90a")),
        BundleFormatError,
        "not an architecture name",
    ),
    # compatibility
    "wrong GPU architecture": Case(
        lambda t, g, k, m: g.data,
        IncompatibleBundleError,
        "built for sm_90a, this GPU needs sm_100a",
        gpu_arch="sm_100a",
    ),
    "architecture unknown here": Case(
        lambda t, g, k, m: rebuilt(g.manifest, g.library, arch="sm_75"),
        IncompatibleBundleError,
        "built for sm_75, an architecture this cute-aot does not know",
    ),
    "toolchain mismatch (tvm-ffi)": Case(
        lambda t, g, k, m: rebuilt(
            g.manifest, g.library, toolchain={**g.manifest.toolchain, "tvm_ffi": "0.0.1"}
        ),
        IncompatibleBundleError,
        "built with apache-tvm-ffi 0.0.1",
    ),
    "toolchain field of wrong type": Case(
        lambda t, g, k, m: rebuilt(
            g.manifest, g.library, toolchain={**g.manifest.toolchain, "tvm_ffi": 15}
        ),
        BundleFormatError,
        "toolchain field 'tvm_ffi' must be str",
    ),
    # the library, read as ELF before any dlopen
    "library for another CPU": Case(
        lambda t, g, k, m: rebuilt(
            g.manifest,
            g.library[:E_MACHINE_OFFSET]
            + struct.pack("<H", EM_AARCH64)
            + g.library[E_MACHINE_OFFSET + 2 :],
        ),
        IncompatibleBundleError,
        "built for aarch64 CPUs",
    ),
    "library not ELF": Case(
        lambda t, g, k, m: rebuilt(g.manifest, b"MZ" + bytes(4096)),
        BundleIntegrityError,
        "not a usable shared library: not an ELF file",
    ),
    "library ELF truncated": Case(
        lambda t, g, k, m: rebuilt(g.manifest, g.library[:4096]),
        BundleIntegrityError,
        "not a usable shared library",
    ),
    "library needs a shared CUDA runtime": Case(
        lambda t, g, k, m: rebuilt(
            g.manifest,
            gcc_library(t, [e.symbol for e in g.manifest.entries], needed=["libcudart.so.13"]),
        ),
        BundleIntegrityError,
        "needs 'libcudart.so.13', which a bundle library must not",
    ),
    "library with a RUNPATH": Case(
        lambda t, g, k, m: rebuilt(
            g.manifest,
            gcc_library(t, [e.symbol for e in g.manifest.entries], runpath="/tmp/anywhere"),
        ),
        BundleIntegrityError,
        "carries a RUNPATH",
    ),
    "libtvm_ffi missing (tvm-ffi not installed)": Case(
        lambda t, g, k, m: m.monkeypatch.setitem(sys.modules, "tvm_ffi", None) or g.data,
        MissingLibraryError,
        "needs apache-tvm-ffi",
    ),
    "needed library not resolvable": Case(
        lambda t, g, k, m: _unresolvable(m.monkeypatch) or g.data,
        MissingLibraryError,
        "needs libtvm_ffi.so, which is not found on this machine",
    ),
    "glibc too old for the library": Case(
        lambda t, g, k, m: (
            m.monkeypatch.setattr(loader, "_glibc_version", lambda: (2, 17)) or g.data
        ),
        IncompatibleBundleError,
        r"needs GLIBC_2\.\d+, this machine has glibc 2\.17",
    ),
    # trust
    "unsigned, signature required": Case(
        lambda t, g, k, m: _require(m.settings, k) or g.data,
        SignatureError,
        "not signed and CUTE_AOT_REQUIRE_SIGNATURE",
    ),
    "signed by an untrusted key": Case(
        lambda t, g, k, m: _require(m.settings, k) or _signed(g, k.stranger),
        SignatureError,
        "not trusted",
    ),
    "signed, then tampered": Case(
        lambda t, g, k, m: (
            m.settings(CUTE_AOT_TRUSTED_KEYS=str(k.release_pub))
            or _signed(g, k.release, bundle_version="9.9.9")
        ),
        SignatureError,
        "does not match the manifest",
    ),
    "malformed signature record": Case(
        lambda t, g, k, m: (
            _require(m.settings, k)
            or edited_json(
                g, lambda d: d.update(signature={"algorithm": "rsa", "key_id": "x", "value": "y"})
            )
        ),
        SignatureError,
        "unsupported or malformed signature",
    ),
}


def _payload_swapped(good: Good, payload: bytes) -> bytes:
    raw = json.loads(good.manifest.to_json())
    raw["payload"] = {
        "codec": "zstd",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "size": len(payload),
    }
    return raw_container(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode(), payload)


def _write(tmp_path: Path, data: bytes, name: str = f"bad-{ARCH}.cuteaot") -> Path:
    path = tmp_path / "bundles" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", list(MATRIX))
def test_corruption_is_a_typed_error_before_any_dlopen(
    name, good, keys, tmp_path, fresh_runtime, trust_env, no_dlopen, monkeypatch
):
    case = MATRIX[name]
    path = _write(tmp_path, case.make(tmp_path, good, keys, Patches(monkeypatch, trust_env)))
    with pytest.raises(case.error, match=case.message) as info:
        open_bundle(path, case.gpu_arch)
    assert str(path) in str(info.value)  # the error names the file
    assert no_dlopen == []
    libs = fresh_runtime / "libs"
    assert not libs.exists() or not any(libs.iterdir())  # nothing extracted


@pytest.mark.parametrize("name", list(MATRIX))
def test_auto_mode_skips_a_bad_bundle_with_one_warning_and_falls_back(
    name, good, keys, tmp_path, fresh_runtime, trust_env, no_dlopen, monkeypatch
):
    case = MATRIX[name]
    path = _write(tmp_path, case.make(tmp_path, good, keys, Patches(monkeypatch, trust_env)))
    trust_env(CUTE_AOT_BUNDLES=str(path))
    compiled = object()
    monkeypatch.setattr(jit, "compiled_function", lambda key, arch, publish: compiled)
    key = family("router_gemm").Key.from_fields(good.manifest.entries[0].key)
    # the registry loads for the architecture of this process's GPU: a fake one of the case's
    with fake_gpu_of(case.gpu_arch), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        REGISTRY.load_from_env()
        REGISTRY.load_from_env()
        assert key_function(key, case.gpu_arch) is compiled  # JIT, not the bad bundle
        assert key_function(key, case.gpu_arch) is compiled
    skipped = [w for w in seen if "skipping bundle" in str(w.message)]
    assert len(skipped) == 1, [str(w.message) for w in seen]
    assert str(path) in str(skipped[0].message)
    assert REGISTRY.bundles == []
    assert no_dlopen == []


def test_aot_mode_raises_on_a_bad_bundle_in_the_bundle_path(
    good, tmp_path, fresh_runtime, settings_scope
):
    path = _write(tmp_path, flip(good.data, len(good.data) - 1000))
    settings_scope(CUTE_AOT_BUNDLES=str(path.parent))
    set_mode("aot")
    with pytest.raises(BundleIntegrityError, match="payload hash mismatch"):
        REGISTRY.load_from_env()


def test_a_folder_loads_its_good_bundles_and_skips_the_bad_one(
    good, tmp_path, fresh_runtime, monkeypatch
):
    folder = tmp_path / "bundles"
    folder.mkdir()
    shutil.copy(good.path, folder / good.path.name)
    # read first ("aa"), before any copy of its library was verified and extracted
    (folder / "aa-bad-sm_90a.cuteaot").write_bytes(good.data[:-1])
    with pytest.warns(RuntimeWarning, match="skipping bundle .*aa-bad-sm_90a.cuteaot.*truncated"):
        loaded = REGISTRY.load(folder, gpu_arch=ARCH)
    assert [b.path.name for b in loaded] == [good.path.name]
    entry = good.manifest.entries[0]
    served = REGISTRY.bundle_function(entry.family, entry.key_id, ARCH)
    assert served is loaded[0].function(entry.key_id)


def test_an_explicit_bad_file_raises(good, tmp_path, fresh_runtime):
    path = _write(tmp_path, good.data[:-1])
    with pytest.raises(BundleFormatError, match="truncated payload"):
        REGISTRY.load(path, gpu_arch=ARCH)


def test_the_good_bundle_passes_every_check_and_loads(good, fresh_runtime, trust_env):
    verified = loader.verify_bundle(good.path, ARCH)
    assert verified.dynamic.needed == ("libtvm_ffi.so", "libc.so.6", "ld-linux-x86-64.so.2")
    assert {f"__tvm_ffi_{e.symbol}" for e in good.manifest.entries} <= verified.dynamic.functions
    bundle = open_bundle(good.path, ARCH)
    for entry in good.manifest.entries:  # each entry reaches its own key's code
        assert bundle.function(entry.key_id)() == stub_value(entry.key_id)
    assert Path(bundle.library_path).read_bytes() == good.library
    assert Path(bundle.library_path).parent == fresh_runtime / "libs"


def test_reading_errors_stay_in_one_hierarchy(good, fresh_runtime, tmp_path):
    """What a server catches: every refusal of a bundle is a BundleError, every error of ours a
    CuteAotError. Each is caused for real."""
    other_arch = _write(tmp_path, good.data, name="other-sm_100a.cuteaot")
    damaged = bytearray(good.data)
    damaged[-1] ^= 0xFF  # the payload
    faults = [
        (lambda: read_manifest(_write(tmp_path, good.data[:-1])), BundleSizeError),
        (lambda: read_bundle(_write(tmp_path, bytes(damaged))), BundleIntegrityError),
        (lambda: open_bundle(other_arch, "sm_100a"), OtherArchError),
    ]
    for cause, kind in faults:
        with pytest.raises(BundleError) as caught:
            cause()
        assert type(caught.value) is kind and isinstance(caught.value, CuteAotError)
    garbage = tmp_path / "key.pem"
    garbage.write_text("not a key")
    with pytest.raises(CuteAotError) as caught:
        signing.load_private_key(garbage)
    assert type(caught.value) is KeyFileError


def test_not_a_regular_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe-sm_90a.cuteaot"
    os.mkfifo(fifo)
    with pytest.raises(BundleFormatError):
        # opening a FIFO for reading blocks until a writer comes: give it one that never writes
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        try:
            read_manifest(fifo)
        finally:
            os.close(fd)
    folder = tmp_path / "dir-sm_90a.cuteaot"
    folder.mkdir()
    with pytest.raises(BundleFormatError, match="cannot read"):
        read_manifest(folder)


# -- bounded decompression -----------------------------------------------------------------------
def test_decompression_stops_one_byte_past_the_promised_size(good, tmp_path):
    path = _write(tmp_path, _bomb_bundle(good, 1 << 20, 1 << 30))  # 1 GiB of zeros, ~30 KiB
    tracemalloc.start()
    try:
        with pytest.raises(BundleIntegrityError, match="more than 1048577 bytes"):
            read_bundle(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak} bytes: decompression was not bounded"


def test_short_reads_are_handled(good, monkeypatch):
    """stream_reader.read(n) may return fewer than n bytes; the loop must still get it all."""
    real_class = zstandard.ZstdDecompressor
    real = real_class.stream_reader

    class Trickle:
        def __init__(self, reader):
            self.reader = reader

        def read(self, n):
            return self.reader.read(min(n, 777))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.reader.close()

    class Decompressor:
        def __init__(self, **kwargs):
            self.inner = real_class(**kwargs)

        def stream_reader(self, data, **kwargs):
            return Trickle(real(self.inner, data, **kwargs))

    monkeypatch.setattr(bundle_format.zstandard, "ZstdDecompressor", Decompressor)
    manifest, library = read_bundle(good.path)
    assert library == good.library


# -- extraction stays in the cache dir; nothing temporary survives ---------------------------------
def test_a_planted_link_in_the_cache_is_replaced_not_followed(good, fresh_runtime, tmp_path):
    victim = tmp_path / "victim.so"
    victim.write_bytes(b"do not touch")
    libs = fresh_runtime / "libs"
    libs.mkdir(parents=True)
    target = libs / f"{good.manifest.library['sha256']}.so"
    target.symlink_to(victim)
    bundle = open_bundle(good.path, ARCH)
    assert victim.read_bytes() == b"do not touch"
    assert not target.is_symlink() and target.read_bytes() == good.library
    assert bundle.library_path == str(target)


def test_a_damaged_cache_file_of_the_right_size_is_replaced(good, fresh_runtime):
    libs = fresh_runtime / "libs"
    libs.mkdir(parents=True)
    target = libs / f"{good.manifest.library['sha256']}.so"
    target.write_bytes(bytes(len(good.library)))  # same size, wrong bytes
    bundle = open_bundle(good.path, ARCH)
    assert target.read_bytes() == good.library
    first = good.manifest.entries[0].key_id
    assert bundle.function(first)() == stub_value(first)


def test_a_libs_link_leading_outside_the_cache_is_not_written_through(
    good, fresh_runtime, tmp_path
):
    outside = tmp_path / "outside"
    outside.mkdir()
    fresh_runtime.mkdir(parents=True)
    (fresh_runtime / "libs").symlink_to(outside)
    with pytest.warns(RuntimeWarning, match="outside the cache dir"):
        bundle = open_bundle(good.path, ARCH)
    assert list(outside.iterdir()) == []
    assert bundle.library_path.startswith("memfd:")
    first = good.manifest.entries[0].key_id
    assert bundle.function(first)() == stub_value(first)


def test_a_failed_write_leaves_no_temporary_file(good, fresh_runtime, monkeypatch, tmp_path):
    from cute_aot.artifacts.core import atomic

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", broken_fsync)
    before = _temporary_names()
    with pytest.warns(RuntimeWarning, match="No space left"):
        bundle = open_bundle(good.path, ARCH)  # falls back to memory
    libs = fresh_runtime / "libs"
    assert list(libs.iterdir()) == []  # neither the library nor a temporary of it
    assert _temporary_names() == before  # and nothing in the system's temporary folder
    first = good.manifest.entries[0].key_id
    assert bundle.function(first)() == stub_value(first)


def _temporary_names() -> set[str]:
    import tempfile

    return {name for name in os.listdir(tempfile.gettempdir()) if "cute-aot" in name}


def test_a_failed_signing_keeps_the_old_file_and_no_temporary(good, keys, tmp_path, monkeypatch):
    from cute_aot.artifacts.core import atomic

    path = tmp_path / good.path.name
    shutil.copy(good.path, path)
    monkeypatch.setattr(
        atomic.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error"))
    )
    with pytest.raises(BundleError, match="cannot rewrite"):
        signing.sign_bundle(path, keys.release)
    assert path.read_bytes() == good.data
    assert os.listdir(tmp_path) == [path.name]


# -- signatures ----------------------------------------------------------------------------------
def test_sign_and_verify(good, keys, tmp_path, trust_env, fresh_runtime):
    path = tmp_path / good.path.name
    shutil.copy(good.path, path)
    signed = signing.sign_bundle(path, keys.release)
    key_id = hashlib.sha256(
        keys.release.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
    ).hexdigest()[:32]
    assert signed.signature["key_id"] == key_id
    assert read_manifest(path) == signed
    # the payload bytes are untouched: only the manifest changed
    assert path.read_bytes().endswith(good.payload)
    assert dataclasses.replace(signed, signature=None) == good.manifest
    trusted = signing.trusted_keys(str(keys.release_pub))
    assert signing.verify_signature(signed, trusted).key_id == key_id
    assert signing.describe_signature(signed, trusted) == (
        f"ed25519 key {key_id}: valid, trusted ({keys.release_pub})"
    )
    assert "NOT VERIFIED" in signing.describe_signature(signed, {})
    assert signing.describe_signature(good.manifest, trusted) is None
    trust_env(CUTE_AOT_REQUIRE_SIGNATURE="1", CUTE_AOT_TRUSTED_KEYS=str(keys.release_pub.parent))
    bundle = open_bundle(path, ARCH)
    assert bundle.signer is not None and bundle.signer.key_id == key_id


def test_unsigned_manifests_are_unchanged_by_the_signature_field(good):
    assert b"signature" not in good.manifest.to_json()
    assert parse_manifest(good.manifest.to_json()) == good.manifest


def test_the_signature_covers_every_manifest_field(good, keys):
    signed = signing.sign_manifest(good.manifest, keys.release)
    trusted = {k.key_id: k for k in signing.load_public_keys(keys.release_pub)}
    changes = {
        "name": "other",
        "arch": "sm_100a",
        "bundle_version": "0.0.0",
        "created_by": "someone",
        "toolchain": {},
        "families": {},
        "library": {**good.manifest.library, "sha256": "0" * 64},
        "payload": {**good.manifest.payload, "size": 1},
        "entries": good.manifest.entries[:1],
        "format_version": 2,
    }
    assert set(changes) | {"signature"} == {f.name for f in dataclasses.fields(Manifest)}
    for name, value in changes.items():
        with pytest.raises(SignatureError, match="does not match"):
            signing.verify_signature(dataclasses.replace(signed, **{name: value}), trusted)


def test_unknown_signer_loads_as_unsigned_when_not_required(
    good, keys, tmp_path, trust_env, fresh_runtime
):
    path = _write(tmp_path, _signed(good, keys.stranger))
    trust_env(CUTE_AOT_TRUSTED_KEYS=str(keys.release_pub))
    with pytest.warns(
        RuntimeWarning, match="not in CUTE_AOT_TRUSTED_KEYS; loading it as an unsigned"
    ):
        bundle = open_bundle(path, ARCH)
    assert bundle.signer is None


def test_required_signature_without_trusted_keys_refuses_everything(
    good, keys, tmp_path, trust_env, no_dlopen
):
    path = _write(tmp_path, _signed(good, keys.release))
    trust_env(CUTE_AOT_REQUIRE_SIGNATURE="yes")
    with pytest.raises(SignatureError, match="CUTE_AOT_TRUSTED_KEYS is empty"):
        open_bundle(path, ARCH)


@pytest.mark.parametrize(
    "value, required",
    [("", False), ("0", False), ("off", False), ("1", True), ("true", True), ("typo", True)],
)
def test_require_signature_values(value, required, trust_env):
    trust_env(CUTE_AOT_REQUIRE_SIGNATURE=value)
    assert signing.signature_required() is required


def test_trusted_key_files(keys, tmp_path):
    bundle_of_keys = tmp_path / "keys.pem"
    other = Ed25519PrivateKey.generate()
    bundle_of_keys.write_bytes(_public_pem(keys.release) + b"\n" + _public_pem(other))
    assert len(signing.load_public_keys(bundle_of_keys)) == 2
    assert len(signing.trusted_keys(f"{keys.release_pub.parent}{os.pathsep}{bundle_of_keys}")) == 2
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cases = {
        "missing.pem": (None, "does not exist"),
        "rsa.pem": (_public_pem(rsa_key), "ed25519 key is needed"),
        "private.pem": (_private_pem(keys.release), "private key"),
        "empty.pem": (b"", "no PEM block"),
        "garbage.pem": (
            b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            "not a PEM public key",
        ),
    }
    for name, (data, message) in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(KeyFileError, match=message) as info:
            signing.trusted_keys(str(tmp_path / name))
        assert name in str(info.value)


def test_private_key_files(keys, tmp_path):
    assert signing.public_key_id(
        signing.load_private_key(keys.folder / "release.pem").public_key()
    ) == (signing.public_key_id(keys.release.public_key()))
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        keys.release.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(KeyFileError, match="encrypted"):
        signing.load_private_key(encrypted)
    with pytest.raises(KeyFileError, match="not a PEM private key"):
        signing.load_private_key(keys.release_pub)


@pytest.mark.slow
def test_aot_build_sign_key_signs_what_it_writes(keys, tmp_path, fresh_runtime, trust_env):
    from click.testing import CliRunner

    from cute_aot.aot.cli import main
    from cute_aot.runtime.misses import miss_log_path, record_miss

    key = dispatch(1, 8, 256, ARCH)  # one small dot-product kernel
    record_miss(key, ARCH, {"m": 1, "k": 256, "n": 8})
    out = tmp_path / "signed"
    args = ["--from-misses", str(miss_log_path()), "--out", str(out), "--quiet", "-j", "1"]
    result = CliRunner().invoke(main, [*args, "--sign-key", str(keys.folder / "release.pem")])
    assert result.exit_code == 0, result.output
    (path,) = out.glob("*.cuteaot")
    manifest = read_manifest(path)
    assert "signed" in result.output and manifest.signature["key_id"] in result.output
    trust_env(CUTE_AOT_REQUIRE_SIGNATURE="1", CUTE_AOT_TRUSTED_KEYS=str(keys.release_pub))
    assert open_bundle(path, ARCH).signer.key_id == manifest.signature["key_id"]
    bad = CliRunner().invoke(main, [*args, "--sign-key", str(keys.release_pub)])  # cached build
    assert bad.exit_code == 1 and "not a PEM private key" in bad.output


# -- verified once, trusted after ----------------------------------------------------------------
def _library_copy(cache: Path, good) -> Path:
    return cache / "libs" / f"{good.manifest.library['sha256']}.so"


def test_a_verified_private_copy_is_trusted_and_keys_are_derived_on_use(
    good, tmp_path, fresh_runtime
):
    from cute_aot.runtime import loader

    first = open_bundle(good.path, ARCH)  # verifies in full, extracts, records what it verified
    assert first.key_class is None
    assert _library_copy(fresh_runtime, good).with_suffix(".verified.json").is_file()
    loader._loaded.clear()  # as a new process would start
    again = open_bundle(good.path, ARCH)
    assert again.key_class is loader.installed_key_class  # ids re-derived entry by entry
    # Not verified again: a copy whose payload no longer matches its manifest's hash, which full
    # verification refuses (test_reverify_verifies_every_load), opens too, from the manifest.
    damaged = _write(tmp_path, flip(good.data, len(good.data) - 1000))
    assert open_bundle(damaged, ARCH).key_class is loader.installed_key_class
    entry = good.manifest.entries[0]
    assert type(again.function(entry.key_id)).__name__ == "Function"
    # a manifest entry whose key does not re-derive is refused when it is first asked for
    forged = dataclasses.replace(entry, key={**entry.key, "pdl": not entry.key["pdl"]})
    again.entries[entry.key_id] = forged
    again._functions.clear()
    with pytest.raises(BundleIntegrityError, match="canonical JSON gives id"):
        again.function(entry.key_id)


@pytest.mark.parametrize("weaken", ["group-writable copy", "group-writable folder", "no record"])
def test_a_copy_others_could_have_written_is_verified_again(weaken, good, tmp_path, fresh_runtime):
    from cute_aot.runtime import loader

    open_bundle(good.path, ARCH)
    loader._loaded.clear()
    copy = _library_copy(fresh_runtime, good)
    if weaken == "group-writable copy":
        copy.chmod(0o575)
    elif weaken == "group-writable folder":
        copy.parent.chmod(0o775)
    else:
        copy.with_suffix(".verified.json").unlink()
    # Verified again, in full: a copy with a damaged payload is refused by its hash, which
    # only full verification reads; the good file then opens by the full path.
    damaged = _write(tmp_path, flip(good.data, len(good.data) - 1000))
    with pytest.raises(BundleIntegrityError, match="payload hash mismatch"):
        open_bundle(damaged, ARCH)
    assert open_bundle(good.path, ARCH).key_class is None  # the full path, keys derived at open


def test_reverify_verifies_every_load(good, tmp_path, fresh_runtime, settings_scope):
    from cute_aot.runtime import loader

    open_bundle(good.path, ARCH)
    loader._loaded.clear()
    damaged = _write(tmp_path, flip(good.data, len(good.data) - 1000))  # payload, not manifest
    # the library it names was verified already: what would run is exactly that library
    assert open_bundle(damaged, ARCH).library_path == str(_library_copy(fresh_runtime, good))
    settings_scope(CUTE_AOT_REVERIFY="1")
    with pytest.raises(BundleIntegrityError, match="payload hash mismatch"):
        open_bundle(damaged, ARCH)


def test_each_entry_must_export_the_entry_point_of_its_abi(good, tmp_path):
    """A C-ABI entry is served through `<symbol>_cuda_load` and its siblings, a TVM-FFI entry
    through `__tvm_ffi_<symbol>`: the library must export the one its ABI names."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    source = tmp_path / "c_abi.c"
    source.write_text("int cute_compile_abc_cuda_load(void) { return 0; }\n")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(tmp_path / "c_abi.so"), str(source)], check=True
    )
    info = read_dynamic((tmp_path / "c_abi.so").read_bytes())
    entry = Entry(
        "cute_compile",
        {"family": "cute_compile"},
        "ab" * 10,
        "cute_compile_abc",
        "ab" * 32,
        1,
        abi="c",
    )

    def manifest(*entries):
        return dataclasses.replace(good.manifest, entries=entries)

    check_dynamic(tmp_path, manifest(entry), info)
    as_tvm_ffi = dataclasses.replace(entry, abi="tvm_ffi")
    with pytest.raises(BundleIntegrityError, match="does not export __tvm_ffi_cute_compile_abc"):
        check_dynamic(tmp_path, manifest(as_tvm_ffi), info)
    other = dataclasses.replace(entry, symbol="cute_compile_def", key_id="cd" * 10)
    with pytest.raises(BundleIntegrityError, match="does not export cute_compile_def_cuda_load"):
        check_dynamic(tmp_path, manifest(entry, other), info)
