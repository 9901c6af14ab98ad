"""Kernel timing on a GPU for tuning and benchmarks: CUDA graphs, operands cycled out of L2.

A micro-benchmark that calls one kernel on the same operands finds them in L2 and launches back
to back with nothing in between; a server does neither. So each measurement cycles through
enough copies of the operands to leave L2, replays a CUDA graph of many calls (no launch gaps
from Python), and reports the median over replays.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

L2_FLUSH_BYTES = 256 << 20  # several times the H100/H200 L2 (50 MB)
GRAPH_SECONDS = 1e-3  # aim each replay at about this long
REPLAYS = 5
MAX_CALLS_PER_GRAPH = 200

K = TypeVar("K")


def operand_copies(operand_bytes: int) -> int:
    """How many copies of a problem's operands to cycle through: enough to leave L2 (max 16)."""
    return max(1, min(16, L2_FLUSH_BYTES // max(1, operand_bytes)))


def seconds_per_call(call: Callable, operand_sets: Sequence[tuple], out) -> float:
    """Median seconds per `call(*operands, out)` over graph replays cycling `operand_sets`."""
    return seconds_per_call_each({0: call}, operand_sets, out)[0]


def seconds_per_call_each(
    calls: Mapping[K, Callable], operand_sets: Sequence[tuple], out
) -> dict[K, float]:
    """seconds_per_call for each of `calls`, their graph replays interleaved (one replay of each
    per round). A GPU at its power limit changes its clock within milliseconds: timed one after
    the other, whichever runs later is slowed (on the H200, aot-tune's last candidate by 4-10%
    against the same kernel timed first); interleaved, every call sees the same clocks."""
    import torch

    graphs = {name: _graph_of(call, operand_sets, out, torch) for name, call in calls.items()}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: dict[K, list[float]] = {name: [] for name in calls}
    for _ in range(REPLAYS):
        for name, (graph, calls_per_replay) in graphs.items():
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) * 1e-3 / calls_per_replay)
    del graphs
    return {name: statistics.median(values) for name, values in times.items()}


def _graph_of(call: Callable, operand_sets: Sequence[tuple], out, torch):
    """(a warmed-up CUDA graph of about GRAPH_SECONDS of calls cycling operand_sets, calls in
    it)."""
    for operands in operand_sets:
        call(*operands, out)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for operands in operand_sets:
        call(*operands, out)
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) * 1e-3 / len(operand_sets), 1e-6)
    rounds = math.ceil(GRAPH_SECONDS / estimate / len(operand_sets))
    rounds = max(1, min(MAX_CALLS_PER_GRAPH // len(operand_sets), rounds))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        for _ in range(rounds):
            for operands in operand_sets:
                call(*operands, out)
    graph.replay()
    torch.cuda.synchronize()
    return graph, rounds * len(operand_sets)
