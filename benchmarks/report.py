"""Regenerate the generated block of docs/results.md from benchmarks/results/*.json.

python benchmarks/report.py            # rewrites the block between the results markers
"""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
RESULTS_DOC = Path(__file__).parent.parent / "docs" / "results.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _load(name):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def cold_start_lines(report) -> list[str]:
    lines = [
        "| set | keys | method | ready (median) | ready + every kernel run once |",
        "|---|---:|---|---:|---:|",
    ]
    for name, row in report["results"].items():
        set_name, method = name.split("/")
        total = f"{row['median_total_s'] * 1e3:,.1f} ms"
        ratio = f" ({row['over_bundle']:.0f}× ours)" if "over_bundle" in row else ""
        lines.append(
            f"| {set_name} | {row['keys']} | {method} | {row['median_ready_s'] * 1e3:,.1f} ms "
            f"| {total}{ratio} |"
        )
    return lines


def speed_lines(report) -> list[str]:
    lines = [
        "| K × N | geomean vs cuBLAS bf16 (graph) | worst M | geomean (eager) |",
        "|---|---:|---:|---:|",
    ]
    for shape, facts in report["summary"].items():
        lines.append(
            f"| {shape} | {facts['geomean_speedup_graph_vs_bf16']:.2f}× "
            f"| {facts['min_speedup_graph_vs_bf16']:.2f}× "
            f"| {facts['geomean_speedup_eager_vs_bf16']:.2f}× |"
        )
    return lines


def section() -> str:
    parts = [START, "## Results", ""]
    for label, name, render in (
        (
            "Cold start, H200 (fresh process per trial, after `import torch`)",
            "cold_start_h200.json",
            cold_start_lines,
        ),
        ("Cold start, CPU-only machine (load only)", "cold_start_cpu.json", cold_start_lines),
        ("Router GEMM vs cuBLAS on the H200 (M = 1..16)", "router_gemm_h200.json", speed_lines),
    ):
        report = _load(name)
        if report:
            parts += [f"**{label}** — `benchmarks/results/{name}`", "", *render(report), ""]
    overhead = _load("call_overhead_h200.json")
    if overhead:
        us = overhead["us_per_call"]
        parts += [
            "**Per-call cost on a hit, H200, eager** — "
            "`benchmarks/results/call_overhead_h200.json`",
            "",
            f"op with `out=`: {us['op_out']:.2f} µs · "
            f"bare TVM-FFI function: {us['tvm_ffi_direct']:.2f} µs "
            f"({us['op_over_direct']:.2f}×; median per-turn ratio "
            f"{us.get('op_over_direct_paired', us['op_over_direct']):.2f}×) · "
            f"op allocating its output: {us['op_alloc']:.2f} µs · "
            f"torch `F.linear` bf16: {us['torch_linear_bf16']:.2f} µs",
            "",
        ]
    parts.append(END)
    return "\n".join(parts)


def main() -> None:
    text = RESULTS_DOC.read_text()
    block = section()
    if START in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS_DOC.write_text(text)


if __name__ == "__main__":
    main()
