"""The one ELF reader: 64-bit little-endian files, from bytes, without loading anything.

Two views of a file, as the two programs that read ELF see it:

- read_dynamic: what the dynamic loader acts on in a shared library (a bundle's library, checked
  before any dlopen): machine, needed libraries (DT_NEEDED), baked-in search paths
  (DT_RPATH/DT_RUNPATH), exported functions and needed symbol versions. Only the program headers
  and the dynamic segment are read, as the loader does; section headers (which the loader
  ignores and a hostile file could make lie) are not.
- read_sections: what a linker reads in an object file (a build's exported kernel): sections and
  their symbols, e.g. to find the fatbin a CuTe DSL export holds (artifacts/fatbin.py).

64-bit little-endian only: every platform we build for. Every offset is bounds-checked, so
hostile bytes end in ElfError, never in IndexError or struct.error.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from cute_aot.artifacts.core.errors import ElfError

__all__ = [
    "DynamicInfo",
    "ElfError",
    "ElfSections",
    "Section",
    "Symbol",
    "read_dynamic",
    "read_sections",
]

ELF_MAGIC = b"\x7fELF"
MACHINES = {62: "x86_64", 183: "aarch64"}

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
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
SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS, SHT_DYNSYM = 2, 3, 8, 11
STT_FUNC, STB_GLOBAL, STB_WEAK, SHN_UNDEF = 2, 1, 2, 0
STV_DEFAULT, STV_PROTECTED = 0, 3
MAX_PROGRAM_HEADERS = 4096  # real libraries have about ten
MAX_SECTIONS = 65280  # SHN_LORESERVE: more needs extended numbering, which no export of ours uses
MAX_VERSION_RECORDS = 4096  # bounds the version-need walk (its offsets could form a loop)


class _Header(NamedTuple):
    ident: bytes
    type: int
    machine: int
    version: int
    entry: int
    phoff: int
    shoff: int
    flags: int
    ehsize: int
    phentsize: int
    phnum: int
    shentsize: int
    shnum: int
    shstrndx: int


def _header(view: memoryview) -> _Header:
    """The file header, after checking that this is ELF in the one flavour we read."""
    if len(view) < _HEADER.size or bytes(view[:4]) != ELF_MAGIC:
        raise ElfError("not an ELF file (bad magic)")
    header = _Header(*_HEADER.unpack_from(view))
    if header.ident[4] != ELFCLASS64 or header.ident[5] != ELFDATA2LSB:
        raise ElfError("not a 64-bit little-endian ELF file")
    return header


# -- the loader's view: program headers and the dynamic segment ----------------------------------
@dataclass(frozen=True)
class DynamicInfo:
    machine: str  # "x86_64", "aarch64", or "EM_<number>" for others
    needed: tuple[str, ...]  # DT_NEEDED, in order
    soname: str | None
    rpath: str | None
    runpath: str | None
    functions: frozenset[str]  # defined, exported (global/weak, default/protected) functions
    versions: dict[str, tuple[str, ...]]  # needed library -> symbol versions (e.g. GLIBC_2.34)


_GLIBC_VERSION = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.\d+)?\Z")  # GLIBC_2.34, GLIBC_2.2.5


def newest_glibc(info: DynamicInfo) -> tuple[int, int, str] | None:
    """(major, minor, name) of the newest GLIBC_x.y symbol version a library needs (the glibc it
    needs at least), None when it needs none; GLIBC_PRIVATE and the like are not versions."""
    needed = [
        (int(match.group(1)), int(match.group(2)), version)
        for versions in info.versions.values()
        for version in versions
        if (match := _GLIBC_VERSION.match(version))
    ]
    return max(needed) if needed else None


def read_dynamic(data: bytes) -> DynamicInfo:
    """The dynamic-linking facts of a shared library's bytes; ElfError when malformed."""
    view = memoryview(data)
    header = _header(view)
    e_type, e_machine = header.type, header.machine
    phoff, phentsize, phnum = header.phoff, header.phentsize, header.phnum
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


# -- the linker's view: sections and their symbols -----------------------------------------------
@dataclass(frozen=True)
class Section:
    index: int
    name: str
    kind: int  # SHT_*
    offset: int
    size: int
    link: int  # for a symbol table: the index of its string table


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int  # in an object file: the offset inside its section
    size: int
    section_index: int  # SHN_UNDEF (0) when undefined
    binding: int  # 0 local, 1 global, 2 weak


class ElfSections:
    """Sections and symbols of an ELF file held in memory (object files: what a linker reads)."""

    def __init__(self, data: bytes):
        self.data = data
        view = self._view = memoryview(data)
        header = _header(view)
        count = header.shnum
        if count and header.shentsize != _SECTION_HEADER.size:
            raise ElfError(f"unexpected section header size {header.shentsize}")
        if count > MAX_SECTIONS:
            raise ElfError(f"{count} sections")
        _span(view, header.shoff, count * _SECTION_HEADER.size)
        raw = [
            _SECTION_HEADER.unpack_from(view, header.shoff + i * _SECTION_HEADER.size)
            for i in range(count)
        ]
        names = raw[header.shstrndx] if header.shstrndx < count else None
        self.sections: list[Section] = []
        for index, (name, kind, _flags, _addr, offset, size, link, *_) in enumerate(raw):
            if kind != SHT_NOBITS:  # .bss occupies no bytes of the file: nothing to bound
                _span(view, offset, size)
            label = self._string(names[4], names[5], name) if names else ""
            self.sections.append(Section(index, label, kind, offset, size, link))

    def _string(self, table_offset: int, table_size: int, offset: int) -> str:
        """A NUL-terminated string of the string table at [table_offset, +table_size)."""
        _span(self._view, table_offset, table_size)
        if offset >= table_size:
            raise ElfError(f"string offset {offset} outside its {table_size}-byte string table")
        end = self.data.find(b"\0", table_offset + offset, table_offset + table_size)
        if end < 0:
            raise ElfError("unterminated string in a string table")
        return bytes(self._view[table_offset + offset : end]).decode(errors="replace")

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def section_bytes(self, section: Section) -> bytes:
        if section.kind == SHT_NOBITS:
            raise ElfError(f"section {section.name!r} holds no bytes in the file")
        return _bytes(self._view, section.offset, section.size)

    def symbols(self, kind: int = SHT_SYMTAB) -> Iterator[Symbol]:
        """Every symbol of the symbol tables of this kind (SHT_SYMTAB or SHT_DYNSYM)."""
        for table in (s for s in self.sections if s.kind == kind):
            if not 0 <= table.link < len(self.sections):
                raise ElfError(f"symbol table {table.name!r} links to no string table")
            strings = self.sections[table.link]
            for position in range(
                table.offset, table.offset + table.size - _SYMBOL.size + 1, _SYMBOL.size
            ):
                name, info, _other, shndx, value, size = _SYMBOL.unpack_from(self._view, position)
                yield Symbol(
                    self._string(strings.offset, strings.size, name), value, size, shndx, info >> 4
                )


def read_sections(data: bytes) -> ElfSections:
    """The section view of an ELF file's bytes; ElfError when malformed."""
    return ElfSections(data)


def _bytes(view: memoryview, offset: int, size: int) -> bytes:
    return bytes(view[_span(view, offset, size) : offset + size])
