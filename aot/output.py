"""What every command that writes bundles was asked about its output (`aot-build`'s and
`merge`'s shared options, parsed): the folder, whether failures are allowed, the build cache and
the keys it trusts and signs with, the key that signs the bundles."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cute_aot.aot import build_signing
from cute_aot.aot.build_cache import BuildCache, default_cache_root
from cute_aot.artifacts import signing

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class Output:
    out_dir: Path
    allow_failures: bool
    cache_dir: Path | None
    no_cache: bool
    quiet: bool
    sign_key: Path | None  # signs the bundles written
    cache_sign_key: Path | None  # signs the build cache records published
    cache_trusted_keys: str | None  # cache entries used only when signed by one of these
    as_json: bool = False  # the report as JSON on stdout instead of the summary table

    def cache(self) -> BuildCache | None:
        """The build cache with this command's trust settings; keys are read here, before any
        compile, so a bad key file fails the command at once (KeyFileError)."""
        if self.no_cache:
            if self.cache_sign_key or self.cache_trusted_keys:
                raise click.UsageError(
                    "--cache-sign-key and --cache-trusted-keys need the build cache: "
                    "leave out --no-cache"
                )
            return None
        sign_key = signing.load_private_key(self.cache_sign_key) if self.cache_sign_key else None
        return BuildCache(
            self.cache_dir or default_cache_root(),
            sign_key=sign_key,
            trusted_keys=build_signing.cache_trusted_keys(self.cache_trusted_keys),
        )

    def bundle_signer(self) -> Ed25519PrivateKey | None:
        return signing.load_private_key(self.sign_key) if self.sign_key else None
