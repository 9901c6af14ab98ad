"""The one fatbin reader: find a kernel's GPU code in an object file or a linked library.

Each exported object holds its GPU code as one fatbin (the local symbol `kernels_binary`). The
linker copies that fatbin byte for byte into the bundle's library, so its sha256, recorded at build
time, finds the kernel's code again later without any symbol names (local symbols are renamed or
merged when linking). Only the container is read here: the cubins inside it are left to NVIDIA's
tools (aot/binary_info.py).

Every read is bounds-checked: malformed bytes give None, [] or BinaryInspectionError, never
IndexError or struct.error.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterator

from cute_aot.artifacts.core.errors import BinaryInspectionError, ElfError
from cute_aot.artifacts.elf import SHT_NOBITS, read_sections

FATBIN_MAGIC = 0xBA55ED50
KERNELS_BINARY_SYMBOL = "kernels_binary"  # where CuTe DSL exports put the fatbin
FATBIN_ELF_KIND = 2  # fatbin entry kinds: 1 PTX, 2 ELF (cubin)

_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of what follows
_FATBIN_ENTRY = struct.Struct("<HHIQ")  # kind, version, entry header size, payload size
_ENTRY_ARCH_OFFSET = 28  # u32 SM number (90, 100, ...) inside an entry header
_U32 = struct.Struct("<I")


def fatbin_length(data: bytes, offset: int = 0) -> int | None:
    """Total length of a well-formed fatbin header at `offset`, or None."""
    if offset < 0 or offset + _FATBIN_HEADER.size > len(data):
        return None
    magic, version, header_size, body_size = _FATBIN_HEADER.unpack_from(data, offset)
    if magic != FATBIN_MAGIC or version != 1 or header_size != _FATBIN_HEADER.size:
        return None
    total = header_size + body_size
    return total if offset + total <= len(data) else None


def iter_fatbins(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Every well-formed fatbin in `data` (a linked library): (offset, bytes)."""
    magic = _U32.pack(FATBIN_MAGIC)
    offset = data.find(magic)
    while offset >= 0:
        length = fatbin_length(data, offset)
        if length:
            yield offset, data[offset : offset + length]
        offset = data.find(magic, offset + (length or 1))


def find_fatbin(library: bytes, fatbin_sha256: str) -> bytes | None:
    """The fatbin with this sha256 inside a linked library, if any."""
    for _offset, fatbin in iter_fatbins(library):
        if hashlib.sha256(fatbin).hexdigest() == fatbin_sha256:
            return fatbin
    return None


def fatbin_sm_numbers(fatbin: bytes) -> list[int]:
    """SM numbers (90, 100, ...) of the cubins a fatbin holds (PTX entries are skipped)."""
    numbers = []
    offset, end = _FATBIN_HEADER.size, len(fatbin)
    while offset + _FATBIN_ENTRY.size <= end:
        kind, _version, header_size, payload_size = _FATBIN_ENTRY.unpack_from(fatbin, offset)
        if header_size < _ENTRY_ARCH_OFFSET + 4 or offset + header_size > end:
            break
        if kind == FATBIN_ELF_KIND:
            numbers.append(_U32.unpack_from(fatbin, offset + _ENTRY_ARCH_OFFSET)[0])
        offset += header_size + payload_size
    return numbers


def object_fatbin(data: bytes, path: str = "<object>") -> bytes:
    """The fatbin of one exported object file (the `kernels_binary` symbol's bytes)."""
    try:
        elf = read_sections(data)
        for symbol in elf.symbols():
            if symbol.name != KERNELS_BINARY_SYMBOL or not 0 < symbol.section_index < len(
                elf.sections
            ):
                continue
            section = elf.sections[symbol.section_index]
            start = section.offset + symbol.value
            if section.kind != SHT_NOBITS and fatbin_length(data, start) == symbol.size:
                return data[start : start + symbol.size]
    except ElfError as exc:
        raise BinaryInspectionError(f"{path}: {exc}") from None
    raise BinaryInspectionError(f"{path}: no fatbin symbol {KERNELS_BINARY_SYMBOL!r} found")


def sm_number(arch: str) -> int:
    """'sm_90a' -> 90, 'sm_100a' -> 100: what a cubin for that architecture records."""
    match = re.match(r"^sm_(\d+)", arch)
    if not match:
        raise BinaryInspectionError(f"not an SM architecture name: {arch!r}")
    return int(match.group(1))
