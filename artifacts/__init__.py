"""The bundle format: manifest schema, pack/unpack, hashing, compatibility facts."""

import functools


@functools.cache
def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("cute-aot")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def __getattr__(name: str):
    # Looked up on first use: every process imports this package when the startup hook is
    # armed (runtime/capture/activation.py), and importlib.metadata alone costs it tens of ms.
    if name == "PACKAGE_VERSION":
        return _package_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
