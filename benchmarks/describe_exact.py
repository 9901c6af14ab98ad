"""Whether the served describer still writes every recorded call exactly: each recreatable call
of a record is made again (as the build's replay makes its arguments) and described twice, the
describer's caches cold and then warm; each description must be `canonical(identity)` byte for
byte and give the recorded call's id. Run it after any change to kernels/recorded/calls.py.

    python benchmarks/describe_exact.py benchmarks/results/virtual/sweep_h200_real.record.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from remade_calls import remade


@click.command()
@click.argument("record")
def main(record: str) -> None:
    from cute_aot.kernels.recorded import RecordedCallKey, canonical, read_records
    from cute_aot.kernels.recorded.calls import describe_call
    from cute_aot.runtime.compile_hook import install_hook

    install_hook()  # marks are logged as a served process logs them
    exact, differing = 0, []
    for _, line in read_records(record):
        if not line.get("recreatable"):
            continue
        key = RecordedCallKey.from_fields(line["key"])
        for _ in range(2):  # the describer's caches cold, then warm
            compile_with, function, positional, keyword = remade(line)
            described = describe_call(compile_with, function, tuple(positional), keyword)
            if (
                described.identity_json == canonical(described.identity)
                and described.call_id == key.call_id
                # and the id the recording process derived, where that is the call's own
                and (key.hardware or described.call_id == line["key_id"])
            ):
                exact += 1
            else:
                differing.append(key.call_id)
    click.echo(f"{exact} described exactly, {len(differing)} not: {differing}")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
