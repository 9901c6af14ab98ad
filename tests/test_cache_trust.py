"""The release side of the trust model: a shared build cache is trusted only as far as its
writers (signed records, `--cache-sign-key` / `--cache-trusted-keys`), and `aot-build merge
--sign-key` signs exactly like a plain `aot-build --sign-key`.

Builds use the stand-in compile worker of test_build_scale (a tiny gcc object per key), so the
real pool, cache, link, pack and CLI code runs in seconds without cutlass.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cute_aot.aot import build as build_module
from cute_aot.aot import cli
from cute_aot.aot.build_cache import BuildCache
from cute_aot.artifacts import signing
from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.bundle_writer import rewrite_manifest
from cute_aot.artifacts.core.errors import SignatureError
from tests.test_build_scale import COMPILE_LOG_ENV, PLAN, bundle_bytes, fake_build, fake_compile

TOTAL_KEYS = sum(map(len, PLAN.values()))
BUNDLES = len(PLAN)  # one per architecture


@dataclass(frozen=True)
class Keys:
    release: Ed25519PrivateKey  # the release pipeline's cache writer
    release_private: Path
    release_public: Path
    stranger_private: Path  # anyone else who can write the shared cache folder

    def trusted(self) -> dict[str, signing.TrustedKey]:
        return signing.trusted_keys(str(self.release_public))


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Keys:
    folder = tmp_path_factory.mktemp("keys")
    release, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    (folder / "release.pem").write_bytes(_private_pem(release))
    (folder / "stranger.pem").write_bytes(_private_pem(stranger))
    (folder / "trusted").mkdir()
    (folder / "trusted" / "release.pub.pem").write_bytes(_public_pem(release))
    return Keys(
        release,
        folder / "release.pem",
        folder / "trusted" / "release.pub.pem",
        folder / "stranger.pem",
    )


@pytest.fixture
def compile_log(tmp_path, monkeypatch):
    """Lines `arch symbol` for every stand-in compile, in this process and in its workers."""
    path = tmp_path / "compiles.log"
    path.touch()
    monkeypatch.setenv(COMPILE_LOG_ENV, str(path))
    return lambda: path.read_text().splitlines()


def _records(root: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in sorted(root.rglob("*.json"))}


def _fill(root: Path, out: Path, sign_key: Ed25519PrivateKey | None) -> BuildCache:
    cache = BuildCache(root, sign_key=sign_key)
    outcome = fake_build(out, cache=cache)
    assert not outcome.failed and cache.misses == TOTAL_KEYS
    return cache


def _must_not_link(*args, **kwargs):
    raise AssertionError("every bundle should have come from the trusted cache")


# -- the build cache -----------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["unsigned", "stranger"])
def test_a_cache_filled_by_an_untrusted_writer_is_not_used(tmp_path, keys, compile_log, writer):
    sign_key = signing.load_private_key(keys.stranger_private) if writer == "stranger" else None
    _fill(tmp_path / "cache", tmp_path / "writer", sign_key)
    assert len(compile_log()) == TOTAL_KEYS
    before = _records(tmp_path / "cache")
    assert len(before) == TOTAL_KEYS + BUNDLES

    release = BuildCache(tmp_path / "cache", trusted_keys=keys.trusted())
    outcome = fake_build(tmp_path / "release", cache=release)
    assert len(compile_log()) == 2 * TOTAL_KEYS  # every key compiled afresh
    assert not any(row.get("cached") for row in outcome.rows)
    assert (release.hits, release.misses) == (0, TOTAL_KEYS)
    assert release.untrusted == TOTAL_KEYS + BUNDLES  # objects and linked bundles alike
    assert bundle_bytes(tmp_path / "release") == bundle_bytes(tmp_path / "writer")
    # First-wins as always: the refused entries stay, nothing is overwritten.
    assert _records(tmp_path / "cache") == before


def test_a_cache_filled_by_a_trusted_writer_is_used(tmp_path, keys, compile_log, monkeypatch):
    writer = _fill(tmp_path / "cache", tmp_path / "writer", keys.release)
    assert writer.untrusted == 0 and len(compile_log()) == TOTAL_KEYS
    record = json.loads(next((tmp_path / "cache" / "objects").rglob("*.json")).read_text())
    assert record["signature"]["key_id"] in keys.trusted()

    monkeypatch.setattr(build_module, "pack_bundle", _must_not_link)
    release = BuildCache(tmp_path / "cache", trusted_keys=keys.trusted())
    outcome = fake_build(tmp_path / "release", cache=release)
    assert len(compile_log()) == TOTAL_KEYS  # nothing compiled, nothing linked
    assert all(row.get("cached") for row in outcome.rows)
    assert (release.hits, release.misses, release.untrusted) == (TOTAL_KEYS, 0, 0)
    assert bundle_bytes(tmp_path / "release") == bundle_bytes(tmp_path / "writer")


def _rewrite_record(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.chmod(0o644)  # published read-only
    path.write_text(json.dumps(record, sort_keys=True))


def _swap_data(record_path: Path) -> None:
    """What a cache writer without the key would do: its own bytes, a consistent record."""
    import hashlib

    data_path = record_path.with_suffix(".o")
    evil = data_path.read_bytes() + b"\0evil"
    data_path.chmod(0o644)
    data_path.write_bytes(evil)

    def describe_evil(record: dict) -> None:
        record["sha256"] = hashlib.sha256(evil).hexdigest()
        record["size"] = len(evil)
        record["row"].update(sha256=record["sha256"], size=record["size"])

    _rewrite_record(record_path, describe_evil)


TAMPERINGS = {
    "data replaced, record made consistent": _swap_data,
    "report row edited": lambda path: _rewrite_record(
        path, lambda record: record["row"].update(symbol="__evil")
    ),
    "signature stripped": lambda path: _rewrite_record(
        path, lambda record: record.pop("signature")
    ),
    "signature of another record": lambda path: _rewrite_record(
        path,
        lambda record: record.update(
            signature=json.loads(_other_record(path).read_text())["signature"]
        ),
    ),
}


def _other_record(path: Path) -> Path:
    return next(p for p in path.parents[1].rglob("*.json") if p != path)


@pytest.mark.parametrize("tamper", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_a_tampered_signed_record_is_refused(tmp_path, keys, compile_log, tamper):
    writer = _fill(tmp_path / "cache", tmp_path / "writer", keys.release)
    record_path = sorted((tmp_path / "cache" / "objects").rglob("*.json"))[0]
    arch, key = next(
        (arch, key)
        for arch, arch_keys in PLAN.items()
        for key in arch_keys
        if writer.object_digest(key, arch) == record_path.stem
    )
    tamper(record_path)
    # Intact as far as hashes go: a build that asks for no trust would take it.
    assert BuildCache(tmp_path / "cache").fetch_object(key, arch, tmp_path / "x.o") is not None

    release = BuildCache(tmp_path / "cache", trusted_keys=keys.trusted())
    outcome = fake_build(tmp_path / "release", cache=release)
    assert release.untrusted == 1 and release.hits == TOTAL_KEYS - 1
    assert compile_log()[TOTAL_KEYS:] == [f"{arch} {key.symbol}"]  # only it, compiled afresh
    (fresh,) = [row for row in outcome.rows if not row.get("cached")]
    assert fresh["symbol"] == key.symbol
    assert bundle_bytes(tmp_path / "release") == bundle_bytes(tmp_path / "writer")


def test_a_signed_record_is_bound_to_its_slot(tmp_path, keys):
    """A signed entry copied under another digest (other inputs) is refused: the digest is
    signed along with the record."""
    writer = BuildCache(tmp_path, sign_key=keys.release)
    writer.store_bundle("aa" * 32, b"bundle for inputs A")
    for suffix in (".cuteaot", ".json"):
        source = tmp_path / "bundles" / "aa" / f"{'aa' * 32}{suffix}"
        target = tmp_path / "bundles" / "bb" / f"{'bb' * 32}{suffix}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    reader = BuildCache(tmp_path, trusted_keys=keys.trusted())
    assert reader.fetch_bundle("aa" * 32) == b"bundle for inputs A"
    assert reader.fetch_bundle("bb" * 32) is None and reader.untrusted == 1


def test_cache_signatures_never_pass_for_manifest_signatures(keys):
    record = {"sha256": "0" * 64, "size": 1}
    signed = signing.sign_cache_record("bundles", "aa" * 32, record, keys.release)
    message = signing.cache_record_bytes("bundles", "aa" * 32, signed)
    assert message.startswith(signing.CACHE_RECORD_DOMAIN)
    assert not message.startswith(signing.DOMAIN) and signing.CACHE_RECORD_DOMAIN != signing.DOMAIN
    assert signing.verify_cache_record("bundles", "aa" * 32, signed, keys.trusted())
    with pytest.raises(SignatureError, match="does not match the cache record"):
        signing.verify_cache_record("objects", "aa" * 32, signed, keys.trusted())
    with pytest.raises(SignatureError, match="not trusted .--cache-trusted-keys is empty"):
        signing.verify_cache_record("bundles", "aa" * 32, signed, {})


# -- aot-build -----------------------------------------------------------------------------------


@pytest.fixture
def aot_build(tmp_path, monkeypatch, settings_scope):
    """`aot-build --from-misses <PLAN's keys> ARGS...` with the stand-in compile worker."""
    settings_scope(CUTE_AOT_CACHE_DIR=str(tmp_path / "default-cache"))
    log = tmp_path / "misses.jsonl"
    log.write_text(
        "".join(
            json.dumps({"family": key.FAMILY, "key": key.fields(), "arch": arch}) + "\n"
            for arch, keys in PLAN.items()
            for key in keys
        )
    )

    def invoke(*args):
        if args[0] != "merge":
            args = ("--from-misses", log, "-j", "1", *args)
        # the stand-in compiler as the compile worker (aot/cli.py: compile_worker)
        return CliRunner().invoke(cli.main, [*map(str, args)], obj={"worker": fake_compile})

    return invoke


def test_aot_build_cache_flags(tmp_path, keys, compile_log, aot_build):
    shared = ["--cache-dir", tmp_path / "shared", "--quiet"]
    stranger = aot_build(
        *shared, "--out", tmp_path / "a", "--cache-sign-key", keys.stranger_private
    )
    assert stranger.exit_code == 0, stranger.output
    keys_built = len(compile_log())
    assert keys_built == TOTAL_KEYS and "refused" not in stranger.output

    trust = [
        "--cache-trusted-keys",
        keys.release_public.parent,
        "--cache-sign-key",
        keys.release_private,
    ]
    release = aot_build(*shared, *trust, "--out", tmp_path / "b")
    assert release.exit_code == 0, release.output
    assert len(compile_log()) == 2 * keys_built
    assert "1 trusted key(s) only" in release.output
    refused = TOTAL_KEYS + BUNDLES  # objects and linked bundles
    assert f"{refused} entries refused as untrusted" in release.output
    assert bundle_bytes(tmp_path / "a") == bundle_bytes(tmp_path / "b")

    # A cache only the release key wrote: used, nothing refused, nothing compiled.
    own = ["--cache-dir", tmp_path / "release-cache", "--quiet", *trust]
    for out in ("c", "d"):
        result = aot_build(*own, "--out", tmp_path / out)
        assert result.exit_code == 0, result.output
    assert len(compile_log()) == 3 * keys_built
    assert f"{keys_built} objects reused, 0 not found, 0 entries refused" in result.output
    assert bundle_bytes(tmp_path / "d") == bundle_bytes(tmp_path / "a")


def test_aot_build_cache_flags_refuse_misuse(tmp_path, keys, aot_build):
    out = ["--out", tmp_path / "out", "--quiet"]
    no_cache = aot_build(*out, "--no-cache", "--cache-trusted-keys", keys.release_public)
    assert no_cache.exit_code == 2 and "leave out --no-cache" in no_cache.output
    (tmp_path / "empty").mkdir()
    empty = aot_build(*out, "--cache-trusted-keys", tmp_path / "empty")
    assert empty.exit_code == 1 and "names no public key" in empty.output
    missing = aot_build(*out, "--cache-trusted-keys", tmp_path / "nope.pem")
    assert missing.exit_code == 1 and "does not exist" in missing.output
    public = aot_build(*out, "--cache-sign-key", keys.release_public)
    assert public.exit_code == 1 and "not a PEM private key" in public.output
    assert not (tmp_path / "out").exists()  # refused before building anything


# -- aot-build merge --sign-key ------------------------------------------------------------------


def test_merge_sign_key_signs_like_a_plain_build(tmp_path, keys, aot_build):
    build = ["--no-cache", "--quiet"]
    for index in range(2):
        shard = aot_build(*build, "--shard", f"{index}/2", "--out", tmp_path / "shards")
        assert shard.exit_code == 0, shard.output
    merge = ["merge", tmp_path / "shards", "--no-cache", "--quiet"]
    unsigned = aot_build(*merge, "--out", tmp_path / "unsigned")
    signed = aot_build(*merge, "--out", tmp_path / "signed", "--sign-key", keys.release_private)
    plain = aot_build(*build, "--out", tmp_path / "plain", "--sign-key", keys.release_private)
    for result in (unsigned, signed, plain):
        assert result.exit_code == 0, result.output

    paths = sorted((tmp_path / "signed").glob("*.cuteaot"))
    assert len(paths) == BUNDLES
    for path in paths:
        manifest = read_manifest(path)
        key = signing.verify_signature(manifest, keys.trusted(), path)
        assert key.key_id == manifest.signature["key_id"] and f"signed {path}" in signed.output
        # Byte-identical to the unsigned merge once the signature is taken out again...
        stripped = tmp_path / "stripped.cuteaot"
        shutil.copy(path, stripped)
        rewrite_manifest(stripped, replace(manifest, signature=None))
        assert stripped.read_bytes() == (tmp_path / "unsigned" / path.name).read_bytes()
        assert read_manifest(tmp_path / "unsigned" / path.name).signature is None
    # ...and to a plain signed build, signature included: one signing step for both commands.
    assert bundle_bytes(tmp_path / "signed") == bundle_bytes(tmp_path / "plain")


def test_signing_options_go_after_the_subcommand(tmp_path, keys):
    result = CliRunner().invoke(
        cli.main, ["--sign-key", str(keys.release_private), "merge", str(tmp_path)]
    )
    assert result.exit_code == 2 and "--sign-key: write them after `merge`" in result.output
