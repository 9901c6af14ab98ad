"""Dispatch tables: the data a family's dispatch rule reads, made to travel inside bundles.

A table belongs to one family and one architecture. Its `data` is the family's own (rows of
tactics); its `provenance` says where it came from (the package's defaults, or `aot-tune` on a
named GPU, with the timings). Dispatch is a pure function of (problem, arch, table): the build
enumerates keys with a table and records it in each bundle's manifest, and a server dispatches
with the table of the bundle that serves the architecture, so what was built is what is asked.

Two tables are the same table when their family, architecture and data are equal: provenance
never changes a dispatch decision, so it is left out of the digest.

Files (`aot-build --tables`, `aot-tune --out`) hold ``{"tables": [record, ...]}``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cute_aot.artifacts.core.errors import TableError
from cute_aot.artifacts.digest import TABLE_LENGTH, json_digest

TABLE_FORMAT = 1


@dataclass(frozen=True, eq=False)
class Table:
    family: str
    arch: str
    data: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def digest(self) -> str:
        """Identity of what dispatch reads (family, arch, data): 16 hex digits. Computed once: a
        table is a value (its data is never changed after it is made), and dispatch caches hash
        it on every call."""
        identity = {"family": self.family, "arch": self.arch, "data": self.data}
        return json_digest(identity, length=TABLE_LENGTH)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Table) and (self.family, self.arch, self.digest) == (
            other.family,
            other.arch,
            other.digest,
        )

    def __hash__(self) -> int:  # dispatch caches on it
        return hash((self.family, self.arch, self.digest))

    def describe(self) -> str:
        source = self.provenance.get("source", "unknown source")
        where = self.provenance.get("gpu")
        when = self.provenance.get("date")
        details = ", ".join(str(part) for part in (where, when) if part)
        return f"table {self.digest} ({source}{': ' + details if details else ''})"

    def record(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "family": self.family,
            "arch": self.arch,
            "digest": self.digest,
            "data": self.data,
            "provenance": self.provenance,
        }

    @classmethod
    def from_record(cls, record: Any, where: str) -> Table:
        if not isinstance(record, dict):
            raise TableError(where, "a table must be a JSON object")
        if record.get("format") != TABLE_FORMAT:
            raise TableError(where, f"unknown table format {record.get('format')!r}")
        for name, kind in (("family", str), ("arch", str), ("data", dict), ("provenance", dict)):
            if not isinstance(record.get(name), kind):
                raise TableError(where, f"table field {name!r} must be a {kind.__name__}")
        table = cls(record["family"], record["arch"], record["data"], record["provenance"])
        if record.get("digest") not in (None, table.digest):
            raise TableError(
                where,
                f"{table.family} table for {table.arch}: digest {record['digest']} does not match "
                f"its data ({table.digest}): edited by hand?",
            )
        return table


def read_tables(path: str | Path) -> list[Table]:
    """A tables file -> its tables (one per family and architecture)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise TableError(str(path), f"cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise TableError(str(path), f"not valid JSON ({exc})") from None
    records = document.get("tables") if isinstance(document, dict) else None
    if not isinstance(records, list):
        raise TableError(str(path), 'expected {"tables": [...]}')
    tables = [Table.from_record(record, str(path)) for record in records]
    seen: set[tuple[str, str]] = set()
    for table in tables:
        if (table.family, table.arch) in seen:
            raise TableError(str(path), f"two tables for {table.family} on {table.arch}")
        seen.add((table.family, table.arch))
    return tables


def write_tables(path: str | Path, tables: list[Table]) -> None:
    """Write atomically (a reader never sees half a file)."""
    from cute_aot.artifacts.core.atomic import atomic_write

    document = {"tables": [table.record() for table in tables]}
    atomic_write(path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode())


@functools.cache
def packaged_tables(package: str) -> dict[tuple[str, str], Table]:
    """(family, arch) -> the tuned tables a family package ships in its `tables.json` (written
    by aot-tune, committed where they won); {} when it ships none."""
    from importlib import resources

    resource = resources.files(package).joinpath("tables.json")
    if not resource.is_file():
        return {}
    with resources.as_file(resource) as path:
        return {(table.family, table.arch): table for table in read_tables(path)}


def row_ranges(values: list[int]) -> list[list[int]]:
    """Sorted integers -> [[first, last], ...] runs (compact table rows)."""
    runs: list[list[int]] = []
    for value in sorted(set(values)):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return runs


BuildTables = dict[tuple[str, str], Table]  # (family, arch) -> the table keys were enumerated with
