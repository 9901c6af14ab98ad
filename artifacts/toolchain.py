"""The toolchain fingerprint recorded in every bundle.

TVM-FFI exports carry no version of their own, so a bundle says what built it: the cutlass-dsl
distributions, tvm-ffi, the CUDA runtime major it was linked against, and the DSL variables set
that change the code it emits. Read from distribution metadata and the environment only: finding
this out never imports cutlass. The same fingerprint keys the build cache and the overlay, so
code made under one compiler setting is never served for another; servers do not compile, so a
bundle loads whatever their own environment sets.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

from cute_aot.artifacts.core import settings

CUTLASS_DSL_PREFIX = "nvidia-cutlass-dsl"
TVM_FFI_DIST = "apache-tvm-ffi"
CUDA_RUNTIME_DIST = "nvidia-cuda-runtime"
# CUTE_DSL_* variables the compiler reads at every compile that change the code it emits
# (cutlass-dsl 4.9 announces its extension compiler as the default, this variable opting out).
CODEGEN_ENV = (
    "CUTE_DSL_ENABLE_TVM_FFI",
    "CUTE_DSL_COMPILER_OPT",
    "CUTE_DSL_LINEINFO",
    "CUTE_DSL_ENABLE_ASSERTIONS",
    "CUTE_DSL_ENABLE_PYIR",
    "CUTE_DSL_DEBUG",
    "CUTE_DSL_USE_EXTENSION_COMPILER",
)


@functools.cache
def _metadata(dist: str) -> tuple[str | None, tuple[str, ...]]:
    """(Version, Requires-Dist lines) of an installed distribution, None when it is not one.

    Read from the METADATA headers directly: importlib's `version()` and `requires()` each find
    the distribution again and run the e-mail parser over the whole file, ~1 ms apiece, which
    a server's first bundle load pays for every cutlass-dsl distribution."""
    try:
        text = metadata.distribution(dist).read_text("METADATA") or ""
    except metadata.PackageNotFoundError:
        return None, ()
    version, requires = None, []
    for line in text.splitlines():
        if not line.strip():  # the headers end at the first blank line (the description follows)
            break
        field, _, value = line.partition(":")
        if field == "Version":
            version = value.strip()
        elif field == "Requires-Dist":
            requires.append(value.strip())
    return version, tuple(requires)


def _version(dist: str) -> str | None:
    return _metadata(dist)[0]


_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@functools.cache
def cutlass_dsl_versions() -> dict[str, str]:
    """Every installed nvidia-cutlass-dsl* distribution and its version.

    Found by following the main distribution's nvidia-cutlass-dsl* requirements (any extra), not
    by scanning every installed distribution: the scan costs ~200 ms on a server's first bundle
    load, these lookups about a millisecond.
    """
    found: dict[str, str] = {}
    todo = [CUTLASS_DSL_PREFIX]
    while todo:
        name = todo.pop()
        version, requirements = _metadata(name)
        if name in found or version is None:
            continue
        found[name] = version
        for requirement in requirements:
            match = _REQUIREMENT_NAME.match(requirement)
            required = match.group(1).lower().replace("_", "-") if match else ""
            if required.startswith(CUTLASS_DSL_PREFIX):
                todo.append(required)
    return dict(sorted(found.items()))


def tvm_ffi_version() -> str | None:
    return _version(TVM_FFI_DIST)


def cuda_runtime_major() -> int | None:
    """Major version of the CUDA runtime the build links in (the cu13 flavour -> 13)."""
    version = _version(CUDA_RUNTIME_DIST)
    return int(version.split(".")[0]) if version else None


def fingerprint() -> dict:
    """What built (or would build) a bundle on this machine. The code-changing variables are
    named only where one is set: with none, the fingerprint (and every digest made of it) is
    what it always was."""
    found = {
        "cutlass_dsl": cutlass_dsl_versions(),
        "tvm_ffi": tvm_ffi_version(),
        "cuda_runtime_major": cuda_runtime_major(),
    }
    codegen = settings.environment(CODEGEN_ENV)
    if codegen:
        found["codegen_env"] = codegen
    return found


def abi_compatible_tvm_ffi(built_with: str | None, installed: str | None) -> bool:
    """TVM-FFI keeps its C ABI within a minor series: compare major.minor."""
    if not built_with or not installed:
        return False
    return built_with.split(".")[:2] == installed.split(".")[:2]


def same_cutlass_dsl(built: dict[str, str], installed: dict[str, str]) -> bool:
    """Same compiler: the main distribution's version matches, and so does every flavour library
    installed on both sides (a machine may carry cu12 and cu13 libraries; one of them compiled)."""
    main = CUTLASS_DSL_PREFIX
    if not built.get(main) or built.get(main) != installed.get(main):
        return False
    return all(built[name] == installed[name] for name in built.keys() & installed.keys())
