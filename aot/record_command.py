"""`aot-build record`: run a workload on a virtual GPU of each target architecture (and of each
GPU named), on this CPU-only machine, and keep what it recorded for `aot-build --from-record`
(which builds each record for the architecture it was recorded on).

The workload is a program (a server's warm-up, a library's tests) or a named workload
(aot/workloads/). It runs as any program does under CUTE_AOT_VIRTUAL and CUTE_AOT_RECORD: the
environment alone activates the recorder in it and in every process it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.markup import escape

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.errors import CuteAotError
from cute_aot.kernels import gpu_profiles
from cute_aot.kernels.recorded import read_records


class Recorded(NamedTuple):
    arch: str
    profile: str  # the virtual GPU it ran as
    folder: Path  # where its records are
    returncode: int
    seconds: float
    calls: int  # lines recorded
    kernels: int  # distinct recreatable calls


class Target(NamedTuple):
    folder: str  # OUT/<folder>/: the architecture, or the GPU as it was named
    spec: str  # CUTE_AOT_VIRTUAL's value
    profile: gpu_profiles.GpuProfile  # the profile it names


def targets(archs: list[str], gpus: list[str]) -> list[Target]:
    """What to record on: each architecture's reference GPU profile, then each GPU named (a
    profile's name, or a JSON override file: CUTE_AOT_VIRTUAL's values)."""
    from cute_aot.runtime.capture.virtual import load_profile

    found = []
    for arch in archs:
        profile = gpu_profiles.reference(arch)
        if profile is None:
            raise CuteAotError(f"no GPU profile stands for {arch} (kernels/gpu_profiles.json)")
        found.append(Target(arch, profile.name, profile))
    found += [Target(Path(gpu).stem, gpu, load_profile(gpu)) for gpu in gpus]
    return found


def record(console: Console, command: list[str], on: list[Target], out: Path) -> list[Recorded]:
    """Run `command` once per target of `targets()`, on its virtual GPU, recording into
    `out/<folder name>/`. A run that fails is said with its exit status; the others go on, and
    what it recorded before failing is kept."""
    done = []
    for name, spec, profile in on:
        arch = profile.arch
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        env = settings.workload_environment(
            **{settings.VIRTUAL.name: spec, settings.RECORD.name: f"{folder}{os.sep}"}
        )
        said = escape(" ".join(command))  # a command may hold [brackets]: not markup
        console.print(f"recording on a virtual {profile.name} ({arch}): {said}")
        started = time.perf_counter()
        returncode = subprocess.run(command, env=env, check=False).returncode
        seconds = time.perf_counter() - started
        recorded = [line for _, line in read_records(str(folder))] if any(folder.iterdir()) else []
        kernels = {line["key_id"] for line in recorded if line.get("recreatable") is True}
        done.append(
            Recorded(arch, profile.name, folder, returncode, seconds, len(recorded), len(kernels))
        )
        outcome = "ok" if returncode == 0 else f"[red]exit status {returncode}[/red]"
        console.print(
            f"  {name}: {outcome}, {len(recorded)} calls recorded, {len(kernels)} distinct "
            f"kernels, {seconds:.0f} s -> {escape(str(folder))}"
        )
    return done


def workload_command(module: str, models: list[str]) -> list[str]:
    """A named workload run by this Python, for each model given."""
    return [sys.executable, "-m", module, *(arg for model in models for arg in ("--model", model))]
