"""FlashInfer's Blackwell GEMMs recorded on a virtual B200, against the hand-written families.

    CUTE_AOT_VIRTUAL=b200 CUTE_AOT_RECORD=out/records/ python benchmarks/virtual_blackwell.py record
    python benchmarks/virtual_blackwell.py compare out/records/ --arch sm_100a --out out/sass.json

`record` is a workload script of public API calls (the environment activates the virtual GPU;
cute-aot is imported only to read the two families' default problems): `mm_bf16(backend="tgv")`
and `mm_mxfp8(backend="cute-dsl")` at the default
problems of the `flashinfer_tgv_gemm` and `flashinfer_mxfp8_gemm` families (every default shape,
every M, output dtype, bias and PDL variant those families enumerate). Each call compiles what
FlashInfer picks untuned; nothing runs.

`compare` compiles every recorded kernel (the recorded family's replay) and every key those two
families enumerate for the architecture, exports each as the build does, and compares their
device code: the SASS of each cubin, with the kernel's own symbol names replaced by one
placeholder. A recorded kernel matches a family kernel when the two are identical that way.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path

import click

FAMILIES = ("flashinfer_tgv_gemm", "flashinfer_mxfp8_gemm")


def record_calls() -> list[str]:
    import flashinfer
    import torch

    from cute_aot.kernels import family

    done = []
    tgv = family("flashinfer_tgv_gemm")
    for n, k in tgv.default_shapes:
        for problem in tgv.problems((n, k)):
            if problem.pdl is None:
                continue
            a = torch.randn(problem.m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if problem.has_bias else None
            flashinfer.mm_bf16(a, b, bias=bias, pdl=problem.pdl, backend="tgv")
            done.append(
                f"mm_bf16 tgv m={problem.m} n={n} k={k} bias={problem.has_bias} pdl={problem.pdl}"
            )
    mxfp8 = family("flashinfer_mxfp8_gemm")
    for n, k in mxfp8.default_shapes:
        for problem in mxfp8.problems((n, k)):
            m = problem.m
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
            a_scale = torch.empty(-(-m // 128) * 128 * (k // 32), device="cuda", dtype=torch.uint8)
            b_scale = torch.empty(-(-n // 128) * 128 * (k // 32), device="cuda", dtype=torch.uint8)
            out_dtype = getattr(torch, problem.out_dtype)
            flashinfer.mm_mxfp8(a, b, a_scale, b_scale, out_dtype=out_dtype, backend="cute-dsl")
            done.append(f"mm_mxfp8 cute-dsl m={m} n={n} k={k} out={problem.out_dtype}")
    return done


@click.group()
def main():
    pass


@main.command()
def record():
    """The workload (run it under CUTE_AOT_VIRTUAL=b200 with CUTE_AOT_RECORD set)."""
    failed = []
    try:
        calls = record_calls()
    except Exception as exc:  # the recording says what it got; the summary says why it stopped
        failed.append(f"{type(exc).__name__}: {exc}")
        calls = []
    print(json.dumps({"calls": len(calls), "failed": failed}))


_SYMBOLS = re.compile(r"\b(?:_Z\w+|kernel_\w+|cutlass_\w+|__nv_static_\w+)\b")


def normalized_sass(fatbin: bytes) -> str:
    """SASS of every cubin, the kernels' own symbol names replaced (they name the caller)."""
    from cute_aot.aot.binary_info import disassemble

    return _SYMBOLS.sub("<symbol>", disassemble(fatbin))


def device_code(family_name: str, key, arch: str) -> dict:
    from cute_aot.aot.binary_info import inspect_fatbin
    from cute_aot.artifacts.export import export_object
    from cute_aot.artifacts.fatbin import object_fatbin
    from cute_aot.kernels import family

    with tempfile.TemporaryDirectory() as folder:
        exported = export_object(family(family_name).compile(key, arch), key, folder)
        fatbin = object_fatbin(Path(exported["object"]).read_bytes(), exported["object"])
    sass = normalized_sass(fatbin)
    info = inspect_fatbin(fatbin)
    opcodes = [op for kernel in info.get("kernels", []) for op in kernel.get("opcodes", {})]
    return {
        "family": family_name,
        "key": key.id,
        "describe": key.describe(),
        "sm": info["sm"],
        "sass_sha256": hashlib.sha256(sass.encode()).hexdigest(),
        "tcgen05": sorted({op for op in opcodes if op.startswith("UTC")}),  # tensor memory MMA
        "sass_lines": sass.count("\n"),
    }


@main.command()
@click.argument("records")
@click.option("--arch", default="sm_100a", show_default=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def compare(records, arch, out_path):
    """Device code of the recorded kernels against the families' own, for `arch`."""
    from cute_aot.kernels import family
    from cute_aot.kernels.recorded import FAMILY, RecordedCallKey, read_records

    recorded = {}
    for _, record in read_records(records):
        if record.get("key_id") and record.get("arch") == arch:
            key = RecordedCallKey.from_fields(record["key"])
            recorded.setdefault(key.id, key)
    rows = {
        "recorded": [device_code(FAMILY, key, arch) for key in recorded.values()],
        "families": [
            device_code(name, key, arch)
            for name in FAMILIES
            for key in family(name).enumerate_keys(arch)
        ],
    }
    by_sass = {row["sass_sha256"]: row for row in rows["families"]}
    for row in rows["recorded"]:
        match = by_sass.get(row["sass_sha256"])
        row["same_device_code_as"] = (
            f"{match['family']} {match['key']} ({match['describe']})" if match else None
        )
    summary = {
        "arch": arch,
        "recorded_kernels": len(rows["recorded"]),
        "family_kernels": len(rows["families"]),
        "recorded_matching_a_family_kernel": sum(
            bool(r["same_device_code_as"]) for r in rows["recorded"]
        ),
        "family_kernels_recorded": len({r["sass_sha256"] for r in rows["recorded"]} & set(by_sass)),
        **rows,
    }
    text = json.dumps(summary, indent=1)
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k not in rows}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
