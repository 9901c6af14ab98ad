"""`aot-cache records A B`: two recordings of one workload compared call by call (a virtual GPU's
and a real one's, say). Each recorded kernel is the same in both (key id, key and architecture),
only in one, or paired with a kernel of the same target in the other that differs in named
fields (an argument's layout, an option, a hardware answer, the kernel's source)."""

from __future__ import annotations

import json
import sys

import click

from cute_aot.aot.tools.aot_cache.output import emit_json, json_option, make_console, make_table


@click.command("records")
@click.argument("first", metavar="A")
@click.argument("second", metavar="B")
@click.option("--exit-code", is_flag=True, help="Exit status 1 when A and B differ.")
@json_option
def records_command(first, second, exit_code, as_json):
    """Recorded kernels of A and B: the same, only in one, or differing in named fields."""
    from cute_aot.kernels.recorded import read_records

    result = compare(
        [record for _, record in read_records(first)],
        [record for _, record in read_records(second)],
    )
    result = {"a": first, "b": second, **result}
    if as_json:
        emit_json(result)
    else:
        _print(result)
    if exit_code and (result["only_a"] or result["only_b"] or result["differing"]):
        sys.exit(1)


def compare(first: list[dict], second: list[dict]) -> dict:
    """{"same": n, "only_a": [...], "only_b": [...], "differing": [...], "not_recordable": ...}
    of two lists of records (each kernel once: the first record of a key id counts)."""
    a, b = _kernels(first), _kernels(second)
    same = [k for k in a if k in b and _fields(a[k]) == _fields(b[k])]
    alike = [k for k in a if k in b and k not in same]  # one id, other replay data or arch
    unpaired_a = [k for k in a if k not in b]
    unpaired_b = [k for k in b if k not in a]
    differing = [_difference(a[k], b[k]) for k in alike]
    for target in sorted({_target(a[k]) for k in unpaired_a}):
        mine = [k for k in unpaired_a if _target(a[k]) == target]
        theirs = [k for k in unpaired_b if _target(b[k]) == target]
        for key in mine:  # pair each with the other side's record that differs least
            if not theirs:
                break
            closest = min(theirs, key=lambda other: len(_difference(a[key], b[other])["fields"]))
            theirs.remove(closest)
            differing.append(_difference(a[key], b[closest]))
            unpaired_a.remove(key)
            unpaired_b.remove(closest)
    return {
        "kernels": [len(a), len(b)],
        "same": len(same),
        "only_a": [_row(a[k]) for k in unpaired_a],
        "only_b": [_row(b[k]) for k in unpaired_b],
        "differing": differing,
        "not_recordable": [_refusals(first), _refusals(second)],
    }


def _kernels(records: list[dict]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for record in records:
        if record.get("recreatable") is True and isinstance(record.get("key_id"), str):
            found.setdefault(record["key_id"], record)
    return found


def _refusals(records: list[dict]) -> dict[str, int]:
    """Calls that could not be recorded, counted by reason."""
    counted: dict[str, int] = {}
    for record in records:
        if record.get("recreatable") is False:
            reason = str(record.get("reason"))
            counted[reason] = counted.get(reason, 0) + 1
    return dict(sorted(counted.items()))


def _fields(record: dict) -> dict:
    """A record's kernel as flat fields: `call.args.block`, `replay.hardware.X`, `arch`, ..."""
    key = record.get("key", {})
    flat = {"arch": record.get("arch"), "tvm_ffi": record.get("tvm_ffi")}
    for part in ("call", "replay"):
        text = key.get(part)
        value = json.loads(text) if isinstance(text, str) else text
        _flatten(part, value, flat)
    return flat


def _flatten(prefix: str, value, into: dict) -> None:
    if isinstance(value, dict):
        for name, item in value.items():
            _flatten(f"{prefix}.{name}", item, into)
    elif isinstance(value, list) and prefix.endswith(".args"):  # [[name, description], ...]
        for name, item in value:
            _flatten(f"{prefix}.{name}", item, into)
    else:
        into[prefix] = value


def _target(record: dict) -> str:
    return str(record.get("target") or _fields(record).get("call.target.function"))


def _row(record: dict) -> dict:
    return {"key_id": record["key_id"], "target": _target(record), "site": record.get("site")}


def _difference(first: dict, second: dict) -> dict:
    a, b = _fields(first), _fields(second)
    names = sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
    return {
        "target": _target(first),
        "key_ids": [first["key_id"], second["key_id"]],
        "fields": {name: [a.get(name), b.get(name)] for name in names},
    }


def _print(result: dict) -> None:
    console = make_console()
    a, b = result["kernels"]
    console.print(
        f"a: {result['a']} ({a} kernels)\nb: {result['b']} ({b} kernels)\n"
        f"the same: {result['same']}, only in a: {len(result['only_a'])}, only in b: "
        f"{len(result['only_b'])}, differing: {len(result['differing'])}"
    )
    table = make_table("kernels", "", "key id", "target", "fields that differ (a -> b)")
    for sign, rows in (("a", result["only_a"]), ("b", result["only_b"])):
        for row in rows:
            table.add_row(f"only {sign}", row["key_id"], row["target"], row["site"] or "")
    for row in result["differing"]:
        fields = "; ".join(
            f"{name}: {json.dumps(old)} -> {json.dumps(new)}"
            for name, (old, new) in row["fields"].items()
        )
        table.add_row("~", " / ".join(row["key_ids"]), row["target"], fields)
    if table.row_count:
        console.print(table)
    for side, refusals in zip("ab", result["not_recordable"], strict=True):
        for reason, times in refusals.items():
            console.print(f"not recordable in {side} ({times}x): {reason}")
