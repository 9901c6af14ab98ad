"""Does a bundle hold up, and does it fit this machine? The checks behind `aot-cache verify`.

Each check returns (status, detail) with status ok | fail | skip | warn; a skip says what could
not be checked here (no GPU, no driver) so that a pass is never claimed for it. The loader's own
verify_bundle is one of the checks, so verify passes exactly when the loader would accept the
bundle; the others add what the loader does not look at (each kernel's GPU code, the CUDA driver,
stale sources). Nothing is dlopened: the library is read as bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cute_aot.artifacts import signing, toolchain
from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.core.errors import BundleError, BundleFormatError, CuteAotError
from cute_aot.artifacts.fatbin import fatbin_sm_numbers, iter_fatbins, sm_number
from cute_aot.artifacts.manifest import Manifest
from cute_aot.kernels.arch import arch_for_capability, normalize_arch
from cute_aot.runtime import loader
from cute_aot.runtime.device import driver_cuda_version  # noqa: F401  (also what the loader asks)
from cute_aot.runtime.registry import stale_reasons

Result = tuple[str, str]


@dataclass(frozen=True)
class UnreadableSource:
    """A bundle source (a URL) that cannot be fetched now: listed as the source it was named,
    with the reason the runtime gives (a server falling back says the same)."""

    source: str
    reason: str

    def __str__(self) -> str:
        return self.source


def readable(path: Path | UnreadableSource) -> Path:
    """The bundle file to read; the BundleError of a source that cannot be read."""
    if isinstance(path, UnreadableSource):
        raise BundleFormatError(path.source, f"cannot read ({path.reason})")
    return path


def local_gpu() -> dict | None:
    """{"name", "capability", "arch"} of the current CUDA device (arch None: one we do not
    build for); None without a GPU."""
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
    except (RuntimeError, AssertionError):
        return None
    return {
        "name": name,
        "capability": f"{major}.{minor}",
        "arch": arch_for_capability(major, minor),
    }


def check_kernels(manifest: Manifest, library: bytes) -> Result:
    """Each entry's recorded fatbin is in the library and holds code for the manifest's SM."""
    fatbins = {
        hashlib.sha256(fatbin).hexdigest(): fatbin_sm_numbers(fatbin)
        for _, fatbin in iter_fatbins(library)
    }
    recorded = [e for e in manifest.entries if (e.gpu_binary or {}).get("fatbin_sha256")]
    if not recorded:
        return "skip", f"no per-kernel fatbin hashes recorded ({len(fatbins)} fatbins in library)"
    want = sm_number(manifest.arch)
    problems = []
    for entry in recorded:
        digest = entry.gpu_binary["fatbin_sha256"]
        sms = fatbins.get(digest)
        if sms is None:
            problems.append(
                f"{entry.key_id}: its fatbin (sha256 {digest[:16]}) is not in the library"
            )
        elif sms != [want]:
            problems.append(
                f"{entry.key_id}: its fatbin holds SM {sms}, the manifest says {manifest.arch}"
            )
    if problems:
        return "fail", "; ".join(problems)
    unrecorded = len(manifest.entries) - len(recorded)
    extra = f"; {unrecorded} entries record no fatbin hash" if unrecorded else ""
    return "ok", f"{len(recorded)} kernel fatbins found by sha256, all for SM {want}{extra}"


def check_arch(
    manifest: Manifest, gpu_arch: str | None, from_folder: bool, gpu: dict | None
) -> Result:
    """The runtime's rule: a folder's bundles for other architectures are skipped, a bundle named
    explicitly must fit."""
    try:
        if normalize_arch(manifest.arch) != manifest.arch:
            return (
                "fail",
                f"architecture spelled {manifest.arch!r}, "
                f"expected {normalize_arch(manifest.arch)!r}",
            )
    except CuteAotError as exc:
        return "fail", str(exc)
    if gpu is not None and gpu_arch is None:
        return (
            "fail",
            f"this GPU ({gpu['name']}, compute {gpu['capability']}) "
            "is no architecture we build for",
        )
    if gpu_arch is None:
        return "skip", f"{manifest.arch}; no GPU here to check against (see --gpu-arch)"
    if manifest.arch == gpu_arch:
        return "ok", f"{manifest.arch} runs on this GPU ({gpu_arch})"
    if from_folder:
        return (
            "skip",
            f"for {manifest.arch}, this GPU is {gpu_arch}: skipped when its folder is loaded",
        )
    return "fail", f"built for {manifest.arch}, this GPU needs {gpu_arch}"


def check_loader(path: Path) -> Result:
    """Everything the runtime's loader checks short of dlopen: signature policy, tvm-ffi ABI,
    keys re-deriving their ids and symbols, the library's ELF (CPU, exports, needed libraries,
    glibc). The GPU architecture is left to check_arch, which knows the folder rule."""
    try:
        verified = loader.verify_bundle(path, gpu_arch=None)
    except CuteAotError as exc:
        return "fail", str(exc).removeprefix(f"{path}: ")
    manifest, dynamic = verified.manifest, verified.dynamic
    return "ok", (
        f"{len(manifest.entries)} keys re-derive their ids and symbols; {dynamic.machine} library "
        f"exports them all and needs {', '.join(dynamic.needed) or 'nothing'}; tvm-ffi "
        f"{manifest.toolchain.get('tvm_ffi')} built, {toolchain.tvm_ffi_version()} installed"
    )


def check_signature(manifest: Manifest) -> Result:
    """Who signed it, for the record; whether an unsigned or untrusted bundle may load is the
    loader's policy (check_loader)."""
    try:
        described = signing.describe_signature(manifest)
    except CuteAotError as exc:  # CUTE_AOT_TRUSTED_KEYS names something that is not a key
        return "fail", str(exc)
    if described is None:
        required = "required" if signing.signature_required() else "not required"
        return "skip", f"unsigned (a signature is {required} here)"
    return ("warn" if "NOT VERIFIED" in described else "ok"), described


def check_cuda(manifest: Manifest, driver: tuple[int, int] | None) -> Result:
    """The CUDA runtime is linked in statically: the driver must support its major version."""
    major = manifest.toolchain.get("cuda_runtime_major")
    if not isinstance(major, int) or isinstance(major, bool):
        return "fail", "the manifest records no CUDA runtime major version"
    if driver is None:
        return "skip", f"no CUDA driver here; the library links the CUDA {major} runtime statically"
    if driver[0] < major:
        return (
            "fail",
            f"the library links the CUDA {major} runtime; "
            f"the driver supports CUDA {driver[0]}.{driver[1]}",
        )
    return "ok", f"CUDA {major} runtime; the driver supports CUDA {driver[0]}.{driver[1]}"


def check_sources(manifest: Manifest) -> Result:
    stale = stale_reasons(manifest)
    if stale:
        return "fail", "; ".join(f"stale for {name}: {reason}" for name, reason in stale.items())
    return "ok", "kernel sources and compiler match the installed cute-aot"


def verify_bundle(
    path: Path,
    from_folder: bool,
    gpu_arch: str | None,
    gpu: dict | None,
    driver: tuple[int, int] | None,
) -> dict:
    """{"path", "arch", "ok", "usable", "checks": [{"check", "status", "detail"}]}.

    usable: sound and for this GPU's architecture (False without a GPU to compare with).
    """
    checks: list[dict] = []
    report: dict = {"path": str(path), "arch": None, "checks": checks}

    def add(name: str, result: Result) -> None:
        checks.append({"check": name, "status": result[0], "detail": result[1]})

    try:
        manifest, library = read_bundle(readable(path))  # every sha256, bounded decompression
    except BundleError as exc:
        add("integrity", ("fail", str(exc).removeprefix(f"{path}: ")))
        return {**report, "ok": False, "usable": False}
    report["arch"] = manifest.arch
    sizes = f"payload {manifest.payload['size']:,} B, library {manifest.library['size']:,} B"
    add("integrity", ("ok", f"manifest, payload and library sha256 match ({sizes})"))
    add("loader", check_loader(path))
    add("signature", check_signature(manifest))
    add("kernels", check_kernels(manifest, library))
    add("arch", check_arch(manifest, gpu_arch, from_folder, gpu))
    add("cuda", check_cuda(manifest, driver))
    add("sources", check_sources(manifest))
    ok = all(check["status"] != "fail" for check in checks)
    arch_ok = any(c["check"] == "arch" and c["status"] == "ok" for c in checks)
    return {**report, "ok": ok, "usable": ok and arch_ok}
