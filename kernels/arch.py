"""GPU architecture names: one spelling everywhere (``sm_90a``), families for tuned tables."""

from __future__ import annotations

import re

from cute_aot.artifacts.core.errors import UnsupportedProblemError

# Architectures we build for. The 'a' variants use arch-specific instructions and run only on
# exactly that compute capability.
SUPPORTED_ARCHS = {
    "sm_90a": (9, 0),
    "sm_100a": (10, 0),
    "sm_103a": (10, 3),
}

# What cutlass-dsl compiles for when a compile names no GPUArch and no GPU is present (its own
# default): a served cute.compile of such a call is looked up for it, as it would have compiled.
DSL_DEFAULT_ARCH = "sm_100a"
_ARCH_RE = re.compile(r"^sm_?(\d+)([af]?)$")


def normalize_arch(name: str) -> str:
    """'sm90a', 'SM_90A', 'sm_90a' -> 'sm_90a'; refuses what we do not build for."""
    match = _ARCH_RE.match(name.strip().lower())
    arch = f"sm_{match.group(1)}{match.group(2)}" if match else name
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedProblemError(
            f"unsupported architecture {name!r}; choose one of {', '.join(SUPPORTED_ARCHS)}"
        )
    return arch


def arch_for_capability(major: int, minor: int) -> str | None:
    """The architecture whose binaries run on a GPU of this compute capability, if we build it."""
    for arch, capability in SUPPORTED_ARCHS.items():
        if capability == (major, minor):
            return arch
    return None


def arch_family(arch: str) -> str:
    """Tuned tables are shared within a family: sm_100a and sm_103a are both 'sm100'."""
    major = SUPPORTED_ARCHS[normalize_arch(arch)][0]
    return f"sm{major}0"
