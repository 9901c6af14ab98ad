"""Sharded builds for CI matrices: each job compiles a deterministic slice, `merge` packs them all.

A shard's output is one folder, `<name>.shard-<i>-of-<n>/`:

    shard.json                 the whole plan, this slice's report rows, toolchain and sources
    objects/<arch>/<symbol>.o  the objects this shard compiled (or took from the build cache)

`merge` checks that the shards belong together (same plan, name, version, toolchain, sources,
every index present once, every object matching its hash) and links them exactly as a plain
build does, so the bundles are byte-identical to an unsharded build of the same plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from cute_aot.artifacts import PACKAGE_VERSION, toolchain
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.artifacts.core.errors import ShardError
from cute_aot.artifacts.digest import SPACED, json_digest
from cute_aot.kernels import families, family, family_facts, source_hash
from cute_aot.kernels.arch import SUPPORTED_ARCHS, normalize_arch
from cute_aot.kernels.tables import Table

SHARD_FORMAT = 1
SHARD_FILE = "shard.json"
_SPEC_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (0-based): the keys at positions index, index + count, ..."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """'i/n' as CI matrices give it: GitHub `${{ matrix.shard }}/4`, Buildkite
        `$BUILDKITE_PARALLEL_JOB/$BUILDKITE_PARALLEL_JOB_COUNT`, Kubernetes
        `$JOB_COMPLETION_INDEX/<completions>`."""
        match = _SPEC_RE.match(text)
        if not match:
            raise ValueError(f"{text!r} is not a shard i/n (for example 0/4)")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or index >= count:
            raise ValueError(f"shard {index}/{count}: need 0 <= i < n")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def select(self, items: list) -> list:
        # Round robin over the canonical (arch, symbol) order: slice sizes differ by at most
        # one, and neighbouring keys (similar cost) land on different shards.
        return items[self.index :: self.count]

    def folder_name(self, name: str) -> str:
        return f"{name}.shard-{self.index}-of-{self.count}"


def plan_record(keys_by_arch: dict[str, list]) -> dict[str, list[dict]]:
    return {arch: [key.fields() for key in keys] for arch, keys in keys_by_arch.items()}


def plan_sha256(record: dict[str, list[dict]]) -> str:
    return json_digest(record, separators=SPACED)


def families_record(keys_by_arch: dict[str, list]) -> dict[str, dict]:
    names = sorted({key.FAMILY for keys in keys_by_arch.values() for key in keys})
    return {n: family_facts(n) for n in names}


def write_shard_file(
    folder: Path,
    shard: Shard,
    name: str,
    bundle_version: str,
    keys_by_arch: dict[str, list],
    rows: list[dict],
    tables=None,
) -> Path:
    """Describe a finished shard; object paths are stored relative to its folder. `tables`:
    the (family, arch) -> Table the plan was made with, for the merged bundles' manifests."""
    plan = plan_record(keys_by_arch)
    portable_rows = []
    for row in rows:
        row = {k: v for k, v in row.items() if k != "traceback"}
        if row.get("object"):
            row["object"] = Path(row["object"]).relative_to(folder).as_posix()
        portable_rows.append(row)
    document = {
        "format": SHARD_FORMAT,
        "name": name,
        "bundle_version": bundle_version,
        "created_by": PACKAGE_VERSION,
        "shard": {"index": shard.index, "count": shard.count},
        "plan": plan,
        "plan_sha256": plan_sha256(plan),
        "toolchain": toolchain.fingerprint(),
        "families": families_record(keys_by_arch),
        "rows": portable_rows,
        # None: the bundles record no table (a build from a miss log)
        "tables": None
        if tables is None
        else [table.record() for _, table in sorted(tables.items())],
    }
    return atomic_write(
        folder / SHARD_FILE, json.dumps(document, indent=1, sort_keys=True).encode()
    )


@dataclass
class MergeInput:
    name: str
    bundle_version: str
    keys_by_arch: dict[str, list]
    rows: dict[tuple[str, str], dict]  # (arch, symbol) -> row with an absolute object path
    folders: list[Path]
    tables: dict = dataclasses.field(default_factory=dict)  # (family, arch) -> Table
    record_tables: bool = True


def find_shard_files(paths: list[Path]) -> list[Path]:
    """shard.json files in the given folders (at any depth: CI artifact downloads nest them)."""
    found: set[Path] = set()
    for path in paths:
        path = Path(path)
        if path.is_file() and path.name == SHARD_FILE:
            found.add(path.resolve())
        elif path.is_dir():
            found.update(p.resolve() for p in path.rglob(SHARD_FILE))
        else:
            raise ShardError(f"{path}: no such shard folder")
    return sorted(found)


def load_shards(paths: list[Path]) -> MergeInput:
    files = find_shard_files(paths)
    if not files:
        raise ShardError(f"no shard outputs ({SHARD_FILE}) under {', '.join(map(str, paths))}")
    documents = [(file.parent, _read(file)) for file in files]
    first_folder, first = documents[0]
    _check_local_toolchain(first_folder, first)
    seen: dict[int, Path] = {}
    for folder, document in documents:
        for field in ("name", "bundle_version", "plan_sha256", "created_by", "toolchain", "tables"):
            if document.get(field) != first.get(field):
                raise ShardError(
                    f"{folder} and {first_folder} differ in {field} "
                    f"({document[field]!r} vs {first[field]!r}): not shards of one build"
                )
        if document["shard"]["count"] != first["shard"]["count"]:
            raise ShardError(f"{folder} and {first_folder} split the plan into different counts")
        index = document["shard"]["index"]
        if index in seen:
            raise ShardError(
                f"shard {index}/{first['shard']['count']} given twice: {seen[index]} and {folder}"
            )
        seen[index] = folder
    count = first["shard"]["count"]
    missing = [f"{i}/{count}" for i in range(count) if i not in seen]
    if missing:
        raise ShardError(
            f"missing shard outputs: {', '.join(missing)} (found {len(seen)} of {count})"
        )
    keys_by_arch = _plan_keys(first_folder, first)
    rows = _collect_rows(documents, keys_by_arch)
    tables = {}
    for record in first.get("tables") or []:
        table = Table.from_record(record, str(first_folder / SHARD_FILE))
        tables[(table.family, table.arch)] = table
    return MergeInput(
        first["name"],
        first["bundle_version"],
        keys_by_arch,
        rows,
        [f for f, _ in documents],
        tables,
        first.get("tables") is not None,
    )


def _read(file: Path) -> dict:
    try:
        document = json.loads(file.read_bytes())
    except (OSError, ValueError) as exc:
        raise ShardError(f"{file}: unreadable shard description ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != SHARD_FORMAT:
        raise ShardError(f"{file}: unknown shard format (this merge reads format {SHARD_FORMAT})")
    return document


def _check_local_toolchain(folder: Path, document: dict) -> None:
    # The bundle records this machine's toolchain and sources: they must be the shards' too.
    local = {"toolchain": toolchain.fingerprint(), "created_by": PACKAGE_VERSION}
    for field, value in local.items():
        if document[field] != value:
            raise ShardError(
                f"{folder} was built with {field} {document[field]!r}, this machine has {value!r}; "
                "merge where the shards were built"
            )
    for name, facts in document["families"].items():
        if name not in families():
            raise ShardError(f"{folder}: built with kernel family {name!r}, not installed here")
        if facts["source_hash"] != source_hash(name):
            raise ShardError(
                f"{folder}: family {name!r} was built from other sources than this checkout's"
            )


def _plan_keys(folder: Path, document: dict) -> dict[str, list]:
    if plan_sha256(document["plan"]) != document["plan_sha256"]:
        raise ShardError(f"{folder}: the plan does not match its hash (edited or corrupted)")
    order = list(SUPPORTED_ARCHS)  # canonical, as in a plain build (JSON sorted them by name)
    return {
        arch: [family(fields["family"]).Key.from_fields(fields) for fields in keys]
        for arch, keys in sorted(
            document["plan"].items(), key=lambda item: order.index(normalize_arch(item[0]))
        )
    }


def _collect_rows(documents, keys_by_arch) -> dict[tuple[str, str], dict]:
    planned = {(arch, key.symbol) for arch, keys in keys_by_arch.items() for key in keys}
    rows: dict[tuple[str, str], dict] = {}
    for folder, document in documents:
        for row in document["rows"]:
            where = (row["arch"], row["symbol"])
            if where not in planned or where in rows:
                raise ShardError(
                    f"{folder}: {row['family']} key {row['key_id']} on {row['arch']} is "
                    f"{'outside the plan' if where not in planned else 'in two shards'}"
                )
            if row["status"] == "ok":
                row = {**row, "object": str(_checked_object(folder, row))}
            rows[where] = row
    absent = sorted(planned - rows.keys())
    if absent:
        arch, symbol = absent[0]
        raise ShardError(f"{len(absent)} planned keys are in no shard, e.g. {symbol} on {arch}")
    return rows


def _checked_object(folder: Path, row: dict) -> Path:
    path = (folder / row["object"]).resolve()
    if not path.is_relative_to(folder):
        raise ShardError(f"{folder}: object path {row['object']!r} leaves the shard folder")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ShardError(
            f"{folder}: object of {row['family']} key {row['key_id']} on {row['arch']} "
            f"is unreadable ({exc.strerror or exc})"
        ) from None
    if hashlib.sha256(data).hexdigest() != row["sha256"] or len(data) != row["size"]:
        raise ShardError(
            f"{folder}: object of {row['family']} key {row['key_id']} on {row['arch']} "
            "does not match its recorded sha256 (corrupted in transfer?)"
        )
    return path
