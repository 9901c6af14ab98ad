"""Warm-up: resolve kernels before serving, so a miss compiles at start-up, not mid-request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from cute_aot.kernels import TorchModelShapes, capability, families
from cute_aot.runtime.ops import family_op


def _legacy_family() -> str:
    """The family that family-less calls (`preload([(M, N, K), ...])`) have always meant."""
    return next(name for name, found in families().items() if found.unprefixed_shapes)


def preload(
    problems: Mapping[str, Iterable[tuple | Mapping | str]] | Iterable[tuple | Mapping | str],
    device: int | None = None,
    family: str | None = None,
) -> int:
    """Resolve every problem on `device` (default: current); returns how many.

    `problems`: {family: problems}, or problems of `family` (default: the family that
    `aot-build --shape` without a prefix means, for callers that predate families). A problem is
    the family's problem tuple, in the order of its math (router: (M, N, K)), or its dims named
    as `aot-cache explain --shape` names them: `{"M": 12, "N": 256, "K": 7168}` or
    `"M=12,N=256,K=7168"`. A family refuses a tuple it recognises as an older order.
    """
    device = torch.cuda.current_device() if device is None else device
    if not isinstance(problems, Mapping):
        problems = {family or _legacy_family(): problems}
    count = 0
    for name, family_problems in problems.items():
        op = family_op(name)
        for problem in family_problems:
            op.preload(_problem(op.family, problem), device)
            count += 1
    return count


def _problem(found, problem) -> tuple:
    """A family's problem from a preload entry. Named dims are read by the family's own text
    rule; a tuple stays what it is (a family's problem type keeps its named fields, and the
    family checks the order of a bare one)."""
    if isinstance(problem, Mapping):
        problem = ",".join(f"{name}={value}" for name, value in problem.items())
    if isinstance(problem, str):
        return found.parse_problem(problem)
    return problem if isinstance(problem, tuple) else tuple(problem)


def model_shapes(model: torch.nn.Module) -> dict[str, list[tuple]]:
    """{family: shapes} that `model`'s weights ask of each installed family (empty ones left
    out)."""
    readers = {name: capability(f, TorchModelShapes) for name, f in families().items()}
    found = {name: r.shapes_from_torch_model(model) for name, r in readers.items() if r}
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
