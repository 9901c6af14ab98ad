"""Proof of reproducibility: a second, clean build (no cache, other scratch folders) must write
byte-identical bundle files; when it does not, say which kernels or which part differ."""

from __future__ import annotations

from pathlib import Path

from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.core.atomic import scratch_folder
from cute_aot.artifacts.core.errors import NotReproducibleError


def explain_difference(first: Path, second: Path) -> str:
    """Why two bundle files differ, as precisely as their manifests allow."""
    (m1, lib1), (m2, lib2) = read_bundle(first), read_bundle(second)
    objects1 = {e.symbol: e.sha256 for e in m1.entries}
    objects2 = {e.symbol: e.sha256 for e in m2.entries}
    if objects1.keys() != objects2.keys():
        return f"different kernels ({len(objects1.keys() ^ objects2.keys())} symbols differ)"
    changed = sorted(s for s in objects1 if objects1[s] != objects2[s])
    if changed:
        return (
            f"{len(changed)} kernel objects compiled differently on {m1.arch}, "
            f"e.g. {', '.join(changed[:3])}"
        )
    if lib1 != lib2:
        return "same objects but a different linked library (the link is not deterministic)"
    return "same library but a different manifest or compression"


def compare_folders(expected: list[Path], rebuilt_dir: Path) -> list[str]:
    """Problems found comparing each expected bundle with its namesake in rebuilt_dir."""
    problems = []
    for path in expected:
        twin = rebuilt_dir / path.name
        if not twin.exists():
            problems.append(f"{path.name}: the clean rebuild did not write it")
        elif twin.read_bytes() != path.read_bytes():
            problems.append(f"{path.name}: {explain_difference(path, twin)}")
    return problems


def check_reproducible(expected: list[Path], rebuild) -> None:
    """rebuild(folder) builds the same plan cleanly into folder; raises NotReproducibleError."""
    with scratch_folder("cute-aot-repro") as folder:
        rebuild(folder)
        problems = compare_folders(expected, folder)
    if problems:
        raise NotReproducibleError(
            "a clean rebuild is not byte-identical:\n" + "\n".join(f"  {p}" for p in problems)
        )
