"""A `@cute.jit` function whose arguments are plain containers, as FlashAttention-4 and quack pass
them (a NamedTuple of optional tensors, a dataclass of options, a dict of tuning choices), for the
describer's round trips (tests/test_plain_containers.py). Never compiled there."""

import dataclasses
import enum
from typing import NamedTuple

import cutlass
import cutlass.cute as cute


class Mode(enum.Enum):
    FAST = 1
    EXACT = 2


class Operands(NamedTuple):
    tensor: object
    scale: object = None


@dataclasses.dataclass(frozen=True)
class Options:
    tile: int
    kind: type
    modes: frozenset = frozenset()


@cute.jit
def consume(operands, items, options: cutlass.Constexpr, table: cutlass.Constexpr, mode=None):
    pass
