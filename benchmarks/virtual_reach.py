"""How far a virtual Blackwell GPU reaches: FlashInfer's public entry points whose SM 10.x path
reaches `cute.compile`, each called at one model's shapes, recorded with no GPU, then built.

    CUTE_AOT_VIRTUAL=b200 CUTE_AOT_RECORD=out/b200/ python benchmarks/virtual_reach.py record \
        --out out/b200.calls.json
    aot-build --from-record out/b200/ --arch sm100a --out out/bundles --allow-failures
    python benchmarks/virtual_reach.py table out/b200.calls.json out/bundles --out reach.json

`record` runs each entry point in turn (the workload: public calls, fake CUDA tensors; an error
ends that entry point, not the run) and notes per entry point its calls, the kernels it had
compiled (the virtual GPU's own count) and, where it stopped, why (an Unanswerable names the
question and its site). `table` joins that with the built bundle: per kernel its cubin's SM
numbers and whether its SASS uses Blackwell's tensor-memory MMA (tcgen05: the UTC* opcodes).
Shapes: DeepSeek-V3 (hidden 7168, q_lora 1536, o_proj at TP 8) for norms, quantization and
GEMMs; Qwen3-Next-80B (GDN: 16 QK heads, 32 V heads, head dim 128) for linear attention.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click

HIDDEN = 7168  # DeepSeek-V3


def entry_points(torch, flashinfer):
    """[(entry point, model and shapes, [calls])]: each call a no-argument function."""
    bf16, dev = torch.bfloat16, "cuda"

    def t(*shape, dtype=bf16):
        return torch.randn(*shape, device=dev).to(dtype)

    from flashinfer import gdn_decode, gdn_prefill, norm

    rows = 16  # decode tokens
    points = [
        (
            "flashinfer.rmsnorm",
            f"DeepSeek-V3 hidden {HIDDEN}, {rows} tokens, bf16",
            [lambda: flashinfer.rmsnorm(t(rows, HIDDEN), t(HIDDEN), 1e-6)],
        ),
        (
            "flashinfer.fused_add_rmsnorm",
            f"DeepSeek-V3 hidden {HIDDEN}, {rows} tokens, bf16",
            [
                lambda: flashinfer.fused_add_rmsnorm(
                    t(rows, HIDDEN), t(rows, HIDDEN), t(HIDDEN), 1e-6
                )
            ],
        ),
        (
            "flashinfer.norm.rmsnorm_fp4quant",
            f"DeepSeek-V3 hidden {HIDDEN}, {rows} tokens, bf16 -> nvfp4",
            [lambda: norm.rmsnorm_fp4quant(t(rows, HIDDEN), t(HIDDEN))],
        ),
        (
            "flashinfer.mm_bf16(backend='tgv')",
            "DeepSeek-V3 o_proj at TP 8 (N 7168, K 2048), M 8, bf16",
            [lambda: flashinfer.mm_bf16(t(8, 2048), t(HIDDEN, 2048).t(), backend="tgv")],
        ),
        (
            "flashinfer.mm_bf16(backend='cute-dsl')",
            "DeepSeek-V3 q_a_proj (N 1536, K 7168), M 8, bf16 (its low-M backend: M <= 32)",
            [lambda: flashinfer.mm_bf16(t(8, HIDDEN), t(1536, HIDDEN).t(), backend="cute-dsl")],
        ),
        (
            "flashinfer.mm_mxfp8(backend='cute-dsl')",
            "DeepSeek-V3 q_a_proj (N 1536, K 7168), M 128, mxfp8",
            [
                lambda: flashinfer.mm_mxfp8(
                    t(128, HIDDEN, dtype=torch.float8_e4m3fn),
                    t(1536, HIDDEN, dtype=torch.float8_e4m3fn).t(),
                    t(128 * HIDDEN // 32, dtype=torch.uint8),
                    t(1536 * HIDDEN // 32, dtype=torch.uint8),
                    backend="cute-dsl",
                )
            ],
        ),
        (
            "flashinfer.fp4_quantize(backend='cute-dsl')",
            f"DeepSeek-V3 hidden {HIDDEN}, {rows} tokens, bf16 -> nvfp4",
            [
                lambda: flashinfer.fp4_quantize(
                    t(rows, HIDDEN), t(1, dtype=torch.float32), backend="cute-dsl"
                )
            ],
        ),
        (
            "flashinfer.mxfp8_quantize(backend='cute-dsl')",
            f"DeepSeek-V3 hidden {HIDDEN}, {rows} tokens, bf16 -> mxfp8",
            [lambda: flashinfer.mxfp8_quantize(t(rows, HIDDEN), backend="cute-dsl")],
        ),
        (
            "flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose",
            "Qwen3-Next-80B GDN (16 QK / 32 V heads, 128), batch 8, fp32 state",
            [
                lambda: gdn_decode.gated_delta_rule_decode_pretranspose(
                    t(8, 1, 16, 128),
                    t(8, 1, 16, 128),
                    t(8, 1, 32, 128),
                    t(8, 32, 128, 128, dtype=torch.float32),
                    t(32, dtype=torch.float32),
                    t(8, 1, 32),
                    t(32, dtype=torch.float32),
                    t(8, 1, 32),
                )
            ],
        ),
        (
            "flashinfer.gdn_prefill.chunk_gated_delta_rule",
            "Qwen3-Next-80B GDN (16 QK / 32 V heads, 128), one 1024-token sequence",
            [
                lambda: gdn_prefill.chunk_gated_delta_rule(
                    t(1024, 16, 128),
                    t(1024, 16, 128),
                    t(1024, 32, 128),
                    t(1024, 32, dtype=torch.float32),
                    t(1024, 32, dtype=torch.float32),
                    cu_seqlens=torch.tensor([0, 1024], device=dev, dtype=torch.int64),
                    output_final_state=True,
                    use_qk_l2norm_in_kernel=True,
                    cu_seqlens_cpu=[0, 1024],
                )
            ],
        ),
        (
            "flashinfer.BatchDecodeWithPagedKVCacheWrapper(backend='cute-dsl')",
            "Qwen3-Next-80B full attention (16 Q / 2 KV heads, 256), batch 8, page 16, "
            "512 tokens each, bf16",
            [lambda: _paged_decode(torch, flashinfer, t)],
        ),
    ]
    return points


def _paged_decode(torch, flashinfer, t):
    batch, pages, page = 8, 32, 16
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", backend="cute-dsl"
    )
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * pages
    indices = torch.arange(batch * pages, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), page, dtype=torch.int32, device="cuda")
    wrapper.plan(indptr, indices, last, 16, 2, 256, page, q_data_type=torch.bfloat16)
    cache = t(batch * pages, 2, page, 2, 256)
    return wrapper.run(t(batch, 16, 256), cache)


@click.group()
def main():
    pass


@main.command()
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path))
def record(out_path):
    """Each entry point in turn, on the virtual GPU the environment names."""
    import flashinfer
    import torch

    from cute_aot.runtime.capture import virtual

    folder = Path(os.environ["CUTE_AOT_RECORD"])  # a folder: this process's own file in it
    results, seen = [], 0
    for name, shapes, calls in entry_points(torch, flashinfer):
        before = virtual.summary()
        row = {"entry_point": name, "shapes": shapes, "calls": 0, "error": None}
        for call in calls:
            try:
                call()
                row["calls"] += 1
            except Exception as exc:  # the entry point stops here; the next one runs
                frames = traceback.extract_tb(exc.__traceback__)
                row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                row["raised_at"] = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
                break
        after = virtual.summary()
        row["compiles"] = after["compile_calls"] - before["compile_calls"]
        records = [
            json.loads(line)
            for path in folder.glob(f"*-{os.getpid()}.record.jsonl")
            for line in path.read_text().splitlines()
        ]
        mine, seen = records[seen:], len(records)
        row["kernels"] = sum(bool(r.get("key_id")) for r in mine)
        row["key_ids"] = [r["key_id"] for r in mine if r.get("key_id")]
        row["not_recordable"] = [
            f"{r.get('site')}: {r.get('reason')}" for r in mine if not r.get("key_id")
        ]
        results.append(row)
        print(
            json.dumps(
                {k: row[k] for k in ("entry_point", "calls", "compiles", "kernels", "error")}
            ),
            flush=True,
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(
        json.dumps({"profile": virtual.active().describe(), "entry_points": results}, indent=1)
        + "\n"
    )


@main.command()
@click.argument("calls_file", type=click.Path(exists=True, path_type=Path))
@click.argument("bundles", type=click.Path(exists=True, path_type=Path))
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def table(calls_file, bundles, out_path):
    """Entry point | calls | kernels | built | tcgen05 | unanswerable, from a record run and
    the bundle built from it."""
    from cute_aot.artifacts.bundle import read_manifest

    recorded = json.loads(calls_file.read_text())
    built: dict[str, dict] = {}  # key id -> what its cubin is
    for path in sorted(bundles.glob("*.cuteaot")):
        manifest = read_manifest(path)
        for entry in manifest.entries:
            binary = entry.gpu_binary or {}
            opcodes = {
                op for kernel in binary.get("kernels", []) for op in kernel.get("opcodes", {})
            }
            built[entry.key_id] = {
                "sm": binary.get("sm") or [],
                "mma": sorted(op for op in opcodes if op.startswith("UTC") and "MMA" in op),
            }
    rows = []
    for point in recorded["entry_points"]:
        kernels = [built[k] for k in point["key_ids"] if k in built]
        rows.append(
            {
                **point,
                "built": len(kernels),
                "sm": sorted({sm for k in kernels for sm in k["sm"]}),
                "tcgen05_mma": sorted({op for k in kernels for op in k["mma"]}),
                "kernels_with_tcgen05_mma": sum(bool(k["mma"]) for k in kernels),
            }
        )
    summary = {"profile": recorded["profile"], "rows": rows}
    text = json.dumps(summary, indent=1)
    if out_path:
        out_path.write_text(text + "\n")
    print(
        "| entry point | calls | kernels | built | cubin SM | with tcgen05 MMA "
        "| unanswerable or not recordable (reason) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        why = "; ".join(filter(None, [row["error"], *row["not_recordable"]])) or "-"
        print(
            f"| `{row['entry_point']}` | {row['calls']} | {row['kernels']} | {row['built']} | "
            f"{','.join(map(str, row['sm'])) or '-'} | {row['kernels_with_tcgen05_mma']} "
            f"{'(' + ', '.join(row['tcgen05_mma']) + ')' if row['tcgen05_mma'] else ''} "
            f"| {why[:200]} |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
