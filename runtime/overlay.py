"""The write-back overlay cache: JIT results published as one-kernel bundles for later processes.

    <cache dir>/overlay/<fingerprint>/<arch>/<key id>.cuteaot

The fingerprint covers everything that changes an entry's bytes: the toolchain, the family's
version, ABI and source hash, the bundle format and the packer's code. Publishing is first-wins
via link() (see publish_once): any number of processes and hosts share the folder, NFS included,
without locks. An entry that a reader refuses (damaged, written by other code) is renamed aside,
atomically and only if it is still the file that was refused, so the next publisher can replace
it: a bad entry costs one compile, never one per process forever. `aot-cache gc` removes the
renamed files.
"""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path

from cute_aot.artifacts import signing, toolchain
from cute_aot.artifacts.bundle import BUNDLE_SUFFIX
from cute_aot.artifacts.core import cache_layout, settings
from cute_aot.artifacts.core.atomic import publish_once
from cute_aot.artifacts.core.errors import BundleError, SignatureError
from cute_aot.artifacts.digest import OVERLAY_LENGTH, SPACED, json_digest
from cute_aot.artifacts.fingerprints import packer_identity
from cute_aot.artifacts.manifest import Manifest
from cute_aot.kernels import family_facts
from cute_aot.runtime.private_files import private_file

REFUSED_MARK = cache_layout.OVERLAY_REFUSED  # <entry>.refused-<random>: set aside, for gc
# The private key overlay entries are signed with. Default: a per-user key made on first use in
# the cache dir (mode 0600). Servers that share one overlay folder share one key here, and
# trust its public key through CUTE_AOT_TRUSTED_KEYS.


def overlay_root() -> Path:
    return settings.cache_dir() / cache_layout.OVERLAY.folder


def fingerprint(family: str, facts: dict | None = None) -> str:
    """The name of `family`'s overlay folder: the digest of its `fingerprint_facts` (`facts`:
    those, already at hand)."""
    facts = fingerprint_facts(family) if facts is None else facts
    return json_digest(facts, separators=SPACED, length=OVERLAY_LENGTH)


def fingerprint_facts(family: str) -> dict:
    """Everything an overlay entry of `family` depends on: a change of any gives a new folder."""
    return {
        "toolchain": toolchain.fingerprint(),
        "family": family,
        "facts": family_facts(family),
        "packer": packer_identity(),
        # Servers whose overlay keys differ do not trust each other's entries: separate folders,
        # so that they never set each other's entries aside.
        "signer": signer_key_id(),
    }


def overlay_path(key, arch: str) -> Path:
    return overlay_root() / fingerprint(key.FAMILY) / arch / f"{key.id}{BUNDLE_SUFFIX}"


def identity(path: Path) -> tuple[int, ...] | None:
    """What tells the file now at `path` from one that replaced it (an inode number alone may be
    reused at once), or None when there is none."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns, info.st_size


def set_aside(path: Path, refused: tuple[int, ...] | None) -> bool:
    """Rename the refused entry out of the way, unless it was replaced meanwhile. True if moved."""
    if refused is None or identity(path) != refused:
        return False
    try:
        os.rename(path, path.with_name(f"{path.name}{REFUSED_MARK}{uuid.uuid4().hex[:12]}"))
    except OSError:
        return False  # someone else moved it first
    return True


def publish(key, arch: str, data: bytes) -> bool:
    """Publish a one-kernel bundle; False when a good entry was there first. An entry there that
    does not verify is set aside and replaced."""
    path = overlay_path(key, arch)
    if publish_once(path, data):
        return True
    existing = identity(path)
    try:
        from cute_aot.runtime.loader import verify_bundle

        verify_bundle(path, arch, trust=check_trust)
        return False  # a good entry won: first wins
    except BundleError:
        set_aside(path, existing)
    return publish_once(path, data)


# -- trust -----------------------------------------------------------------------------------------
def signing_key_path() -> Path:
    return settings.overlay_key()


@functools.cache
def _signing_key(path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not path.exists():  # first use: make one; first writer wins, every process reads it
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        publish_once(path, pem, mode=0o600)
    return signing.load_private_key(path)


def signer_key_id() -> str:
    return signing.public_key_id(_signing_key(signing_key_path()).public_key())


def sign(manifest: Manifest) -> Manifest:
    """Sign an overlay entry's manifest with the overlay key."""
    return signing.sign_manifest(manifest, _signing_key(signing_key_path()))


def trusted_keys() -> dict[str, signing.TrustedKey]:
    """CUTE_AOT_TRUSTED_KEYS, plus the overlay key's public half (trusted for the overlay only)."""
    keys = dict(signing.trusted_keys())
    path = signing_key_path()
    if path.exists():
        public = _signing_key(path).public_key()
        key_id = signing.public_key_id(public)
        keys.setdefault(key_id, signing.TrustedKey(key_id, public, f"{path} (overlay key)"))
    return keys


def check_trust(path: Path, manifest: Manifest) -> signing.TrustedKey | None:
    """The overlay's policy, stricter than a bundle's: a signed entry must verify against the
    overlay key or a trusted key; an unsigned one (older cute-aot) is accepted only where only
    this user could have written it, and never under CUTE_AOT_REQUIRE_SIGNATURE."""
    if manifest.signature is not None:
        return signing.verify_signature(manifest, trusted_keys(), path)
    if signing.signature_required():
        raise SignatureError(
            path, f"unsigned overlay entry and {settings.REQUIRE_SIGNATURE.name} is set"
        )
    if not private_file(path, overlay_root()):
        raise SignatureError(
            path, "unsigned overlay entry in a folder other users can write: not trusted"
        )
    return None
