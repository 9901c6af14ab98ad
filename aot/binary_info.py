"""What a kernel's GPU binary is: its resources and SASS instruction mix, via NVIDIA's tools.

The fatbin itself is found by artifacts/fatbin.py (the one fatbin reader, with artifacts/elf.py
the one ELF reader); this module runs cuobjdump and nvdisasm (PyPI `nvidia-cuda-cuobjdump`,
`nvidia-cuda-nvdisasm`) on it and turns their output into the records a manifest keeps. Without
the tools only the fatbin's hash, size and SM numbers are recorded.

Pure Python plus those two tools: never imports cutlass or loads a library.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.atomic import scratch_folder
from cute_aot.artifacts.core.errors import BinaryInspectionError, ToolNotFoundError
from cute_aot.artifacts.fatbin import fatbin_sm_numbers, object_fatbin

TOOL_TIMEOUT_S = 120
TOOL_DISTRIBUTIONS = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}


# -- NVIDIA tools --------------------------------------------------------------------------------
def find_tool(name: str) -> str | None:
    """cuobjdump / nvdisasm: the pinned PyPI wheel first (found without importing it), then PATH,
    then $CUDA_HOME/bin."""
    try:
        for file in metadata.distribution(TOOL_DISTRIBUTIONS[name]).files or []:
            if file.name == name:
                located = Path(file.locate())
                if os.access(located, os.X_OK):
                    return str(located.resolve())
    except metadata.PackageNotFoundError:
        pass
    found = shutil.which(name)
    if found:
        return found
    cuda_home = settings.cuda_home()
    candidate = Path(cuda_home, "bin", name) if cuda_home else None
    return str(candidate) if candidate and os.access(candidate, os.X_OK) else None


def require_tool(name: str) -> str:
    tool = find_tool(name)
    if tool is None:
        raise ToolNotFoundError(name, TOOL_DISTRIBUTIONS[name])
    return tool


def tool_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release [\d.]+, V([\d.]+)", out.stdout)
    return match.group(1) if match else None


def _run(command: list[str], cwd: str | None = None) -> str:
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, cwd=cwd, timeout=TOOL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BinaryInspectionError(f"{Path(command[0]).name} failed to run: {exc}") from None
    if result.returncode != 0:
        raise BinaryInspectionError(
            f"{Path(command[0]).name} {' '.join(command[1:-1])} failed on {command[-1]}: "
            f"{(result.stderr or result.stdout).strip()}"
        )
    return result.stdout


_FUNCTION_LINE = re.compile(r"^\s*Function (\S+):\s*$")
_RESOURCE_ITEM = re.compile(r"([A-Z]+)(?:\[(\d+)\])?:(\d+)")
_RESOURCE_NAMES = {"REG": "registers", "SHARED": "shared", "STACK": "stack", "LOCAL": "local"}


def parse_resource_usage(text: str) -> dict[str, dict[str, int]]:
    """`cuobjdump -res-usage` -> {function: {registers, shared, stack, local, constant0}}."""
    usage: dict[str, dict[str, int]] = {}
    function = None
    for line in text.splitlines():
        header = _FUNCTION_LINE.match(line)
        if header:
            function = header.group(1)
            continue
        if function and "REG:" in line:
            record = {}
            for name, bank, value in _RESOURCE_ITEM.findall(line):
                if name in _RESOURCE_NAMES:
                    record[_RESOURCE_NAMES[name]] = int(value)
                elif name == "CONSTANT" and bank == "0":
                    record["constant0"] = int(value)  # kernel parameters live in bank 0
            usage[function] = record
            function = None
    return usage


_SASS_SECTION = re.compile(r"^\.text\.(\S+):\s*$")
# "/*0120*/   @!P0 HMMA.16816.F32.BF16 R4, ..." -> HMMA (predicate and modifiers dropped)
_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)")


def parse_sass_opcodes(text: str) -> dict[str, Counter]:
    """nvdisasm / cuobjdump -sass text -> {function: Counter(opcode)}."""
    counts: dict[str, Counter] = {}
    current: Counter | None = None
    for line in text.splitlines():
        section = _SASS_SECTION.match(line)
        if section:
            current = counts.setdefault(section.group(1), Counter())
            continue
        function = re.match(r"^\s*Function : (\S+)", line)  # cuobjdump -sass spelling
        if function:
            current = counts.setdefault(function.group(1), Counter())
            continue
        instruction = _SASS_INSTRUCTION.match(line)
        if instruction and current is not None:
            current[instruction.group(1)] += 1
    return counts


def extract_cubins(fatbin_path: Path, cuobjdump: str) -> list[Path]:
    """The cubins of a fatbin file, written next to it."""
    folder = fatbin_path.parent
    before = set(folder.iterdir())
    _run([cuobjdump, "-xelf", "all", str(fatbin_path)], cwd=str(folder))
    return sorted(p for p in set(folder.iterdir()) - before if p.suffix == ".cubin")


def disassemble(fatbin: bytes, show_encoding: bool = False) -> str:
    """SASS of every cubin in a fatbin (nvdisasm, labels resolved; code sections only)."""
    cuobjdump, nvdisasm = require_tool("cuobjdump"), require_tool("nvdisasm")
    with scratch_folder("cute-aot-sass") as scratch:
        path = Path(scratch) / "kernel.fatbin"
        path.write_bytes(fatbin)
        options = ["-c", "-hex"] if show_encoding else ["-c"]
        return "".join(
            _run([nvdisasm, *options, str(cubin)]) for cubin in extract_cubins(path, cuobjdump)
        )


def inspect_fatbin(fatbin: bytes) -> dict:
    """What the manifest records about one kernel's GPU binary.

    Always: fatbin sha256 and size, cubin SM numbers. With cuobjdump: per function registers,
    static shared memory, stack, local memory; with nvdisasm too: SASS opcode counts.
    """
    info: dict = {
        "fatbin_sha256": hashlib.sha256(fatbin).hexdigest(),
        "fatbin_size": len(fatbin),
        "sm": fatbin_sm_numbers(fatbin),
    }
    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None:
        return info
    nvdisasm = find_tool("nvdisasm")
    with scratch_folder("cute-aot-inspect") as scratch:
        path = Path(scratch) / "kernel.fatbin"
        path.write_bytes(fatbin)
        usage = parse_resource_usage(_run([cuobjdump, "-res-usage", str(path)]))
        opcodes: dict[str, Counter] = {}
        if nvdisasm is not None:
            for cubin in extract_cubins(path, cuobjdump):
                # -ndf: no dataflow annotations, half the time; opcodes are all we need.
                opcodes.update(parse_sass_opcodes(_run([nvdisasm, "-c", "-ndf", str(cubin)])))
    kernels = []
    for name in sorted(usage.keys() | opcodes.keys()):
        kernel = {"name": name, **usage.get(name, {})}
        if nvdisasm is not None:
            kernel["opcodes"] = dict(sorted(opcodes.get(name, Counter()).items()))
        kernels.append(kernel)
    info["kernels"] = kernels
    return info


def well_formed_kernels(kernels) -> bool:
    """A manifest's "kernels" record as inspect_fatbin writes it (readers trust nothing else)."""
    if not isinstance(kernels, list):
        return False
    for kernel in kernels:
        if not isinstance(kernel, dict) or not isinstance(kernel.get("name"), str):
            return False
        opcodes = kernel.get("opcodes", {})
        if not isinstance(opcodes, dict) or not all(
            isinstance(o, str) and type(c) is int for o, c in opcodes.items()
        ):
            return False
    return True


def inspect_object(path: str | os.PathLike) -> dict | None:
    """inspect_fatbin for an exported object; None when it cannot be inspected (the build goes
    on: inspection only informs)."""
    try:
        data = Path(path).read_bytes()
        return inspect_fatbin(object_fatbin(data, str(path)))
    except (OSError, BinaryInspectionError):
        return None


# -- instruction classes -------------------------------------------------------------------------
# Ordered: the first matching class wins. Names use SASS spellings, which is what tuners grep for.
INSTRUCTION_CLASSES: tuple[tuple[str, str, str], ...] = (
    ("UTC*MMA", r"UTC\w*MMA", "tcgen05.mma (Blackwell tensor cores)"),
    ("UTC*", r"UTC\w+|LDTM|STTM", "tcgen05 copies, commits, tensor-memory loads/stores"),
    ("HGMMA", r"[A-Z]GMMA", "wgmma (Hopper warpgroup tensor cores)"),
    ("HMMA", r"[HIDBQO]MMA", "mma.sync (warp-level tensor cores)"),
    ("UTMA*", r"UTMA\w+|UBLK\w+", "TMA / bulk async copies"),
    ("LDGSTS", r"LDGSTS", "cp.async (global -> shared)"),
    ("LDSM", r"LDSM", "ldmatrix"),
    ("STSM", r"STSM", "stmatrix"),
    ("LDG", r"LDG", "global loads"),
    ("STG", r"STG", "global stores"),
    ("LDS", r"LDS", "shared loads"),
    ("STS", r"STS", "shared stores"),
    ("LD/ST", r"LD|ST", "generic loads/stores (e.g. distributed shared memory)"),
    ("ATOM/RED", r"ATOM\w*|RED\w*", "atomics and reductions to memory"),
    ("SHFL", r"SHFL", "warp shuffles"),
    ("SYNCS", r"SYNCS|ARRIVES", "mbarrier operations"),
    ("BAR", r"BAR|UCGABAR_\w+|CGAERRBAR", "CTA / cluster barriers"),
    ("FFMA", r"FFMA", "fp32 fused multiply-adds"),
    ("HFMA2/FHFMA", r"HFMA2|FHFMA", "fp16/bf16 multiply-adds (packed, or mixed into fp32)"),
)
_CLASS_PATTERNS = [(name, re.compile(rf"^(?:{rx})$")) for name, rx, _ in INSTRUCTION_CLASSES]
CLASS_DESCRIPTIONS = {name: about for name, _, about in INSTRUCTION_CLASSES}


def instruction_class(opcode: str) -> str | None:
    return next((name for name, rx in _CLASS_PATTERNS if rx.match(opcode)), None)


def classify_opcodes(opcodes: dict[str, int]) -> dict[str, int]:
    """Opcode counts -> counts per notable class (in INSTRUCTION_CLASSES order), "total" last."""
    classes: Counter = Counter()
    for opcode, count in opcodes.items():
        name = instruction_class(opcode)
        if name:
            classes[name] += count
    ordered = {name: classes[name] for name, _, _ in INSTRUCTION_CLASSES if classes[name]}
    ordered["total"] = sum(opcodes.values())
    return ordered
