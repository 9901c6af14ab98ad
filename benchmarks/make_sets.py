"""Build the kernel sets the cold-start benchmark loads, keeping one object file per key.

    router:        the router GEMM default set (what `aot-build` ships)
    synthetic-N:   N distinct real router GEMM keys (dot-product kernels, M = 1..4, K = 8..2048
                   step 8), to show how loading grows with the number of kernels

For each set: <out>/<set>/objects/<symbol>.o (what the peers' per-kernel caches hold) and
<out>/<set>/<set>-<arch>.cuteaot (our bundle), plus keys.json.

    python benchmarks/make_sets.py --out benchmarks/sets --arch sm_90a \
        --synthetic 100 --synthetic 1000
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import click
from rich.progress import track

from cute_aot.aot.compile_worker import compile_to_object
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.artifacts.pack import pack_bundle
from cute_aot.kernels import bundle_facts
from cute_aot.kernels.router_gemm import RouterGemmKey, RouterProblem, enumerate_keys, family


def synthetic_keys(count: int, arch: str) -> list[RouterGemmKey]:
    keys = []
    for k, m in itertools.product(range(8, 2049, 8), range(1, 5)):
        # named: K < 256 = N here, which positional dims would refuse as the older order
        keys.append(family.dispatch(RouterProblem(m=m, n=256, k=k), arch).key)
        if len(keys) == count:
            return keys
    raise click.ClickException(f"at most {len(keys)} synthetic keys")


def build_set(name: str, keys: list, arch: str, out: Path, jobs: int) -> None:
    objects_dir = (out / name / "objects").resolve()
    objects_dir.mkdir(parents=True, exist_ok=True)
    todo = [key for key in keys if not (objects_dir / f"{key.symbol}.o").exists()]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [
            pool.submit(compile_to_object, k.FAMILY, k.fields(), arch, str(objects_dir))
            for k in todo
        ]
        for future in track(futures, description=f"{name}: compiling {len(todo)} keys"):
            row = future.result()
            if row["status"] != "ok":
                raise click.ClickException(f"{row['key_id']}: {row['error']}")
    rows = {}
    for key in keys:
        data = (objects_dir / f"{key.symbol}.o").read_bytes()
        rows[key] = {
            "object": str(objects_dir / f"{key.symbol}.o"),
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
    _, bundle = pack_bundle(name, arch, rows, bundle_facts({key.FAMILY for key in rows}, arch))
    atomic_write(out / name / f"{name}-{arch}.cuteaot", bundle)
    keys_json = [{"symbol": k.symbol, "key_id": k.id, "fields": k.fields()} for k in keys]
    atomic_write(out / name / "keys.json", json.dumps(keys_json).encode())


@click.command()
@click.option(
    "--out", default="benchmarks/sets", show_default=True, type=click.Path(path_type=Path)
)
@click.option("--arch", default="sm_90a", show_default=True)
@click.option("--synthetic", "synthetic", multiple=True, type=int, default=[100, 1000])
@click.option("-j", "--jobs", default=2, show_default=True)
def main(out, arch, synthetic, jobs):
    build_set("router", enumerate_keys(arch), arch, out, jobs)
    for count in synthetic:
        build_set(f"synthetic-{count}", synthetic_keys(count, arch), arch, out, jobs)


if __name__ == "__main__":
    main()
