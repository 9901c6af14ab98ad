"""The bundle format: manifest schema, pack/unpack, hashing, compatibility facts."""

from importlib import metadata as _metadata

try:
    PACKAGE_VERSION = _metadata.version("cute-aot")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    PACKAGE_VERSION = "0+unknown"
