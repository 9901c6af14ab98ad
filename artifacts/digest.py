"""The one canonical digest and the one source hash: every digest cute-aot derives from values
or from code, in one place.

Canonical JSON is sorted keys, ASCII only, in one of two spellings. Both stay, byte for byte,
because what was made with them is persisted (key ids in symbols and bundles, cache folder and
file names, signed records):

    digest                      separators   length   made in
    key id                      COMPACT      20       kernels/keys.py, kernels/recorded
    dispatch table              COMPACT      16       kernels/tables.py
    signed cache record bytes   COMPACT      (text)   artifacts/signing.py
    build-cache object/bundle   SPACED       64       aot/build_cache.py
    shard plan                  SPACED       64       aot/shard.py
    overlay folder              SPACED       24       runtime/overlay.py

The manifest's canonical JSON (artifacts/manifest.py) is the COMPACT form spelled in place: that
module is packer code, so a change of the bytes it writes bumps PACKER_VERSION
(artifacts/fingerprints.py), which moves every cache entry.

The source hash is sha256 over `name\\0bytes\\0` of each source in the order given (a family's
modules, a foreign distribution's files), or over each file's own sha256 where a
recorded call's key id was made so. Files are read, never imported: servers hash on a miss and
must not import the build side or cutlass.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

COMPACT = (",", ":")
SPACED = (", ", ": ")  # json.dumps' default
# Made once: key ids and recorded calls are derived per call.
_ENCODERS = {
    separators: json.JSONEncoder(sort_keys=True, ensure_ascii=True, separators=separators)
    for separators in (COMPACT, SPACED)
}

FULL_LENGTH = 64
KEY_ID_LENGTH = 20
TABLE_LENGTH = 16
OVERLAY_LENGTH = 24

ABSENT = b"<absent>"  # what a missing module or file contributes to a source hash


def canonical_json(value: Any, separators: tuple[str, str] = COMPACT) -> str:
    """The canonical JSON text of `value` (KeyError for a spelling that is neither form)."""
    return _ENCODERS[separators].encode(value)


def text_digest(text: str, length: int = FULL_LENGTH) -> str:
    """sha256 hex of canonical JSON text already made, cut to `length`."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def json_digest(
    value: Any, *, separators: tuple[str, str] = COMPACT, length: int = FULL_LENGTH
) -> str:
    """The one canonical digest: sha256 hex of `value`'s canonical JSON, cut to `length`."""
    return text_digest(canonical_json(value, separators), length)


# -- source hash ---------------------------------------------------------------------------------
def module_file(module: str) -> str | None:
    """The file module `module` would be loaded from, without importing it (nor cutlass)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def module_source(module: str) -> bytes:
    origin = module_file(module)
    return Path(origin).read_bytes() if origin else ABSENT


def file_source(path: Path) -> bytes:
    return path.read_bytes() if path.is_file() else ABSENT


def source_digest(
    sources: Iterable[tuple[str, bytes]], *, prefix: bytes = b"", each_hashed: bool = False
) -> str:
    """The one source hash: sha256 over `prefix`, then `name\\0data\\0` for each (name, data) in
    the order given. each_hashed: over each source's own sha256 hex instead, names left out
    (the `source` of a recorded call, which is in its key id)."""
    digest = hashlib.sha256(prefix)
    for name, data in sources:
        if each_hashed:
            digest.update(hashlib.sha256(data).hexdigest().encode())
        else:
            digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()
