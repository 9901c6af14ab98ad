"""Recorded on a virtual GPU, built with the GPU hidden, served on the real one (run on the GPU
machine): the user kernel's calls and scale_on_every_sm, whose trace asks the GPU its SM count.
Recorded on a virtual profile of this GPU's model and on one that answers another SM count, the
call is two kernels in one bundle; the real GPU is served the one whose answer it gives, and a
bundle holding only the other misses, naming both answers. The program imports nothing of
cute-aot (tests/user_kernels/torch_program.py): the environment alone activates it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]
SM_COUNT = "HardwareInfo.get_device_multiprocessor_count()"


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env.update(PYTHONPATH=path, CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def _run(args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def _program(tmp_path, **env) -> subprocess.CompletedProcess:
    return _run(
        [sys.executable, "-m", "tests.user_kernels.torch_program", "--every-sm"],
        _env(tmp_path, **env),
        tmp_path,
    )


def _build(tmp_path, records: Path, out: Path) -> None:
    built = _run(
        [
            sys.executable,
            "-m",
            "cute_aot.aot.cli",
            "--from-record",
            f"{records}/",
            "--arch",
            "sm90a",
            "--out",
            str(out),
            "--name",
            "virtual",
            "--quiet",
            "--no-cache",
        ],
        _env(tmp_path, CUDA_VISIBLE_DEVICES=""),
        tmp_path,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]


def test_recorded_virtually_built_blind_and_served_by_the_answers_of_this_gpu(tmp_path):
    import importlib.util

    import torch

    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("needs nvidia-cutlass-dsl on this GPU machine to record (not installed)")
    from cute_aot.kernels import gpu_profiles

    name = torch.cuda.get_device_name()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    profile = gpu_profiles.for_device_name(name)
    if profile is None or profile.arch != "sm_90a":
        pytest.skip(f"no sm_90a profile in kernels/gpu_profiles.json names this GPU ({name})")
    other = tmp_path / "other-gpu.json"
    other.write_text(
        json.dumps({"base": profile.name, "attributes": {"MULTIPROCESSOR_COUNT": sm_count + 8}})
    )
    for folder, spec in (("rec-same", profile.name), ("rec-other", str(other))):
        done = _program(tmp_path, CUTE_AOT_VIRTUAL=spec, CUTE_AOT_RECORD=f"{tmp_path / folder}/")
        assert done.returncode == 0, done.stderr[-3000:]
    both = tmp_path / "rec-both"
    both.mkdir()
    for folder in ("rec-same", "rec-other"):
        for path in (tmp_path / folder).glob("*.jsonl"):
            shutil.copy(path, both / f"{folder}-{path.name}")
    _build(tmp_path, both, tmp_path / "both")
    _build(tmp_path, tmp_path / "rec-other", tmp_path / "other")

    report = tmp_path / "served.json"
    served = _program(
        tmp_path,
        CUTE_AOT_BUNDLES=str(tmp_path / "both"),
        CUTE_AOT_INTERCEPT="1",
        CUTE_AOT_MODE="aot",
        CUTE_AOT_REPORT=str(report),
    )
    assert served.returncode == 0, served.stderr[-3000:]
    counts = json.loads(report.read_text())
    assert (counts["compiles"], counts["hits"], counts["misses"]) == (0, 5, 0), counts

    missed = _program(
        tmp_path,
        CUTE_AOT_BUNDLES=str(tmp_path / "other"),
        CUTE_AOT_INTERCEPT="1",
        CUTE_AOT_MODE="aot",
    )
    assert missed.returncode != 0
    assert "KernelNotFoundError" in missed.stderr, missed.stderr[-3000:]
    assert f"{SM_COUNT} = {sm_count + 8} there, {sm_count} here" in missed.stderr, missed.stderr[
        -3000:
    ]
    assert f"({name})" in missed.stderr
