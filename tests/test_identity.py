"""A kernel's identity is the code it makes, and nothing of cute-aot's infrastructure.

Each test installs copies of this cute-aot (`pip install --target`), one as it is and one with
one edit, and asks both the same question about what the previous commit persisted
(tests/data/previous_commit/): the unedited copy is the control, so a machine whose toolchain
makes those artifacts stale anyway tells nothing and says so.
- A comment added to the settings module leaves the previous commit's bundles (a router_gemm
  family bundle and one built from a recorded `cute.compile` call) current.
- A describer that spells a value otherwise describes the recorded call with another key id, so
  the pinned id (test_previous_commit_artifacts.py) catches a change of ids made without a
  version bump.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_previous_commit_artifacts import RECORD_KEY_ID

REPO = Path(__file__).resolve().parents[1]
BUNDLES = REPO / "tests" / "data" / "previous_commit" / "bundles"
PACKAGE = ("aot", "artifacts", "kernels", "runtime", "pyproject.toml", "setup.py", "README.md")


def _installed(tmp_path: Path, name: str, edit=None) -> Path:
    """This cute-aot installed into tmp_path/name, `edit(source folder)` applied first."""
    source = tmp_path / f"{name}-source"
    source.mkdir()
    for part in PACKAGE:
        if (REPO / part).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / part, source / part, ignore=ignore)
        elif (REPO / part).exists():
            shutil.copy2(REPO / part, source / part)
    if edit is not None:
        edit(source)
    target = tmp_path / name
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return target


def _run(site: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    return subprocess.run(
        [sys.executable, *argv], env=env, cwd=site.parent, capture_output=True, text=True
    )


def _verify(site: Path) -> subprocess.CompletedProcess:
    return _run(site, ["-m", "cute_aot.aot.tools.aot_cache.cli", "verify", str(BUNDLES)])


def _append_comment(source: Path) -> None:
    settings = source / "artifacts" / "core" / "settings.py"
    settings.write_text(settings.read_text() + "\n# a comment: it changes no kernel\n")


def _spell_values_otherwise(source: Path) -> None:
    calls = source / "kernels" / "recorded" / "calls.py"
    text = calls.read_text()
    spelled = '{"py": name, "value": value}'
    assert spelled in text, "the describer's spelling of a value moved: update this test"
    calls.write_text(text.replace(spelled, '{"py": name, "value": value, "spelled": 2}'))


@pytest.mark.slow
def test_a_comment_in_the_settings_module_leaves_earlier_bundles_current(tmp_path):
    control = _verify(_installed(tmp_path, "as-is"))
    if control.returncode != 0:
        pytest.skip(f"the previous commit's bundles are not current here: {control.stdout[-600:]}")
    edited = _verify(_installed(tmp_path, "commented", _append_comment))
    assert edited.returncode == 0, edited.stdout[-2000:] + edited.stderr[-2000:]
    assert "2 bundle(s) verified" in edited.stdout


DESCRIBE = """
import cutlass.cute as cute
from cute_aot.kernels.recorded.calls import describe_call
from tests.user_kernels.compile_calls import arguments
from tests.user_kernels.scale import scale
options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
print(describe_call(options, scale, arguments(1000), {"block": 128}).key().id)
"""


@pytest.mark.slow
def test_a_describer_change_moves_the_recorded_id_and_the_pinned_id_catches_it(tmp_path):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")
    control = _run(_installed(tmp_path, "as-is"), ["-c", DESCRIBE])
    assert control.stdout.split() == [RECORD_KEY_ID], control.stderr[-2000:]
    edited = _run(_installed(tmp_path, "respelled", _spell_values_otherwise), ["-c", DESCRIBE])
    assert edited.returncode == 0, edited.stderr[-2000:]
    moved = edited.stdout.split()
    assert len(moved) == 1 and moved[0] != RECORD_KEY_ID


def test_a_family_s_source_hash_covers_kernel_code_only():
    """A builder that imports cute-aot's infrastructure (errors, settings) does not take it into
    its family's identity: only modules of cute_aot.kernels are hashed."""
    from cute_aot.kernels import binary_modules, families, family

    hashed = {
        name: binary_modules(name) for name in families() if family(name).builder_version is None
    }
    assert hashed, "no family identified by its files"
    outside = {
        name: [module for module in modules if not module.startswith("cute_aot.kernels.")]
        for name, modules in hashed.items()
    }
    assert not any(outside.values()), outside
