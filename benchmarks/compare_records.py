"""Two recordings of one workload side by side (a virtual GPU's and a real one's, say), and
optionally the bundles built from each: do they hold the same kernels, recorded with the same
hardware answers, built into the same device code?

    python benchmarks/compare_records.py VIRTUAL_RECORDS REAL_RECORDS \
        [--bundles VIRTUAL_BUNDLE_DIR REAL_BUNDLE_DIR] --out results/virtual_vs_real.json

Keys are compared whole (what is compiled, argument types, options, example values, hardware
answers); device code by the sha256 of each kernel's fatbin as the build recorded it in the
bundle's manifest (aot/binary_info.py), for every kernel both bundles hold.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


def _records(source: str) -> dict[str, dict]:
    from cute_aot.kernels.recorded import read_records

    return {record["key_id"]: record for _, record in read_records(source) if record.get("key_id")}


def _binaries(folder: Path) -> dict[str, dict]:
    from cute_aot.artifacts.bundle import read_manifest

    found = {}
    for path in sorted(folder.glob("*.cuteaot")):
        for entry in read_manifest(path).entries:
            found[entry.key_id] = entry.gpu_binary or {}
    return found


def compare(first: str, second: str, bundles: tuple[Path, Path] | None) -> dict:
    a, b = _records(first), _records(second)
    both = sorted(set(a) & set(b))
    summary = {
        "first": first,
        "second": second,
        "kernels": [len(a), len(b)],
        "same_key_ids": set(a) == set(b),
        "only_first": sorted(set(a) - set(b)),
        "only_second": sorted(set(b) - set(a)),
        "identical_keys": sum(a[k]["key"] == b[k]["key"] for k in both),
        "same_hardware_answers": sum(
            json.loads(a[k]["key"]["replay"]).get("hardware")
            == json.loads(b[k]["key"]["replay"]).get("hardware")
            for k in both
        ),
        "hardware_answers_used": sum(
            bool(json.loads(a[k]["key"]["replay"]).get("hardware")) for k in both
        ),
        "same_arch": sum(a[k].get("arch") == b[k].get("arch") for k in both),
    }
    if bundles:
        x, y = _binaries(bundles[0]), _binaries(bundles[1])
        shared = sorted(set(x) & set(y))
        equal = [
            k
            for k in shared
            if x[k].get("fatbin_sha256") and x[k].get("fatbin_sha256") == y[k].get("fatbin_sha256")
        ]
        summary["device_code"] = {
            "kernels_in_both_bundles": len(shared),
            "identical_fatbins": len(equal),
            "differing": [k for k in shared if k not in equal],
        }
    return summary


@click.command()
@click.argument("first")
@click.argument("second")
@click.option("--bundles", nargs=2, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path))
def main(first, second, bundles, out):
    summary = compare(first, second, bundles)
    text = json.dumps(summary, indent=1)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
