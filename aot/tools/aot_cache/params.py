"""Option values of `aot-cache`: sizes, ages, architectures and dtypes, refused with a reason."""

from __future__ import annotations

import re

import click

from cute_aot.artifacts.core.errors import CuteAotError
from cute_aot.kernels import KernelFamily
from cute_aot.kernels.arch import normalize_arch

# Short names operators type; the families speak torch dtype names.
DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp8": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
}
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(value: str) -> int:
    """'500M', '2G', '1.5GiB', '4096' -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", value.lower())
    if not match:
        raise click.BadParameter(f"{value!r} is not a size such as 500M or 2G")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def parse_age(value: str) -> float:
    """'7d', '12h', '30m', '90s', '2w' -> seconds (a bare number is seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|min|m|h|d|w)?\s*", value.lower())
    if not match:
        raise click.BadParameter(f"{value!r} is not an age such as 7d, 12h or 30m")
    return float(match.group(1)) * _AGE_UNITS[match.group(2) or ""]


def size_param(ctx, param, value: str | None) -> int | None:
    return None if value is None else parse_size(value)


def age_param(ctx, param, value: str | None) -> float | None:
    return None if value is None else parse_age(value)


def arch_param(ctx, param, value):
    """One architecture or a tuple of them (multiple=True), in the one spelling: sm_90a."""
    try:
        if isinstance(value, tuple):
            return tuple(normalize_arch(arch) for arch in value)
        return None if value is None else normalize_arch(value)
    except CuteAotError as exc:
        raise click.BadParameter(str(exc)) from None


def family_dtypes(family: KernelFamily, text: str | None) -> str | None:
    """`--dtype` text for `family.parse_problem`: aliases spelled out, and one dtype given for
    all of the family's inputs repeated for each ('bf16' -> 'bfloat16,bfloat16')."""
    if text is None:
        return None
    names = [part.strip().lower() for part in text.split(",")]
    names = [DTYPE_ALIASES.get(name, name) for name in names]
    inputs = [arg.name for arg in family.inputs]
    if not all(names) or len(names) not in (1, len(inputs)):
        per_input = ",".join(f"{name.upper()}_DTYPE" for name in inputs)
        raise click.BadParameter(
            f"{text!r} is not DTYPE or {per_input} (the dtypes of {family.name}'s inputs)",
            param_hint="--dtype",
        )
    if len(names) == 1 and len(inputs) > 1:
        names *= len(inputs)
    return ",".join(names)
