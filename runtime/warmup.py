"""Warm-up: resolve kernels before serving, so a miss compiles at start-up, not mid-request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from cute_aot.kernels import families
from cute_aot.runtime.ops import family_op


def _legacy_family() -> str:
    """The family that family-less calls (`preload([(M, K, N), ...])`) have always meant."""
    return next(name for name, found in families().items() if found.unprefixed_shapes)


def preload(
    problems: Mapping[str, Iterable[tuple]] | Iterable[tuple],
    device: int | None = None,
    family: str | None = None,
) -> int:
    """Resolve every problem on `device` (default: current); returns how many.

    `problems`: {family: problems}, or problems of `family` (default: the family that
    `aot-build --shape` without a prefix means, for callers that predate families).
    """
    device = torch.cuda.current_device() if device is None else device
    if not isinstance(problems, Mapping):
        problems = {family or _legacy_family(): problems}
    count = 0
    for name, family_problems in problems.items():
        op = family_op(name)
        for problem in family_problems:
            op.preload(tuple(problem), device)
            count += 1
    return count


def model_shapes(model: torch.nn.Module) -> dict[str, list[tuple]]:
    """{family: shapes} that `model`'s weights ask of each installed family (empty ones left
    out)."""
    found = {name: f.shapes_from_torch_model(model) for name, f in families().items()}
    return {name: shapes for name, shapes in found.items() if shapes}


def preload_model(model: torch.nn.Module, device: int | None = None) -> dict[str, list[tuple]]:
    """Preload every problem of every family `model` needs; returns {family: shapes}."""
    shapes = model_shapes(model)
    preload(
        {
            name: [p for shape in family_shapes for p in families()[name].problems(shape)]
            for name, family_shapes in shapes.items()
        },
        device,
    )
    return shapes
