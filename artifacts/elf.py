"""Read what the dynamic loader would act on in an ELF shared library, from bytes, without loading.

A bundle's library is checked before any dlopen: which machine it is for, which libraries it
needs (DT_NEEDED), any search path baked into it (DT_RPATH/DT_RUNPATH) and which functions it
exports. Only the program headers and the dynamic segment are read, as the loader does; section
headers (which the loader ignores and a hostile file could make lie) are not. 64-bit
little-endian only: every platform we build for. Every offset is bounds-checked, so hostile bytes
end in ElfError, never in IndexError or struct.error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
MACHINES = {62: "x86_64", 183: "aarch64"}

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")
_DYNAMIC = struct.Struct("<qQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_U32 = struct.Struct("<I")
_VERNEED = struct.Struct("<HHIII")  # version, count, file, aux offset, next offset
_VERNAUX = struct.Struct("<IHHII")  # hash, flags, other, name, next offset

ELFCLASS64, ELFDATA2LSB, ET_DYN = 2, 1, 3
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 1, 4, 5, 6, 10, 11
DT_SONAME, DT_RPATH, DT_RUNPATH, DT_GNU_HASH = 14, 15, 29, 0x6FFFFEF5
DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFE, 0x6FFFFFFF
STT_FUNC, STB_GLOBAL, STB_WEAK, SHN_UNDEF = 2, 1, 2, 0
STV_DEFAULT, STV_PROTECTED = 0, 3
MAX_PROGRAM_HEADERS = 4096  # real libraries have about ten
MAX_VERSION_RECORDS = 4096  # bounds the version-need walk (its offsets could form a loop)


class ElfError(ValueError):
    """The bytes are not a well-formed 64-bit little-endian ELF shared library."""


@dataclass(frozen=True)
class DynamicInfo:
    machine: str  # "x86_64", "aarch64", or "EM_<number>" for others
    needed: tuple[str, ...]  # DT_NEEDED, in order
    soname: str | None
    rpath: str | None
    runpath: str | None
    functions: frozenset[str]  # defined, exported (global/weak, default/protected) functions
    versions: dict[str, tuple[str, ...]]  # needed library -> symbol versions (e.g. GLIBC_2.34)


def read_dynamic(data: bytes) -> DynamicInfo:
    """The dynamic-linking facts of a shared library's bytes; ElfError when malformed."""
    view = memoryview(data)
    if len(view) < _HEADER.size or bytes(view[:4]) != ELF_MAGIC:
        raise ElfError("not an ELF file (bad magic)")
    ident, e_type, e_machine, _v, _entry, phoff, _shoff, _flags, _ehsize, phentsize, phnum = (
        _HEADER.unpack_from(view)[:11]
    )
    if ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB:
        raise ElfError("not a 64-bit little-endian ELF file")
    if e_type != ET_DYN:
        raise ElfError(f"not a shared library (ELF type {e_type})")
    if phentsize != _PROGRAM_HEADER.size or not 0 < phnum <= MAX_PROGRAM_HEADERS:
        raise ElfError(f"unexpected program headers ({phnum} of {phentsize} bytes)")
    segments = [
        _PROGRAM_HEADER.unpack_from(view, _span(view, phoff + i * phentsize, phentsize))
        for i in range(phnum)
    ]
    loads = [
        (vaddr, offset, filesz)
        for kind, _, offset, vaddr, _, filesz, _, _ in segments
        if kind == PT_LOAD
    ]
    dynamic = [
        (offset, filesz) for kind, _, offset, _, _, filesz, _, _ in segments if kind == PT_DYNAMIC
    ]
    if len(dynamic) != 1:
        raise ElfError(f"expected one dynamic segment, found {len(dynamic)}")
    tags = _dynamic_tags(view, *dynamic[0])

    def address(tag: int) -> int:
        if tag not in tags:
            raise ElfError(f"dynamic tag {tag:#x} missing")
        return _file_offset(loads, tags[tag][0])

    strtab, strsz = address(DT_STRTAB), tags.get(DT_STRSZ, [0])[0]
    _span(view, strtab, strsz)

    def string(offset: int) -> str:
        if offset >= strsz:
            raise ElfError(f"string offset {offset} outside the string table")
        end = data.find(b"\0", strtab + offset, strtab + strsz)  # no copy: linear, not quadratic
        if end < 0:
            raise ElfError("unterminated string in the string table")
        return bytes(view[strtab + offset : end]).decode("latin-1")

    def optional(tag: int) -> str | None:
        return string(tags[tag][0]) if tag in tags else None

    if tags.get(DT_SYMENT, [_SYMBOL.size])[0] != _SYMBOL.size:
        raise ElfError("unexpected symbol entry size")
    symtab = address(DT_SYMTAB)
    count = _symbol_count(view, loads, tags)
    _span(view, symtab, count * _SYMBOL.size)
    functions = set()
    for index in range(count):
        name, info, other, shndx, _value, _size = _SYMBOL.unpack_from(
            view, symtab + index * _SYMBOL.size
        )
        binding, kind, visibility = info >> 4, info & 0xF, other & 0x3
        if (
            kind == STT_FUNC
            and binding in (STB_GLOBAL, STB_WEAK)
            and visibility in (STV_DEFAULT, STV_PROTECTED)
            and shndx != SHN_UNDEF
        ):
            functions.add(string(name))
    return DynamicInfo(
        machine=MACHINES.get(e_machine, f"EM_{e_machine}"),
        needed=tuple(string(offset) for offset in tags.get(DT_NEEDED, [])),
        soname=optional(DT_SONAME),
        rpath=optional(DT_RPATH),
        runpath=optional(DT_RUNPATH),
        functions=frozenset(functions),
        versions=_needed_versions(view, loads, tags, string),
    )


def _span(view: memoryview, offset: int, size: int) -> int:
    """`offset`, after checking that [offset, offset + size) lies inside the file."""
    if offset < 0 or size < 0 or offset + size > len(view):
        raise ElfError(f"{size} bytes at offset {offset} lie outside the {len(view)}-byte file")
    return offset


def _dynamic_tags(view: memoryview, offset: int, size: int) -> dict[int, list[int]]:
    """tag -> values, in order (DT_NEEDED repeats), up to DT_NULL."""
    _span(view, offset, size)
    tags: dict[int, list[int]] = {}
    for position in range(offset, offset + size - _DYNAMIC.size + 1, _DYNAMIC.size):
        tag, value = _DYNAMIC.unpack_from(view, position)
        if tag == DT_NULL:
            return tags
        tags.setdefault(tag, []).append(value)
    raise ElfError("dynamic segment has no DT_NULL terminator")


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int:
    """Map a virtual address to its file offset through the loadable segments."""
    for start, offset, size in loads:
        if start <= vaddr < start + size:
            return offset + vaddr - start
    raise ElfError(f"address {vaddr:#x} is in no loadable segment")


def _u32s(view: memoryview, offset: int, count: int) -> tuple[int, ...]:
    return struct.unpack_from(f"<{count}I", view, _span(view, offset, 4 * count))


def _symbol_count(view: memoryview, loads, tags: dict[int, list[int]]) -> int:
    """Number of dynamic symbols: the dynamic segment does not say; the hash tables do."""
    if DT_HASH in tags:
        return _u32s(view, _file_offset(loads, tags[DT_HASH][0]), 2)[1]  # nchain
    if DT_GNU_HASH not in tags:
        raise ElfError("no symbol hash table (DT_HASH or DT_GNU_HASH)")
    table = _file_offset(loads, tags[DT_GNU_HASH][0])
    nbuckets, symoffset, bloom_words, _shift = _u32s(view, table, 4)
    buckets_at = table + 16 + 8 * bloom_words
    buckets = _u32s(view, buckets_at, nbuckets)
    last = max(buckets, default=0)
    if last < symoffset:
        return symoffset
    chain_at = buckets_at + 4 * nbuckets
    # The chain of the highest bucket ends at the last symbol: its entry has the low bit set.
    while not _U32.unpack_from(view, _span(view, chain_at + 4 * (last - symoffset), 4))[0] & 1:
        last += 1
    return last + 1


def _needed_versions(view: memoryview, loads, tags: dict[int, list[int]], string) -> dict:
    """DT_VERNEED: the symbol versions each needed library must provide (the loader refuses a
    library whose versions are missing, e.g. GLIBC_2.34 on an older glibc)."""
    if DT_VERNEED not in tags:
        return {}
    count = tags.get(DT_VERNEEDNUM, [0])[0]
    if count > MAX_VERSION_RECORDS:
        raise ElfError(f"{count} version-need records")
    versions: dict[str, list[str]] = {}
    record, seen = _file_offset(loads, tags[DT_VERNEED][0]), 0
    for _ in range(count):
        _version, aux_count, file, aux, following = _VERNEED.unpack_from(
            view, _span(view, record, _VERNEED.size)
        )
        names = versions.setdefault(string(file), [])
        entry = record + aux
        for _ in range(aux_count):
            seen += 1
            if seen > MAX_VERSION_RECORDS:
                raise ElfError("too many version-need records")
            _hash, _flags, _other, name, next_aux = _VERNAUX.unpack_from(
                view, _span(view, entry, _VERNAUX.size)
            )
            names.append(string(name))
            entry += next_aux
        record += following
    return {file: tuple(names) for file, names in versions.items()}
