"""Bundles shipped as wheels (`aot-build wheel`, `--wheel`), found by servers with nothing to
configure (runtime/installed_bundles.py), listed with their origin by `aot-cache ls`.

Real components throughout: bundles from the real build (stub kernels), wheels from the CLI,
`pip install` into a fresh virtual environment, the runtime and `aot-cache` run there.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cute_aot.aot import wheel
from cute_aot.aot.cli import main as aot_build
from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from cute_aot.artifacts import PACKAGE_VERSION, signing
from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.core.notices import forget
from cute_aot.artifacts.elf import DynamicInfo, read_dynamic
from cute_aot.runtime import installed_bundles, sources
from tests.conftest import ARCHS
from tests.stubs import stub_compile

VERSION = PACKAGE_VERSION  # the bundles' version by default, and the cute-aot they pin
WHEEL_NAME = re.compile(
    rf"^cute_aot_bundle_e2e_(sm90a|sm100a)-{re.escape(VERSION)}-py3-none-"
    r"(manylinux_2_(\d+)_x86_64)\.whl$"
)


def write_wheels_cli(*args) -> list[Path]:
    result = CliRunner().invoke(aot_build, ["wheel", *map(str, args)])
    assert result.exit_code == 0, result.output
    return [
        Path(line.split()[1]) for line in result.output.splitlines() if line.startswith("wrote")
    ]


@pytest.fixture(scope="module")
def wheels(stub_bundles, tmp_path_factory) -> dict[str, Path]:
    """arch -> the wheel `aot-build wheel` wrote for the stub bundles."""
    written = write_wheels_cli(stub_bundles[0], "--out", tmp_path_factory.mktemp("wheels"))
    assert len(written) == 2
    return {arch: next(w for w in written if f"_{compact(arch)}-" in w.name) for arch in ARCHS}


def compact(arch: str) -> str:
    return arch.replace("_", "")  # as wheel names spell it: sm_90a -> sm90a


def metadata_of(archive: zipfile.ZipFile, name: str) -> str:
    [path] = [n for n in archive.namelist() if n.endswith(f".dist-info/{name}")]
    return archive.read(path).decode()


def extract(wheel_path: Path, site_dir: Path) -> None:
    """What an installer does with these wheels (one root, no scripts): unpack them."""
    with zipfile.ZipFile(wheel_path) as archive:
        archive.extractall(site_dir)


# -- the wheel ----------------------------------------------------------------------------------
def test_one_reproducible_wheel_per_architecture(stub_bundles, wheels, tmp_path):
    folder, paths, _ = stub_bundles
    assert set(wheels) == {"sm_90a", "sm_100a"}
    # Written again, into another folder, from the files instead of their folder: same bytes.
    again = write_wheels_cli(*paths, "--out", tmp_path / "again")
    assert {w.name: w.read_bytes() for w in again} == {
        w.name: w.read_bytes() for w in wheels.values()
    }
    for path in paths:
        manifest, library = read_bundle(path)
        wheel_path = wheels[manifest.arch]
        arch = compact(manifest.arch)
        match = WHEEL_NAME.match(wheel_path.name)
        assert match and match.group(1) == arch
        # The tag says the newest glibc the library needs, as the loader reads it.
        needed = [
            int(version.split(".")[1])
            for versions in read_dynamic(bytes(library)).versions.values()
            for version in versions
            if re.match(r"^GLIBC_2\.\d+", version)
        ]
        assert int(match.group(3)) == max(needed)
        package = f"cute_aot_bundle_e2e_{arch}"
        info = f"{package}-{VERSION}.dist-info"
        with zipfile.ZipFile(wheel_path) as archive:
            entries = archive.infolist()
            names = [entry.filename for entry in entries]
            assert names == [
                f"{package}/__init__.py",
                f"{package}/{path.name}",
                f"{info}/METADATA",
                f"{info}/WHEEL",
                f"{info}/entry_points.txt",
                f"{info}/RECORD",
            ]
            assert {(e.date_time, e.external_attr >> 16) for e in entries} == {
                ((1980, 1, 1, 0, 0, 0), 0o100644)
            }
            assert archive.read(f"{package}/{path.name}") == path.read_bytes()
            record = list(csv.reader(archive.read(f"{info}/RECORD").decode().splitlines()))
            assert record[-1] == [f"{info}/RECORD", "", ""]
            for name, digest, size in record[:-1]:
                data = archive.read(name)
                expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert (digest, int(size)) == (f"sha256={expected.decode()}", len(data))
            entry_points = metadata_of(archive, "entry_points.txt")
            assert entry_points == f"[cute_aot.bundles]\ne2e-{manifest.arch} = {package}\n"
            assert f"Tag: py3-none-{match.group(2)}\n" in metadata_of(archive, "WHEEL")
            requires = re.findall(r"^Requires-Dist: (.*)$", metadata_of(archive, "METADATA"), re.M)
        tvm = manifest.toolchain["tvm_ffi"].split(".")
        assert requires[:2] == [f"cute-aot=={VERSION}", f"apache-tvm-ffi=={tvm[0]}.{tvm[1]}.*"]
        compiler = manifest.toolchain["cutlass_dsl"].get("nvidia-cutlass-dsl")
        if compiler:  # the compiler only under the extra: servers do not need it
            assert f'nvidia-cutlass-dsl=={compiler}; extra == "jit"' in requires


def test_the_writer_and_the_runtime_name_one_entry_point_group():
    assert wheel.ENTRY_POINT_GROUP == installed_bundles.ENTRY_POINT_GROUP == "cute_aot.bundles"


@pytest.mark.parametrize(
    ("versions", "machine", "tag"),
    [
        ({"libc.so.6": ("GLIBC_2.2.5", "GLIBC_2.17")}, "x86_64", "manylinux_2_17_x86_64"),
        ({"libc.so.6": ("GLIBC_2.2.5",)}, "x86_64", "manylinux_2_17_x86_64"),  # the floor
        (
            {"libc.so.6": ("GLIBC_2.28", "GLIBC_PRIVATE"), "libm.so.6": ("GLIBC_2.29",)},
            "aarch64",
            "manylinux_2_29_aarch64",
        ),
    ],
)
def test_manylinux_level_is_the_newest_glibc_needed(versions, machine, tag):
    info = DynamicInfo(machine, (), None, None, None, frozenset(), versions)
    major, minor = wheel.glibc_needed(info)
    assert f"manylinux_{major}_{minor}_{machine}" == tag


def test_signed_bundles_stay_signed(stub_bundles, tmp_path):
    source = stub_bundles[1][0]
    signed = shutil.copy(source, tmp_path / source.name)
    key_id = signing.sign_bundle(signed, Ed25519PrivateKey.generate()).signature["key_id"]
    [written] = write_wheels_cli(signed, "--out", tmp_path / "wheels")
    with zipfile.ZipFile(written) as archive:
        inside = archive.read(next(n for n in archive.namelist() if n.endswith(source.name)))
        assert f"ed25519 key {key_id}" in metadata_of(archive, "METADATA")
    assert inside == Path(signed).read_bytes()


def test_a_corrupt_bundle_is_refused_and_nothing_written(stub_bundles, tmp_path):
    good, source = stub_bundles[1][:2]
    corrupt = tmp_path / "bundles" / source.name
    corrupt.parent.mkdir()
    data = bytearray(source.read_bytes())
    data[-1] ^= 0xFF
    corrupt.write_bytes(data)
    shutil.copy(good, corrupt.parent)
    result = CliRunner().invoke(
        aot_build, ["wheel", str(corrupt.parent), "--out", str(tmp_path / "w")]
    )
    assert result.exit_code == 1 and str(corrupt) in result.output and "hash" in result.output
    assert not (tmp_path / "w").exists()


def test_aot_build_wheel_option_writes_them_beside_the_bundles(tmp_path):
    args = ["--arch", "sm_90a", "--families", "router_gemm", "--no-default-shapes"]
    args += ["--shape", "router_gemm:256,7168", "--no-cache", "--quiet", "--out", str(tmp_path)]
    result = CliRunner().invoke(aot_build, [*args, "--wheel"], obj={"worker": stub_compile})
    assert result.exit_code == 0, result.output
    [bundle] = tmp_path.glob("*.cuteaot")
    [written] = tmp_path.glob("*.whl")
    assert written.name.startswith("cute_aot_bundle_default_sm90a-")
    [separately] = write_wheels_cli(bundle, "--out", tmp_path / "separately")
    assert separately.read_bytes() == written.read_bytes()
    shard = CliRunner().invoke(aot_build, [*args, "--shard", "0/2", "--wheel"])
    assert shard.exit_code == 2 and "aot-build merge" in shard.output


# -- a fresh environment: pip install, then nothing to configure --------------------------------
SERVER = """
import json, sys
import tvm_ffi
import cute_aot.runtime
from cute_aot.runtime import REGISTRY, registry

def refuse(*args, **kwargs):
    raise AssertionError("load_bundles called")

cute_aot.runtime.load_bundles = registry.load_bundles = refuse
REGISTRY.load_from_env()  # what the first op call does
print(json.dumps({
    "bundles": [
        {"path": str(b.path), "arch": b.arch,
         "function": all(isinstance(b.function(k), tvm_ffi.Function) for k in b.entries)}
        for b in REGISTRY.bundles
    ],
    "imported": [name for name in sys.modules if name.startswith("cute_aot_bundle")],
}))
"""


@pytest.mark.slow
def test_pip_installed_wheels_are_found_with_nothing_configured(stub_bundles, wheels, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    venv_site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"], text=True
        ).strip()
    )
    # cute-aot and its dependencies come from this environment, as a site folder (its .pth
    # files run: cute-aot is an editable install); the bundle wheels are installed by pip.
    (venv_site / "this-environment.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in site.getsitepackages())
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("CUTE_AOT_")}
    env |= {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "COLUMNS": "300"}
    env.pop("PYTHONPATH", None)

    def pip_install(*wheel_paths):  # --isolated: no PIP_* find-links or config from outside
        command = [sys.executable, "-m", "pip", "--isolated", "--python", python, "install"]
        command += ["--no-index", "--no-input", *wheel_paths]
        return subprocess.run(command, env=env, capture_output=True, text=True)

    # A wheel pinned to another cute-aot than the one installed: pip refuses it.
    [pinned] = wheel.write_wheels(
        [stub_bundles[1][0]], tmp_path / "pinned", name="pinned", cute_aot_version="0.0.1"
    )
    refused = pip_install(pinned.path)
    assert refused.returncode != 0 and "cute-aot==0.0.1" in refused.stderr, refused.stderr
    assert not list(venv_site.glob("cute_aot_bundle_pinned*"))

    installed = pip_install(*wheels.values())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    for arch in ARCHS:
        assert f"cute-aot-bundle-e2e-{compact(arch)}-{VERSION}" in installed.stdout

    server = subprocess.run([python, "-c", SERVER], env=env, capture_output=True, text=True)
    assert server.returncode == 0, server.stderr
    loaded = json.loads(server.stdout)
    assert loaded["imported"] == []  # found from metadata; the packages never ran
    by_arch = {bundle["arch"]: bundle for bundle in loaded["bundles"]}
    assert set(by_arch) == {"sm_90a", "sm_100a"}  # no GPU here: every architecture is loaded
    for arch, bundle in by_arch.items():
        assert Path(bundle["path"]).parent == venv_site / f"cute_aot_bundle_e2e_{compact(arch)}"
        assert bundle["function"]

    cache_ls = [python, "-m", "cute_aot.aot.tools.aot_cache.cli", "ls"]
    listing = subprocess.run([*cache_ls, "--json"], env=env, capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    rows = {row["arch"]: row for row in json.loads(listing.stdout)["bundles"]}
    for arch, row in rows.items():
        assert row["status"] == "ok" and row["path"] == by_arch[arch]["path"]
        assert row["source"] == f"wheel cute-aot-bundle-e2e-{compact(arch)}=={VERSION}"
    table = subprocess.run(cache_ls, env=env, capture_output=True, text=True).stdout
    assert f"wheel cute-aot-bundle-e2e-sm90a=={VERSION}" in table and "origin" in table


# -- discovery in this process --------------------------------------------------------------------
def test_a_wheel_whose_folder_is_missing_is_skipped_with_one_warning(wheels, tmp_path, monkeypatch):
    site_dir = tmp_path / "site"
    for path in wheels.values():
        extract(path, site_dir)
    # Never imported: a package that would fail on import is still found.
    (site_dir / "cute_aot_bundle_e2e_sm100a" / "__init__.py").write_text("raise ImportError\n")
    shutil.rmtree(site_dir / "cute_aot_bundle_e2e_sm90a")
    monkeypatch.syspath_prepend(str(site_dir))
    forget()
    with pytest.warns(RuntimeWarning) as warned:
        found = installed_bundles.installed_bundle_sources()
        assert installed_bundles.installed_bundle_sources() == found
    assert found == [str(site_dir / "cute_aot_bundle_e2e_sm100a")]
    messages = [str(w.message) for w in warned if "cute-aot-bundle" in str(w.message)]
    assert len(messages) == 1 and f"distribution cute-aot-bundle-e2e-sm90a {VERSION}" in messages[0]


def test_cute_aot_bundles_come_before_wheels(
    stub_bundles, wheels, tmp_path, monkeypatch, settings_scope, fresh_runtime
):
    from cute_aot.runtime import REGISTRY

    site_dir = tmp_path / "site"
    for path in wheels.values():
        extract(path, site_dir)
    monkeypatch.syspath_prepend(str(site_dir))
    explicit = shutil.copytree(stub_bundles[0], tmp_path / "explicit")
    settings_scope(CUTE_AOT_BUNDLES=str(explicit))
    wheel_folders = [str(site_dir / f"cute_aot_bundle_e2e_{a}") for a in ("sm100a", "sm90a")]
    assert sources.environment_sources() == [str(explicit), *wheel_folders]

    REGISTRY.load_from_env()
    origins = [Path(bundle.path).parent for bundle in REGISTRY.bundles]
    assert origins == [explicit, explicit, *map(Path, wheel_folders)]
    from_wheel = {bundle.arch: bundle for bundle in REGISTRY.bundles[2:]}
    for bundle in REGISTRY.bundles[:2]:  # first loaded wins for every key
        for key_id, entry in bundle.entries.items():
            served = REGISTRY.bundle_function(entry.family, key_id, bundle.arch)
            assert served is bundle.function(key_id)
            assert served is not from_wheel[bundle.arch].function(key_id)

    listing = CliRunner().invoke(aot_cache, ["ls", "--json", "--no-overlay"])
    assert listing.exit_code == 0, listing.output
    assert [row["source"] for row in json.loads(listing.stdout)["bundles"]] == [
        "CUTE_AOT_BUNDLES",
        "CUTE_AOT_BUNDLES",
        f"wheel cute-aot-bundle-e2e-sm100a=={VERSION}",
        f"wheel cute-aot-bundle-e2e-sm90a=={VERSION}",
    ]
