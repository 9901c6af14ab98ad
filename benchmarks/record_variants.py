"""A record of N distinct calls made from a real one, to measure what grows with the number of
recorded kernels (a bundle's open, its manifest) at sizes no recording here reaches.

Each recreatable call of RECORD whose arguments hold a Python float constant (FlashInfer's GDN
kernels: `scale`) is written again with that constant nudged, `value * (1 + i * 1e-6)`, until
N calls are written: each a distinct kernel (its own key id) with the same arguments, options
and key size as the real one, which `aot-build --from-record` builds like any other.

    python benchmarks/record_variants.py benchmarks/results/virtual/sweep_h200_real.record.jsonl \\
        600 --out /tmp/variants.record.jsonl
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import click


@click.command()
@click.argument("record")
@click.argument("count", type=int)
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path))
def main(record: str, count: int, out_path: Path) -> None:
    from cute_aot.kernels.recorded import RecordedCallKey, canonical, read_records

    bases = [
        (line, index)
        for _, line in read_records(record)
        if line.get("recreatable")
        for index in _float_constants(json.loads(line["key"]["call"]))[:1]
    ]
    if not bases:
        raise click.ClickException(f"{record}: no recreatable call with a float constant")
    written, seen = [], set()
    for nudge in itertools.count(1):
        for line, index in bases:
            call = json.loads(line["key"]["call"])
            constant = call["args"][index][1]
            constant["value"] = constant["value"] * (1 + nudge * 1e-6)
            key = RecordedCallKey(call=canonical(call), replay=line["key"]["replay"])
            if key.id in seen:
                continue
            seen.add(key.id)
            written.append({**line, "key": key.fields(), "key_id": key.id})
            if len(written) == count:
                out_path.write_text("".join(json.dumps(row) + "\n" for row in written))
                click.echo(f"{out_path}: {count} calls from {len(bases)} of {record}")
                return


def _float_constants(call: dict) -> list[int]:
    """Indexes of the arguments that are Python float constants."""
    return [
        index
        for index, (_, described) in enumerate(call["args"])
        if described.get("py") == "float" and "value" in described
    ]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
