"""A family is one folder: nothing else of the project names the router family.

The build, the runtime and aot-cache reach every family through its contract only. Tests, docs
and benchmarks may name families; pyproject.toml registers ours, as another project's would.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILY = "router_gemm"
SCANNED = ("aot", "artifacts", "kernels", "runtime")
EXEMPT_FOLDER = ROOT / "kernels" / FAMILY


def _sources():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".json", ".c", ".map", ".toml"}:
                if EXEMPT_FOLDER not in path.parents:
                    yield path


def test_nothing_outside_the_family_folder_names_it():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FAMILY in line
    ]
    assert offenders == []


def test_the_scan_covers_the_packages():
    scanned = {path.relative_to(ROOT).parts[0] for path in _sources()}
    assert scanned == set(SCANNED)  # a renamed folder must not make the test pass vacuously


def test_pyproject_registers_the_family_through_the_entry_point():
    text = (ROOT / "pyproject.toml").read_text()
    registration = f'{FAMILY} = "cute_aot.kernels.{FAMILY}:family"'
    assert re.search(
        r'\[project\.entry-points\."cute_aot\.families"\]\n' + re.escape(registration), text
    )
