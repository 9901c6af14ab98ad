"""FlashAttention-4 at a model's shapes, through its public API, as a server and a trainer call it:
the attention kernels one model runs, recorded on a GPU or a virtual one and built ahead of time.

    aot-build record --workload fa4 --model llama-3.1-8b --arch sm90a --arch sm100a --out rec/
    aot-build --from-record rec/ --name fa4 --out bundles/    # each for its own arch
    python -m cute_aot.aot.workloads.fa4 --model llama-3.1-8b     # the workload alone

Per model, each configuration is one public call (or a forward and its backward):
  prefill     flash_attn_varlen_func, a batch of 4 sequences of unequal length, causal
              (sliding-window models: their window; gpt-oss: with its learnable sinks)
  decode      flash_attn_varlen_func, one new token per sequence over a paged KV cache
              (page_table, seqused_k), 8 sequences
  split_kv    the decode, split over the KV length (num_splits=4, FA4's combine kernel)
  train       flash_attn_func forward and backward, 2 x 1024 tokens, causal
  fp8         the prefill with float8_e4m3fn inputs, where FA4 has it (SM 10.x)
A configuration FA4 refuses on the GPU being asked is a row with its reason, not a failure of
the run. Shapes are per GPU: heads at tensor parallelism 1, DeepSeek-V3's at 8. torch and FA4
are imported only when it runs.
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import click

from cute_aot.artifacts.core.json_lines import append_line


@dataclass(frozen=True)
class Model:
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int | None = None  # DeepSeek's MLA prefill: 192 for q and k, 128 for v
    window: int | None = None  # sliding-window attention (every other layer in gpt-oss)
    sinks: bool = False  # gpt-oss: a learnable sink logit per head


MODELS = {
    "llama-3.1-8b": Model(heads=32, kv_heads=8, head_dim=128),
    "qwen3-8b": Model(heads=32, kv_heads=8, head_dim=128),
    "qwen3-30b-a3b": Model(heads=32, kv_heads=4, head_dim=128),
    "gpt-oss-20b": Model(heads=64, kv_heads=8, head_dim=64, window=128, sinks=True),
    "deepseek-v3": Model(heads=16, kv_heads=16, head_dim=192, head_dim_v=128),
}
CONFIGS = ("prefill", "decode", "split_kv", "train", "fp8")
SEQUENCES = (1000, 517, 2048, 77)  # prefill batch
DECODE_BATCH, PAGE = 8, 128  # decode: sequences, tokens per KV page


def workload(model: Model):
    """{configuration: a function running it once} at `model`'s shapes."""
    import torch
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    bf16, dv = torch.bfloat16, model.head_dim_v or model.head_dim
    window = (model.window - 1, 0) if model.window else (None, None)

    def tensor(*shape, dtype=bf16, grad=False):
        return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(grad)

    def sinks():
        return torch.randn(model.heads, device="cuda", dtype=torch.float32) if model.sinks else None

    def cumulative(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    def prefill(dtype=bf16):
        total, cu = sum(SEQUENCES), cumulative(SEQUENCES).to("cuda")
        q = tensor(total, model.heads, model.head_dim, dtype=dtype)
        k = tensor(total, model.kv_heads, model.head_dim, dtype=dtype)
        v = tensor(total, model.kv_heads, dv, dtype=dtype)
        return flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=max(SEQUENCES),
            max_seqlen_k=max(SEQUENCES),
            causal=True,
            window_size=window,
            learnable_sink=sinks(),
        )

    def decode(num_splits=1):
        lengths = [300 + 97 * i for i in range(DECODE_BATCH)]
        pages = [-(-n // PAGE) for n in lengths]
        table = torch.zeros(DECODE_BATCH, max(pages), dtype=torch.int32)
        first = 0
        for row, count in enumerate(pages):
            table[row, :count] = torch.arange(first, first + count)
            first += count
        q = tensor(DECODE_BATCH, model.heads, model.head_dim)
        k = tensor(first, PAGE, model.kv_heads, model.head_dim)
        v = tensor(first, PAGE, model.kv_heads, dv)
        return flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=torch.arange(DECODE_BATCH + 1, dtype=torch.int32).cuda(),
            max_seqlen_q=1,
            seqused_k=torch.tensor(lengths, dtype=torch.int32).cuda(),
            page_table=table.cuda(),
            causal=True,
            window_size=window,
            learnable_sink=sinks(),
            num_splits=num_splits,
        )

    def train():
        q = tensor(2, 1024, model.heads, model.head_dim, grad=True)
        k = tensor(2, 1024, model.kv_heads, model.head_dim, grad=True)
        v = tensor(2, 1024, model.kv_heads, dv, grad=True)
        out = flash_attn_func(q, k, v, causal=True, window_size=window, learnable_sink=sinks())
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out))
        return out

    def fp8():  # the public API takes float8 inputs (descales are internal to FA4)
        return prefill(torch.float8_e4m3fn)

    return {
        "prefill": prefill,
        "decode": decode,
        "split_kv": lambda: decode(num_splits=4),
        "train": train,
        "fp8": fp8,
    }


@click.command()
@click.option(
    "--model",
    "names",
    multiple=True,
    type=click.Choice(sorted(MODELS)),
    help="Repeatable (default: every model).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    help="Append one JSON line per configuration run (model, config, gpu, ok, first_call_s or "
    "error).",
)
@click.option(
    "--steady",
    type=click.IntRange(min=0),
    default=0,
    help="Then time N more calls of each configuration, enqueued back to back, 5 times: "
    "steady_call_us is the median per-call time (a GPU's: the calls' host cost where the "
    "kernels are short).",
)
def main(names, out, steady):
    """Run each configuration of each model once; a refusal is a row with its reason."""
    import torch

    for name in names or sorted(MODELS):
        for config, call in workload(MODELS[name]).items():
            row = {"model": name, "config": config, "gpu": torch.cuda.get_device_name()}
            torch.cuda.synchronize()
            started = time.perf_counter()
            try:
                call()
                torch.cuda.synchronize()
                row.update(ok=True, first_call_s=round(time.perf_counter() - started, 6))
                if steady:
                    row["steady_call_us"] = _steady_call_us(call, steady, torch)
            except Exception as exc:  # a configuration FA4 does not have here, named
                row.update(
                    ok=False,
                    error=f"{type(exc).__name__}: {str(exc)[:300]}",
                    site=traceback.extract_tb(exc.__traceback__)[-1].name,
                )
            if out:
                append_line(Path(out), (json.dumps(row) + "\n").encode(), rotate=False)
            click.echo(f"{name} {config}: " + ("ok" if row["ok"] else row["error"][:160]))


def _steady_call_us(call, calls: int, torch) -> float:
    """Median over 5 batches of the per-call time of `calls` calls enqueued back to back."""
    for _ in range(3):
        call()
    batches = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        batches.append((time.perf_counter() - started) / calls * 1e6)
    return round(statistics.median(batches), 2)


if __name__ == "__main__":
    main()
