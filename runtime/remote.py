"""Bundles at URLs (s3://, gs://, https://, any fsspec protocol): fetched once per machine into a
content-addressed, verified download cache under the cache dir."""

from __future__ import annotations

import errno
from pathlib import Path


def fetch(url: str) -> list[Path]:
    """Local verified copies of the bundles at `url` (a bundle file or a folder of them)."""
    raise OSError(errno.EPROTONOSUPPORT, f"remote bundle sources are not supported yet: {url}")
