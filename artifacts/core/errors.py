"""The one error hierarchy of cute-aot.

Every error names what it is about (file, family, key, architecture) so that an operator can act
on the message alone. Input errors are also ValueError/TypeError so that callers that already
catch those keep working.
"""

from __future__ import annotations


class CuteAotError(Exception):
    """Base class of every error cute-aot raises on purpose."""


class BundleError(CuteAotError):
    """A bundle file cannot be used; `path` names it."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class BundleFormatError(BundleError):
    """Not a bundle, truncated, unknown format version, or a malformed manifest."""


class BundleIntegrityError(BundleError):
    """A hash or size recorded in the manifest does not match the bytes."""


class BundleSizeError(BundleIntegrityError, BundleFormatError):
    """The file is not as long as its manifest says (truncated, or bytes appended). Also a
    BundleFormatError, which is what such files raised before the size was checked up front."""


class IncompatibleBundleError(BundleError):
    """A sound bundle that does not fit this machine (GPU architecture, toolchain)."""


class OtherArchError(IncompatibleBundleError):
    """Built for another GPU architecture than the one asked for (a folder's other bundles)."""


class MissingLibraryError(IncompatibleBundleError):
    """The bundle's library needs a shared library this machine cannot provide; `library` names
    it."""

    def __init__(self, path, library: str, message: str):
        self.library = library
        super().__init__(path, message)


class DriverTooOldError(IncompatibleBundleError):
    """The CUDA driver cannot run the CUDA runtime linked into the bundle's library."""


class SignatureError(BundleError):
    """The trust policy refuses the bundle: unsigned where a signature is required, signed by a
    key that is not trusted, or a signature that does not match the manifest."""


class KeyFileError(CuteAotError):
    """A signing key or trusted public key file cannot be used; `path` names it."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class KernelNotFoundError(CuteAotError, LookupError):
    """No loaded bundle holds the kernel a problem dispatches to."""

    def __init__(self, family: str, key_id: str, arch: str, searched: list[str], detail: str = ""):
        self.family, self.key_id, self.arch, self.searched = family, key_id, arch, searched
        where = ", ".join(searched) if searched else "no bundles loaded"
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"no prebuilt kernel for family {family!r} key {key_id} on {arch}{extra}; "
            f"bundles searched: {where}"
        )


class UnsupportedProblemError(CuteAotError, ValueError):
    """The problem is outside what a family's kernels are built for."""


class InputError(CuteAotError, ValueError):
    """An op was called with tensors its kernels must not run on (dtype, shape, alignment...)."""


class BuildError(CuteAotError):
    """Compiling, linking or packing failed; names the family, key and architecture."""


class StaleBundleError(IncompatibleBundleError):
    """A bundle built from other kernel sources, ABI or compiler than the installed ones."""


class JitUnavailableError(CuteAotError):
    """This process cannot compile a kernel (cutlass-dsl missing, broken, or the compile failed)."""


class EntryNotFoundError(CuteAotError, LookupError):
    """A bundle holds no entry matching what an operator asked for."""

    def __init__(self, path, arch: str, wanted: str, known: list[str]):
        self.path, self.arch, self.wanted = str(path), arch, wanted
        listed = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
        super().__init__(
            f"{path}: no entry {wanted!r} in this {arch} bundle (has: {listed or 'nothing'})"
        )


class ModelConfigError(CuteAotError, ValueError):
    """A model config that cannot give build shapes; names the file."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class TableError(CuteAotError, ValueError):
    """A dispatch table (file, bundle manifest) that cannot be used; names where it came from."""

    def __init__(self, where, message: str):
        self.where = str(where)
        super().__init__(f"{self.where}: {message}")


class LineFormatError(CuteAotError, ValueError):
    """A JSON-lines source (a record file, a miss log) none of whose lines has its format's
    shape; each line was named with its field when it was skipped."""

    def __init__(self, where, message: str):
        self.where = str(where)
        super().__init__(f"{self.where}: {message}")


class ShardError(BuildError):
    """Shard outputs that cannot be merged; names the shard folder involved."""


class NotReproducibleError(BuildError):
    """Two builds of the same inputs wrote different bundle bytes; names the bundle and kernels."""


class BinaryInspectionError(CuteAotError):
    """A GPU binary cannot be found or read; names the file involved."""


class ElfError(CuteAotError, ValueError):
    """The bytes are not a well-formed 64-bit little-endian ELF file of the kind asked for."""


class ToolNotFoundError(BinaryInspectionError):
    """cuobjdump or nvdisasm is not installed; says which package provides it."""

    def __init__(self, tool: str, distribution: str):
        self.tool, self.distribution = tool, distribution
        super().__init__(
            f"{tool} not found: pip install {distribution} (or put the CUDA toolkit's bin folder "
            "on PATH)"
        )
