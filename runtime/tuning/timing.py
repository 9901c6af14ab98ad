"""Kernel timing on a GPU for tuning and benchmarks: CUDA graphs, operands cycled out of L2.

A micro-benchmark that calls one kernel on the same operands finds them in L2 and launches back
to back with nothing in between; a server does neither. So each measurement cycles through
enough copies of the operands to leave L2, replays a CUDA graph of many calls (no launch gaps
from Python), and reports the median over replays.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

L2_FLUSH_BYTES = 256 << 20  # several times the H100/H200 L2 (50 MB)
GRAPH_SECONDS = 1e-3  # aim each replay at about this long
REPLAYS = 5
MAX_CALLS_PER_GRAPH = 200


def operand_copies(operand_bytes: int) -> int:
    """How many copies of a problem's operands to cycle through: enough to leave L2 (max 16)."""
    return max(1, min(16, L2_FLUSH_BYTES // max(1, operand_bytes)))


def seconds_per_call(call: Callable, operand_sets: Sequence[tuple], out) -> float:
    """Median seconds per `call(*operands, out)` over graph replays cycling `operand_sets`."""
    import torch

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
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / (rounds * len(operand_sets)))
    del graph
    return statistics.median(times)
