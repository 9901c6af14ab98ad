"""Ed25519 signatures over bundle manifests (via `cryptography`).

What is signed: a domain tag plus the manifest's canonical JSON without its `signature` field.
The manifest records the sha256 of the payload and of the library, so one signature vouches for
every byte of the bundle, and it can be checked before the payload is even read. The signature
lives in the manifest, {"algorithm": "ed25519", "key_id", "value"}, so `aot-cache` can show the
signer from the manifest alone; an unsigned manifest simply has no such field.

Keys are PEM files (`openssl genpkey -algorithm ed25519`). A key id is the first 16 bytes of the
sha256 of the raw 32-byte public key, in hex. Trust comes from the environment:
CUTE_AOT_TRUSTED_KEYS lists PEM public key files or folders of them (separated like PATH), and
CUTE_AOT_REQUIRE_SIGNATURE=1 makes the runtime refuse bundles not signed by one of them.

The same keys and signature record also vouch for build cache records (`aot-build
--cache-sign-key` / `--cache-trusted-keys`), under a domain tag of their own: a signature made for
one purpose never verifies for another.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.errors import KeyFileError, SignatureError
from cute_aot.artifacts.digest import canonical_json
from cute_aot.artifacts.manifest import Manifest

if TYPE_CHECKING:  # `cryptography` is imported only where a key or signature is handled: a
    # server that loads unsigned bundles and trusts no keys never pays for it (~40 ms)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

ALGORITHM = "ed25519"
# Binds a signature to its purpose: these bytes can never be mistaken for another signed message.
DOMAIN = b"cute-aot bundle manifest\0"
CACHE_RECORD_DOMAIN = b"cute-aot build cache record\0"
KEY_FILE_SUFFIXES = (".pem", ".pub")
MAX_KEY_FILE_BYTES = 1 << 20

_KEY_ID_RE = re.compile(r"^[0-9a-f]{32}\Z")
_VALUE_RE = re.compile(r"^[0-9a-f]{128}\Z")
_PEM_BLOCK_RE = re.compile(rb"-----BEGIN ([A-Z ]+)-----.+?-----END \1-----", re.DOTALL)


@dataclass(frozen=True)
class TrustedKey:
    key_id: str
    public_key: Ed25519PublicKey
    source: str  # the file it was read from

    def describe(self) -> str:
        return f"{ALGORITHM} key {self.key_id} ({self.source})"


def public_key_id(public_key: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:32]


# -- keys ---------------------------------------------------------------------------------------
def _read_key_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(path, f"cannot read key file ({exc.strerror or exc})") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(path, "key file too large to be a PEM key")
    return data


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """An unencrypted PEM ed25519 private key (PKCS#8, as `openssl genpkey` writes)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(path, "the private key is encrypted; give an unencrypted PEM") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(path, f"not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(path, f"an {ALGORITHM} key is needed, this is {type(key).__name__}")
    return key


def load_public_keys(path: str | os.PathLike) -> list[TrustedKey]:
    """The PEM public keys in a file (one or more blocks) or in a folder's *.pem/*.pub files."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in KEY_FILE_SUFFIXES)
        return [key for file in files for key in load_public_keys(file)]
    data = _read_key_file(path)
    found = list(_PEM_BLOCK_RE.finditer(data))
    if any(b"PRIVATE" in match.group(1) for match in found):
        raise KeyFileError(path, "holds a private key: trust needs public keys only")
    blocks = [match.group(0) for match in found]
    if not blocks:
        raise KeyFileError(path, "no PEM block found (expected '-----BEGIN PUBLIC KEY-----')")
    keys = []
    for block in blocks:
        try:
            key = serialization.load_pem_public_key(block)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise KeyFileError(path, f"not a PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFileError(path, f"an {ALGORITHM} key is needed, this is {type(key).__name__}")
        keys.append(TrustedKey(public_key_id(key), key, str(path)))
    return keys


def trusted_keys(spec: str | None = None) -> dict[str, TrustedKey]:
    """key id -> key, from `spec` (default: CUTE_AOT_TRUSTED_KEYS); a named file that is not
    there or not a key raises KeyFileError: a typo must not quietly trust nothing."""
    spec = settings.trusted_keys_spec() if spec is None else spec
    keys: dict[str, TrustedKey] = {}
    for part in filter(None, spec.split(os.pathsep)):
        if not os.path.exists(part):
            raise KeyFileError(part, f"named in {settings.TRUSTED_KEYS.name} but does not exist")
        for key in load_public_keys(part):
            keys.setdefault(key.key_id, key)
    return keys


def signature_required() -> bool:
    """CUTE_AOT_REQUIRE_SIGNATURE: anything but unset, '', 0, false, no or off requires one."""
    return settings.signature_required()


# -- signing and verifying ----------------------------------------------------------------------
def signature_record(message: bytes, private_key: Ed25519PrivateKey) -> dict[str, str]:
    """{"algorithm", "key_id", "value"}: the signature of `message` (which carries its domain)."""
    value = private_key.sign(message).hex()
    return {
        "algorithm": ALGORITHM,
        "key_id": public_key_id(private_key.public_key()),
        "value": value,
    }


def verify_record(
    record: object,
    message: bytes,
    trusted: Mapping[str, TrustedKey],
    path="<manifest>",
    *,
    what: str = "bundle",
    trust_source: str = settings.TRUSTED_KEYS.name,
) -> TrustedKey:
    """The trusted key whose signature `record` is over `message`; SignatureError if the record
    is missing, malformed, by a key not in `trusted` (said to come from `trust_source`), or
    does not verify. `what` names the signed thing in messages."""
    from cryptography.exceptions import InvalidSignature

    if record is None:
        raise SignatureError(path, f"{what} is not signed")
    if (
        not isinstance(record, dict)
        or set(record) != {"algorithm", "key_id", "value"}
        or record.get("algorithm") != ALGORITHM
    ):
        raise SignatureError(path, f"unsupported or malformed signature record {record!r:.200}")
    key_id, value = record["key_id"], record["value"]
    if not isinstance(key_id, str) or not isinstance(value, str) or not _VALUE_RE.match(value):
        raise SignatureError(path, "malformed signature record (key id or value)")
    key = trusted.get(key_id)
    if key is None:
        where = (
            f"{trust_source} has {len(trusted)} key(s)" if trusted else f"{trust_source} is empty"
        )
        raise SignatureError(path, f"signed by {ALGORITHM} key {key_id:.40}, not trusted ({where})")
    try:
        key.public_key.verify(bytes.fromhex(value), message)
    except InvalidSignature:
        raise SignatureError(
            path, f"signature by {ALGORITHM} key {key_id} does not match the {what} (tampered?)"
        ) from None
    return key


def signed_bytes(manifest: Manifest) -> bytes:
    """The exact bytes a signature covers."""
    return DOMAIN + replace(manifest, signature=None).to_json()


def sign_manifest(manifest: Manifest, private_key: Ed25519PrivateKey) -> Manifest:
    """The manifest with its signature (any previous one replaced)."""
    return replace(manifest, signature=signature_record(signed_bytes(manifest), private_key))


def sign_bundle(path: str | os.PathLike, private_key: Ed25519PrivateKey) -> Manifest:
    """Sign a bundle file in place (atomically; the payload bytes are kept as they are)."""
    from cute_aot.artifacts.bundle import read_manifest
    from cute_aot.artifacts.bundle_writer import rewrite_manifest

    return rewrite_manifest(path, sign_manifest(read_manifest(path), private_key))


def signer_key_id(manifest: Manifest) -> str | None:
    """The key id the manifest claims to be signed by (unverified), or None if unsigned."""
    record = manifest.signature
    if record is None:
        return None
    key_id = record.get("key_id")
    return key_id if isinstance(key_id, str) and _KEY_ID_RE.match(key_id) else "<malformed>"


def verify_signature(
    manifest: Manifest, trusted: Mapping[str, TrustedKey] | None = None, path="<manifest>"
) -> TrustedKey:
    """The trusted key that signed this manifest; SignatureError if it is unsigned, signed by
    a key not in `trusted` (default: CUTE_AOT_TRUSTED_KEYS), malformed, or does not verify."""
    trusted = trusted_keys() if trusted is None else trusted
    if manifest.signature is None:
        raise SignatureError(path, "bundle is not signed")
    return verify_record(manifest.signature, signed_bytes(manifest), trusted, path, what="manifest")


# -- build cache records ------------------------------------------------------------------------
def cache_record_bytes(kind: str, digest: str, record: Mapping) -> bytes:
    """The exact bytes a cache record's signature covers: the record (its data's sha256 and
    size, and for objects the key and report row) bound to the slot it answers, `kind` and
    `digest`, so a signed record cannot be replayed for other inputs. Canonical JSON of the
    record as it reads back from its file, so writer and reader serialise the same bytes."""
    import json

    unsigned = {name: value for name, value in record.items() if name != "signature"}
    document = {"kind": kind, "digest": digest, "record": json.loads(json.dumps(unsigned))}
    return CACHE_RECORD_DOMAIN + canonical_json(document).encode()


def sign_cache_record(
    kind: str, digest: str, record: Mapping, private_key: Ed25519PrivateKey
) -> dict:
    """The record with its `signature` field (any previous one replaced)."""
    unsigned = {name: value for name, value in record.items() if name != "signature"}
    message = cache_record_bytes(kind, digest, unsigned)
    return {**unsigned, "signature": signature_record(message, private_key)}


def verify_cache_record(
    kind: str,
    digest: str,
    record: Mapping,
    trusted: Mapping[str, TrustedKey],
    path="<cache record>",
) -> TrustedKey:
    """The trusted key that signed this cache record; SignatureError otherwise."""
    return verify_record(
        record.get("signature"),
        cache_record_bytes(kind, digest, record),
        trusted,
        path,
        what="cache record",
        trust_source="--cache-trusted-keys",
    )


def describe_signature(
    manifest: Manifest, trusted: Mapping[str, TrustedKey] | None = None
) -> str | None:
    """One line for operators (`aot-cache verify`): who signed and whether that is trusted here.
    None when the manifest is unsigned. A bad signature is described, not raised; a broken
    CUTE_AOT_TRUSTED_KEYS (when `trusted` is None) raises KeyFileError."""
    key_id = signer_key_id(manifest)
    if key_id is None:
        return None
    try:
        key = verify_signature(manifest, trusted)
    except SignatureError as exc:
        reason = str(exc).split(": ", 1)[-1]
        return f"{ALGORITHM} key {key_id}: NOT VERIFIED ({reason})"
    return f"{ALGORITHM} key {key_id}: valid, trusted ({key.source})"
