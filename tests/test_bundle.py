import struct

import pytest

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.bundle import MAGIC, parse_manifest, read_bundle, read_manifest
from cute_aot.artifacts.bundle_writer import write_bundle
from cute_aot.artifacts.core.errors import BundleFormatError, BundleIntegrityError, CuteAotError
from cute_aot.artifacts.manifest import FORMAT_VERSION, Entry, Manifest
from cute_aot.kernels.router_gemm import RouterGemmKey

LIBRARY = b"\x7fELF" + bytes(range(256)) * 64


def _manifest() -> Manifest:
    key = RouterGemmKey("dot", 1, 4096, 128, 0, 0, True)
    entry = Entry("router_gemm", key.fields(), key.id, key.symbol, "ab" * 32, 1234)
    return Manifest(
        name="test",
        arch="sm_90a",
        bundle_version="1.2.3",
        created_by="cute-aot test",
        toolchain=toolchain.fingerprint(),
        families={"router_gemm": {"version": 1, "source_hash": "cd" * 32}},
        library={},
        payload={},
        entries=(entry,),
    )


@pytest.fixture
def bundle(tmp_path):
    path = tmp_path / "test-sm_90a.cuteaot"
    written = write_bundle(path, _manifest(), LIBRARY)
    return path, written


def test_round_trip(bundle):
    path, written = bundle
    manifest, library = read_bundle(path)
    assert library == LIBRARY
    assert manifest == written
    assert manifest.library["size"] == len(LIBRARY)
    assert manifest.payload["codec"] == "zstd"
    assert manifest.payload["size"] < len(LIBRARY)  # compressed
    assert read_manifest(path) == manifest
    assert manifest.entries[0].key == RouterGemmKey("dot", 1, 4096, 128, 0, 0, True).fields()


def test_manifest_json_round_trip():
    manifest = _manifest()
    assert parse_manifest(manifest.to_json()) == manifest


def test_writing_twice_gives_identical_bytes(tmp_path):
    a, b = tmp_path / "a.cuteaot", tmp_path / "b.cuteaot"
    write_bundle(a, _manifest(), LIBRARY)
    write_bundle(b, _manifest(), LIBRARY)
    assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary left behind


def _corrupt(path, offset, value=None):
    data = bytearray(path.read_bytes())
    data[offset] = value if value is not None else data[offset] ^ 0xFF
    path.write_bytes(bytes(data))


def test_truncated_file(bundle):
    path, _ = bundle
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(BundleFormatError, match="truncated payload"):
        read_bundle(path)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(BundleFormatError, match="truncated"):
        read_manifest(path)


def test_flipped_byte_in_payload(bundle):
    path, _ = bundle
    _corrupt(path, path.stat().st_size - 5)
    with pytest.raises(BundleIntegrityError, match="payload hash"):
        read_bundle(path)


def test_flipped_byte_in_manifest(bundle):
    path, _ = bundle
    _corrupt(path, 64 + 10)
    with pytest.raises(BundleIntegrityError, match="manifest hash"):
        read_manifest(path)


def test_bad_magic_and_unknown_version(bundle):
    path, _ = bundle
    data = bytearray(path.read_bytes())
    path.write_bytes(b"NOTABNDL" + bytes(data[8:]))
    with pytest.raises(BundleFormatError, match="magic"):
        read_manifest(path)
    data[8:12] = struct.pack("<I", FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(BundleFormatError, match="unknown bundle format version"):
        read_manifest(path)


def test_trailing_bytes(bundle):
    path, _ = bundle
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(BundleFormatError, match="trailing"):
        read_bundle(path)


def test_missing_file(tmp_path):
    with pytest.raises(BundleFormatError, match="cannot read"):
        read_manifest(tmp_path / "nope.cuteaot")


def test_manifest_schema_errors_are_typed():
    raw = _manifest().to_json()
    for bad in [
        b"[]",
        b"{",
        raw.replace(b'"format_version":1', b'"format_version":99'),
        raw.replace(b'"name":"test"', b'"name":7'),
        raw.replace(b'"key_id"', b'"kid"'),
    ]:
        with pytest.raises(BundleFormatError):
            parse_manifest(bad)


def test_magic_is_what_the_writer_writes(bundle):
    path, _ = bundle
    assert path.read_bytes().startswith(MAGIC)


def test_a_damaged_bundle_is_refused_with_an_error_of_the_one_base(bundle, tmp_path):
    path, _ = bundle
    data = bytearray(path.read_bytes())
    truncated = tmp_path / "truncated-sm_90a.cuteaot"
    truncated.write_bytes(data[:-1])
    data[len(MAGIC) + 64] ^= 0xFF  # a byte of the manifest
    flipped = tmp_path / "flipped-sm_90a.cuteaot"
    flipped.write_bytes(data)
    for damaged, kind in ((truncated, BundleFormatError), (flipped, BundleIntegrityError)):
        with pytest.raises(CuteAotError) as caught:
            read_bundle(damaged)
        assert isinstance(caught.value, kind), caught.value
