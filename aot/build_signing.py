"""The build's own keys: the bundles it writes are signed here, and the keys whose build cache
entries it trusts are read here (artifacts/signing.py holds the formats and the cryptography)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from cute_aot.aot.build import WrittenBundle
from cute_aot.artifacts import signing
from cute_aot.artifacts.core.errors import KeyFileError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def cache_trusted_keys(spec: str | None) -> dict[str, signing.TrustedKey] | None:
    """The keys of --cache-trusted-keys (None: not given, every intact entry is used)."""
    if spec is None:
        return None
    keys = signing.trusted_keys(spec)  # a name that is not there or not a key raises
    if not keys:
        # Trusting no key would refuse every entry: surely a wrong folder, not a wish.
        raise KeyFileError(spec, "--cache-trusted-keys names no public key (*.pem, *.pub)")
    return keys


def sign_bundles(
    console: Console, bundles: list[WrittenBundle], private_key: Ed25519PrivateKey
) -> None:
    """Sign written bundles in place: the one signing step of `aot-build` and `merge`. A file
    another build has replaced since is not this build's to vouch for."""
    for bundle in bundles:
        if bundle.replaced():
            console.print(f"[yellow]not signed:[/yellow] {bundle.path} (another build's bytes)")
            continue
        signed = signing.sign_bundle(bundle.path, private_key)
        key_id = signed.signature["key_id"]
        console.print(f"signed {bundle.path} ({signing.ALGORITHM} key {key_id})")
