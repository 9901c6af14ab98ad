"""Workloads that `aot-build record` runs on a virtual GPU of each target architecture, to
record the `cute.compile` calls a server or a trainer makes (docs/recording.md).

Each is a module run as `python -m <module> --model NAME ...`, which calls a library's public
API at one model's shapes and imports nothing of cute-aot's capture (activation records it by
the environment alone, as it would any program). `models` and `configs` are read from the
module without running it; the library it calls is imported only when it runs.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple


class Workload(NamedTuple):
    name: str
    module: str  # run as `python -m module --model NAME`
    library: str  # what it calls, for people
    extra: str  # the pip extra that installs it


WORKLOADS = {
    workload.name: workload
    for workload in (
        Workload("fa4", "cute_aot.aot.workloads.fa4", "FlashAttention-4 (flash-attn-4)", "fa4"),
    )
}


def models_of(name: str) -> dict:
    """model name -> its shapes, as workload `name` knows them (nothing is run)."""
    return importlib.import_module(WORKLOADS[name].module).MODELS


def configs_of(name: str) -> tuple[str, ...]:
    """The configurations workload `name` runs per model."""
    return importlib.import_module(WORKLOADS[name].module).CONFIGS
