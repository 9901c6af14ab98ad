"""URLs of any fsspec protocol beside local paths: which a string is, and how to reach it.

Shared by everything that accepts a URL (miss logs, bundle sources). fsspec, and the package of
a protocol (s3fs, gcsfs, ...), is imported only when a URL is used: a server that records to a
local file never imports it. A filesystem is configured the way fsspec and its protocol are
(`FSSPEC_<PROTOCOL>_<OPTION>` variables, fsspec's config files, or the protocol's own, e.g.
`AWS_ENDPOINT_URL` and the AWS credential chain for s3://); only bounded timeouts are added
here, so that no caller waits on a store that does not answer.

Every call to a store goes through `store_call` or `retried` below: the one place that decides
how often a call is tried, the backoff between attempts and which calls get a deadline.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from cute_aot.artifacts.core.errors import CuteAotError

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


CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 10.0
# The extra of cute-aot that installs a protocol's package
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}


def filesystem(url: str):
    """(fsspec filesystem, path in it) of `url`, with bounded timeouts: a new instance each time,
    so that a changed environment (credentials, endpoint) is honoured and no listing is served
    from memory. OSError when the protocol's package is not installed or the protocol unknown."""
    protocol = url.split("://", 1)[0].lower()
    try:
        from fsspec.core import url_to_fs

        return url_to_fs(url, skip_instance_cache=True, **_options(protocol))
    except ImportError as exc:
        hint = f"pip install 'cute-aot[{_EXTRAS[protocol]}]'" if protocol in _EXTRAS else str(exc)
        raise OSError(
            errno.EPROTONOSUPPORT, f"{protocol}:// needs a package not installed here ({hint})", url
        ) from None
    except ValueError as exc:  # fsspec: "Protocol not known"
        raise OSError(errno.EPROTONOSUPPORT, str(exc), url) from None


def _options(protocol: str) -> dict:
    """Bounded timeouts where the protocol takes them, under what fsspec's config says (an
    operator's own option of the same name wins)."""
    if protocol in ("s3", "s3a"):
        # botocore retries nothing itself: `retried` below does, the same way for every
        # protocol.
        mine = {
            "config_kwargs": {
                "connect_timeout": CONNECT_TIMEOUT,
                "read_timeout": READ_TIMEOUT,
                "retries": {"total_max_attempts": 1},
            }
        }
    elif protocol in ("http", "https"):
        import aiohttp

        # No total: a large bundle may take long; a stalled connection may not.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT
        )
        mine = {"client_kwargs": {"timeout": timeout}}
    else:
        return {}
    from fsspec.config import conf

    theirs = conf.get(protocol) or {}
    for name, value in mine.items():
        if isinstance(theirs.get(name), dict):
            mine[name] = {**value, **theirs[name]}
        elif name in theirs:
            mine[name] = theirs[name]
    return mine


# -- retries -------------------------------------------------------------------------------------
ATTEMPTS = 3
BACKOFF = 0.25  # seconds before the second attempt, doubled before each next one
# One listing or metadata call, whatever the protocol's own retries do inside it.
CALL_DEADLINE = CONNECT_TIMEOUT + READ_TIMEOUT
# The calls whose answer is small, so a deadline for the whole call is safe (where fsspec's
# sync() takes one); a transfer may take long, so only its stalls are bounded (the timeouts above).
_DEADLINED = frozenset({"info", "ls", "isfile"})


class Unreachable(OSError):
    """The store did not answer (after every attempt): a cached copy may serve instead."""


def store_call(url: str, fs, method: str, *args, **kwargs):
    """`fs.<method>(*args, **kwargs)`, retried (see `retried`), with CALL_DEADLINE where the
    method answers small and the filesystem takes a deadline."""
    if method in _DEADLINED:
        from fsspec.asyn import AsyncFileSystem

        if isinstance(fs, AsyncFileSystem):
            kwargs.setdefault("timeout", CALL_DEADLINE)
    return retried(url, getattr(fs, method), *args, **kwargs)


def retried(url: str, call: Callable, *args, **kwargs):
    """`call` tried ATTEMPTS times with backoff; Unreachable naming `url` and the last reason.
    A missing object is an answer, not a failure, and our own errors are never retried. For a
    step of several store calls that is retried as a whole (a download and its checks)."""
    for attempt in range(ATTEMPTS):
        try:
            return call(*args, **kwargs)
        except (FileNotFoundError, CuteAotError):
            raise
        except Exception as exc:  # network stacks raise their own (botocore, aiohttp, asyncio)
            last = exc
        if attempt + 1 < ATTEMPTS:
            time.sleep(BACKOFF * 2**attempt)
    code = last.errno if isinstance(last, OSError) and last.errno else errno.EIO
    reason = f"{type(last).__name__}: {last}".strip().rstrip(":")
    raise Unreachable(code, f"cannot reach the store after {ATTEMPTS} attempts ({reason})", url)
