"""URLs of any fsspec protocol beside local paths: which a string is, and how to reach it.

Shared by everything that accepts a URL (miss logs, bundle sources). fsspec, and the package of
a protocol (s3fs, gcsfs, ...), is imported only when a URL is used: a server that records to a
local file never imports it. A filesystem is configured the way fsspec and its protocol are
(`FSSPEC_<PROTOCOL>_<OPTION>` variables, fsspec's config files, or the protocol's own, e.g.
`AWS_ENDPOINT_URL` and the AWS credential chain for s3://); nothing is configured here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(source: str | os.PathLike) -> bool:
    return isinstance(source, str) and bool(_URL.match(source))


def local_path(source: str | os.PathLike) -> Path | None:
    """The local path `source` names (a path or a file:// URL); None for any other URL."""
    if not is_url(source):
        return Path(source)
    if source.startswith("file://"):
        return Path(source.removeprefix("file://"))
    return None


def filesystem(url: str):
    """(fsspec filesystem, path within it) of `url`."""
    from fsspec.core import url_to_fs

    return url_to_fs(url)
