"""`aot-build wheel`: bundles as pip-installable wheels, one per architecture.

A wheel holds bundle files byte for byte (a signed bundle stays signed) in a package folder it
registers under the entry-point group `cute_aot.bundles`: the runtime finds it there with nothing
to configure and never imports it (runtime/installed_bundles.py). Its metadata pins what the
bundles need: the cute-aot that built them, an apache-tvm-ffi of the same major.minor (the
loader's ABI rule), and under the extra `jit` the compiler that built them, which only servers
compiling misses need. Its platform tag comes from the bundles' libraries: the CPU from the ELF
header, the manylinux level from the newest GLIBC_x.y symbol version they need.

Reproducible: the same bundles give the same bytes, wherever written (entries sorted, fixed
timestamps and modes, stored uncompressed so that no zlib build changes them; the bundles'
payloads are zstd already).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from cute_aot.artifacts import PACKAGE_VERSION
from cute_aot.artifacts.bundle import BUNDLE_ENTRY_POINT_GROUP, BUNDLE_SUFFIX, read_bundle
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.artifacts.core.errors import BuildError, BundleError, ElfError
from cute_aot.artifacts.elf import DynamicInfo, newest_glibc, read_dynamic
from cute_aot.artifacts.manifest import Manifest
from cute_aot.artifacts.toolchain import CUTLASS_DSL_PREFIX, TVM_FFI_DIST

__all__ = ["WrittenWheel", "glibc_needed", "write_wheels"]

ENTRY_POINT_GROUP = BUNDLE_ENTRY_POINT_GROUP  # what runtime/installed_bundles.py reads

JIT_EXTRA = "jit"
# manylinux2014: the oldest level pip knows for aarch64, and older than any host CUDA 12 runs on.
OLDEST_MANYLINUX = (2, 17)
MANYLINUX_MACHINES = ("x86_64", "aarch64")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can say
ZIP_FILE_MODE = 0o100644 << 16  # a regular file, rw-r--r--, in the zip's Unix attributes
BUNDLE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\Z")
CREATED_BY = re.compile(r"^cute-aot (\S+)\Z")


@dataclass(frozen=True)
class WrittenWheel:
    path: Path
    arch: str
    platform: str  # e.g. manylinux_2_28_x86_64
    bundles: tuple[str, ...]  # the bundle files inside


@dataclass(frozen=True)
class _Bundle:
    path: Path
    data: bytes  # the file, as shipped
    manifest: Manifest
    machine: str
    glibc: tuple[int, int]
    requirements: tuple[str, ...]


def write_wheels(
    sources: Iterable[str | Path],
    out_dir: str | Path,
    name: str | None = None,
    version: str | None = None,
    cute_aot_version: str | None = None,
) -> list[WrittenWheel]:
    """One wheel per architecture of the bundles in `sources` (files, or folders of them), into
    `out_dir`. `name` and `version` default to the bundles' own; `cute_aot_version` (tests)
    replaces the version of cute-aot the wheel requires, by default the one that built them.
    Every wheel is planned before any is written: a refusal (BundleError, BuildError) writes
    nothing."""
    sources = [Path(source) for source in sources]
    bundles = [_read(path, cute_aot_version) for path in _bundle_files(sources)]
    if not bundles:
        raise BuildError(f"no bundles (*{BUNDLE_SUFFIX}) in {', '.join(map(str, sources))}")
    by_arch: dict[str, list[_Bundle]] = {}
    for bundle in bundles:
        by_arch.setdefault(bundle.manifest.arch, []).append(bundle)
    out_dir = Path(out_dir)
    planned = [
        _plan(arch, group, name, version, out_dir) for arch, group in sorted(by_arch.items())
    ]
    for wheel, data in planned:
        atomic_write(wheel.path, data)
    return [wheel for wheel, _ in planned]


def glibc_needed(info: DynamicInfo) -> tuple[int, int]:
    """The oldest glibc a library can load on, from the GLIBC_x.y versions it needs; never
    older than the oldest manylinux level we tag (2.17)."""
    needed = newest_glibc(info)
    return max(needed[:2], OLDEST_MANYLINUX) if needed else OLDEST_MANYLINUX


def _bundle_files(sources: list[Path]) -> list[Path]:
    """Bundle files, a folder's sorted by name, each once however often it was named."""
    files: dict[Path, Path] = {}
    for source in sources:
        if source.is_dir():
            found = sorted(p for p in source.iterdir() if p.name.endswith(BUNDLE_SUFFIX))
        else:
            found = [source]
        for path in found:
            files.setdefault(path.resolve(), path)
    return list(files.values())


def _read(path: Path, cute_aot_version: str | None) -> _Bundle:
    """A bundle verified as a server would before loading it (a corrupt one is refused here, not
    on every server), with the facts its wheel states."""
    manifest, library = read_bundle(path)  # every hash and size; a FIFO is refused, not waited on
    # Read once more to ship: should another build replace the file meanwhile, what servers load
    # is still verified there, in full, before anything is loaded.
    data = path.read_bytes()
    try:
        info = read_dynamic(bytes(library))
    except ElfError as exc:
        raise BundleError(path, f"library is not a shared library: {exc}") from None
    if info.machine not in MANYLINUX_MACHINES:
        raise BundleError(path, f"library is for {info.machine} CPUs: no manylinux tag")
    requirements = _requirements(path, manifest, cute_aot_version)
    return _Bundle(path, data, manifest, info.machine, glibc_needed(info), requirements)


def _requirements(path: Path, manifest: Manifest, cute_aot_version: str | None) -> tuple[str, ...]:
    """What a server needs to use the bundle, as the runtime decides it: the cute-aot that built
    it (kernel sources and families must be the installed ones), a tvm-ffi of the same
    major.minor (toolchain.abi_compatible_tvm_ffi), and for JIT the very compiler (stale
    otherwise): its main distribution and the CUDA flavour of the recorded runtime major."""
    built_by = cute_aot_version
    if built_by is None:
        match = CREATED_BY.match(manifest.created_by)
        if match is None:
            raise BundleError(path, f"created by {manifest.created_by!r}: no cute-aot version")
        built_by = match.group(1)
    toolchain = manifest.toolchain
    try:
        major, minor = (*Version(toolchain.get("tvm_ffi") or "").release, 0)[:2]
    except InvalidVersion:
        raise BundleError(
            path, f"records no usable {TVM_FFI_DIST} version ({toolchain.get('tvm_ffi')!r})"
        ) from None
    requirements = [f"cute-aot=={built_by}", f"{TVM_FFI_DIST}=={major}.{minor}.*"]
    compiler = toolchain.get("cutlass_dsl") or {}
    flavour = f"{CUTLASS_DSL_PREFIX}-libs-cu{toolchain.get('cuda_runtime_major')}"
    for dist in (CUTLASS_DSL_PREFIX, flavour):
        if dist in compiler:
            requirements.append(f'{dist}=={compiler[dist]}; extra == "{JIT_EXTRA}"')
    return tuple(requirements)


def _one(group: list[_Bundle], what: str, value, hint: str):
    """The value every bundle of one wheel shares, else a BuildError naming who differs."""
    values = {value(bundle) for bundle in group}
    if len(values) != 1:
        listed = "; ".join(f"{bundle.path}: {value(bundle)}" for bundle in group)
        raise BuildError(f"{group[0].manifest.arch} bundles differ in {what} ({listed}): {hint}")
    return values.pop()


def _plan(arch: str, group: list[_Bundle], name: str | None, version: str | None, out_dir: Path):
    """(the wheel to write, its bytes) for one architecture's bundles."""
    name = name or _one(group, "name", lambda b: b.manifest.name, "pass --name")
    if not BUNDLE_NAME.match(name):
        raise BuildError(f"{name!r} cannot name a wheel: pass --name (letters, digits, . _ -)")
    raw_version = version or _one(
        group, "bundle version", lambda b: b.manifest.bundle_version, "pass --version"
    )
    try:
        version = str(Version(raw_version))  # normalized, as pip spells it
    except InvalidVersion:
        raise BuildError(f"{raw_version!r} is not a PEP 440 version: pass --version") from None
    requirements = _one(group, "requirements", lambda b: b.requirements, "write separate wheels")
    machine = _one(group, "CPU", lambda b: b.machine, "write separate wheels")
    glibc = max(bundle.glibc for bundle in group)
    platform = f"manylinux_{glibc[0]}_{glibc[1]}_{machine}"
    files = sorted(bundle.path.name for bundle in group)
    if len(set(files)) != len(files):
        raise BuildError(f"{arch}: two bundles named alike ({', '.join(files)}): one per name")

    distribution = canonicalize_name(f"cute-aot-bundle-{name}-{arch.replace('_', '')}")
    package = distribution.replace("-", "_")  # also the wheel's escaped distribution name
    entry_point = f"{name}-{arch} = {package}"
    info = f"{package}-{version}.dist-info"
    group = sorted(group, key=lambda bundle: bundle.path.name)
    contents = {f"{package}/__init__.py": PACKAGE_INIT.encode()}
    contents |= {f"{package}/{bundle.path.name}": bundle.data for bundle in group}
    contents[f"{info}/METADATA"] = _metadata(
        distribution, version, requirements, group, entry_point, glibc
    ).encode()
    contents[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: cute-aot {PACKAGE_VERSION} (aot-build wheel)\n"
        f"Root-Is-Purelib: false\nTag: py3-none-{platform}\n"
    ).encode()
    contents[f"{info}/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{entry_point}\n".encode()
    contents[f"{info}/RECORD"] = _record(contents, f"{info}/RECORD")
    data = _zip(contents)
    wheel_path = out_dir / f"{package}-{version}-py3-none-{platform}.whl"
    return WrittenWheel(wheel_path, arch, platform, tuple(files)), data


PACKAGE_INIT = '''"""cute-aot bundle files (see this distribution's METADATA).

Data only: cute-aot finds this folder through the `cute_aot.bundles` entry point and never
imports the package."""
'''


def _metadata(distribution, version, requirements, group: list[_Bundle], entry_point, glibc):
    """METADATA: name, version and requirements, then a description of what is inside."""
    arch, machine = group[0].manifest.arch, group[0].machine
    families = ", ".join(sorted({family for b in group for family in b.manifest.families}))
    kernels = sum(len(bundle.manifest.entries) for bundle in group)
    rows = []
    for bundle in group:
        manifest, signed = bundle.manifest, bundle.manifest.signature
        signature = f"{signed['algorithm']} key {signed['key_id']}" if signed else "unsigned"
        facts = ", ".join(f"{f} v{v.get('version')}" for f, v in sorted(manifest.families.items()))
        rows.append(f"| `{bundle.path.name}` | {len(manifest.entries)} | {facts} | {signature} |")
    headers = [
        "Metadata-Version: 2.1",
        f"Name: {distribution}",
        f"Version: {version}",
        f"Summary: cute-aot bundles for {arch}: {kernels} prebuilt kernels ({families})",
        *(f"Requires-Dist: {requirement}" for requirement in requirements),
    ]
    if any(requirement.endswith(f'extra == "{JIT_EXTRA}"') for requirement in requirements):
        headers.append(f"Provides-Extra: {JIT_EXTRA}")
    headers += ["Description-Content-Type: text/markdown", ""]
    description = f"""\
# cute-aot bundles for {arch}

{kernels} prebuilt CuTe DSL kernels ({families}) for {arch} GPUs,
on {machine} Linux with glibc {glibc[0]}.{glibc[1]} or newer.

Installing this wheel is all a server needs, with nothing to configure: cute-aot finds
the bundles through the entry point `{entry_point}` (group `{ENTRY_POINT_GROUP}`)
and verifies them before loading them; `aot-cache ls` lists them.

Serving does not need the CuTe DSL compiler. The extra `{JIT_EXTRA}` installs the one these
bundles were built with, for servers that compile the shapes the bundles do not cover.

| bundle | kernels | families | signature |
|---|---|---|---|
{chr(10).join(rows)}
"""
    return "\n".join([*headers, description])


def _record(contents: dict[str, bytes], record_name: str) -> bytes:
    """RECORD: every file's urlsafe-base64 sha256 and size; RECORD itself has neither."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    writer.writerow([record_name, "", ""])
    return out.getvalue().encode()


def _zip(contents: dict[str, bytes]) -> bytes:
    """The archive, entries in the order given (the package, then the dist-info, RECORD last)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in contents.items():
            entry = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            entry.compress_type = zipfile.ZIP_STORED
            entry.create_system = 3  # Unix: the mode below is read (the default differs by OS)
            entry.external_attr = ZIP_FILE_MODE
            archive.writestr(entry, data)
    return buffer.getvalue()
