"""FlashInfer's CuTe DSL kernels through the recorded family: record, then serve, on a GPU.

One sweep of FlashInfer 0.7.4 public functions whose sm_90 path reaches `cute.compile` (GDN
decode: nontranspose, pretranspose with fp32 and bf16 state, default and explicit scale, over
Qwen3-Next head layouts at TP 1..8 and decode batches 1..512; GDN MTP decode of 2..4 tokens with
fp32 and bf16 state pools; RMSNorm / fused add RMSNorm over common
hidden sizes) plus a user's plain `@cute.jit` kernel (tests/user_kernels/scale.py), compiled with
and without TVM-FFI. Each phase is a fresh process running the sweep twice, with inputs made
from a seed per call:

    record  CUTE_AOT_RECORD=FILE: FlashInfer compiles as usual; every distinct call is recorded
    jit     FlashInfer's own JIT, its disk cache off (the baseline the others are compared with)
    bare    no cute-aot hook on cute.compile at all (run with --keep-disk-cache, its per-call
            times against disk's are what the hook costs calls that never reach cute.compile)
    disk    FlashInfer's disk cache, filled by an earlier `jit --keep-disk-cache` process
    aot     CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot with the bundles built from the record
    family  the hand-written flashinfer_gdn_decode family (CUTE_AOT_BUNDLES holding its keys,
            cute_aot.runtime.flashinfer.install()); what it does not serve FlashInfer compiles

Readiness is what the first pass costs beyond the second (compiling or loading every kernel),
per distinct kernel; `compile_calls` counts `cute.compile` calls (one per kernel: FlashInfer keeps
what it compiled) and times each from entry to return (a compile, or in phase aot the served
lookup). The program imports nothing of cute-aot (but phase family): the environment alone
activates it, and real compiles are counted by `CUTE_AOT_REPORT=<out>.report.json`, which
`compare` reads beside each phase's file. `digests` are sha256 of every output and updated
state, for the bitwise comparison (`compare`).

    python benchmarks/recorded_flashinfer.py run --phase jit --out results/jit.json
    python benchmarks/recorded_flashinfer.py compare results/jit.json results/aot.json
    python benchmarks/recorded_flashinfer.py versus results/aot.json results/family.json \
        results/jit.json
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import click

LAYOUTS = (
    (16, 32),
    (8, 16),
    (4, 8),
    (2, 4),
)  # Qwen3-Next-80B (H, HV) at TP 1, 2, 4, 8; K = V = 128
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
HIDDEN = (2048, 4096, 5120, 7168, 8192)
MTP_TOKENS = (2, 3, 4)  # draft tokens + 1 of speculative decoding
STEADY_CALLS = 200  # back-to-back calls on fixed inputs: what a served call costs


def randn(gen, *shape, dtype=None):
    """Every call's inputs: N(0, 0.1^2) from `gen`, on its device, bf16 unless told."""
    import torch

    values = torch.randn(*shape, device=gen.device, generator=gen) * 0.1
    return values.to(dtype or torch.bfloat16)


def sweep(torch, device):
    """[(name, params, run)]: run() makes its inputs from a seed and returns the output tensors."""
    from flashinfer import gdn_decode as gdn
    from flashinfer import norm

    calls = []
    for h, hv in LAYOUTS:
        for batch in BATCHES:
            for variant, scale in (("default scale", None), ("scale=1.0", 1.0)):
                if scale is not None and (h, hv) != LAYOUTS[0]:
                    continue  # an explicit scale once: it is a key of its own

                def inputs(seed, h=h, hv=hv, batch=batch, state_dtype=torch.float32, kmajor=True):
                    gen = torch.Generator(device=device).manual_seed(seed)
                    q, k = randn(gen, batch, 1, h, 128), randn(gen, batch, 1, h, 128)
                    v = randn(gen, batch, 1, hv, 128)
                    a, b = randn(gen, batch, 1, hv), randn(gen, batch, 1, hv)
                    a_log = randn(gen, hv, dtype=torch.float32)
                    dt_bias = randn(gen, hv, dtype=torch.float32)
                    state = randn(gen, batch, hv, 128, 128, dtype=state_dtype)
                    return q, k, v, state, a_log, a, dt_bias, b

                def decode(args, scale=scale):
                    q, k, v, state, a_log, a, dt_bias, b = args
                    out, _ = gdn.gated_delta_rule_decode(
                        q, k, v, state, a_log, a, dt_bias, b, scale=scale, backend="flashinfer"
                    )
                    return out, state

                def nontranspose(seed, inputs=inputs, decode=decode):
                    return decode(inputs(seed))

                params = {"H": h, "HV": hv, "B": batch, "variant": variant}
                nontranspose.timed = (inputs, decode)  # for the per-call time (run: steady_us)
                calls.append(("gdn decode nontranspose fp32 state", params, nontranspose))
                if scale is None:
                    for state_dtype in (torch.float32, torch.bfloat16):

                        def pretranspose(seed, inputs=inputs, state_dtype=state_dtype):
                            q, k, v, state, a_log, a, dt_bias, b = inputs(
                                seed, state_dtype=state_dtype
                            )
                            out, _ = gdn.gated_delta_rule_decode_pretranspose(
                                q, k, v, state, a_log, a, dt_bias, b, backend="flashinfer"
                            )
                            return out, state

                        name = f"gdn decode pretranspose {str(state_dtype)[6:]} state"
                        calls.append((name, params, pretranspose))
    calls += mtp_calls(torch, device, gdn)
    for hidden in HIDDEN:
        for rows in (1, 256):

            def rmsnorm(seed, hidden=hidden, rows=rows):
                gen = torch.Generator(device=device).manual_seed(seed)
                x, w = randn(gen, rows, hidden), randn(gen, hidden)
                return (norm.rmsnorm(x, w, 1e-6),)

            def fused_add(seed, hidden=hidden, rows=rows):
                gen = torch.Generator(device=device).manual_seed(seed)
                x, r, w = randn(gen, rows, hidden), randn(gen, rows, hidden), randn(gen, hidden)
                norm.fused_add_rmsnorm(x, r, w, 1e-6)
                return x, r

            params = {"hidden": hidden, "rows": rows}
            calls.append(("rmsnorm bf16", params, rmsnorm))
            calls.append(("fused_add_rmsnorm bf16", params, fused_add))
    calls += user_kernel_calls(torch, device)
    return calls


def mtp_calls(torch, device, gdn):
    """GDN decode of T > 1 tokens per request (MTP / speculative decoding), states in a pool:
    fp32 state (gated_delta_rule_mtp) and bf16 state (the pretranspose API with T > 1), each
    caching every token's state in an intermediate buffer and leaving the pool as it was."""
    calls = []
    for (h, hv), batches in ((LAYOUTS[0], (1, 8, 64)), (LAYOUTS[2], (1, 64))):
        for tokens in MTP_TOKENS:
            for batch in batches:
                for state in ("fp32", "bf16"):
                    dtype = torch.float32 if state == "fp32" else torch.bfloat16

                    def run(seed, h=h, hv=hv, batch=batch, tokens=tokens, state=state, dtype=dtype):
                        gen = torch.Generator(device=device).manual_seed(seed)
                        q = randn(gen, batch, tokens, h, 128)
                        k = randn(gen, batch, tokens, h, 128)
                        v = randn(gen, batch, tokens, hv, 128)
                        a, b = randn(gen, batch, tokens, hv), randn(gen, batch, tokens, hv)
                        a_log = randn(gen, hv, dtype=torch.float32)
                        dt_bias = randn(gen, hv, dtype=torch.float32)
                        pool = randn(gen, batch + 1, hv, 128, 128, dtype=dtype)  # slot 0 spare
                        slots = torch.arange(1, batch + 1, device=device, dtype=torch.int32)
                        inter = torch.empty(batch, tokens, hv, 128, 128, device=device, dtype=dtype)
                        if state == "fp32":
                            out, _ = gdn.gated_delta_rule_mtp(
                                q,
                                k,
                                v,
                                pool,
                                slots,
                                a_log,
                                a,
                                dt_bias,
                                b,
                                scale=128**-0.5,
                                intermediate_states_buffer=inter,
                                disable_state_update=True,
                                use_qk_l2norm=True,
                            )
                        else:
                            out, _ = gdn.gated_delta_rule_decode_pretranspose(
                                q,
                                k,
                                v,
                                None,
                                a_log,
                                a,
                                dt_bias,
                                b,
                                scale=128**-0.5,
                                use_qk_l2norm=True,
                                initial_state=pool,
                                initial_state_indices=slots,
                                intermediate_states_buffer=inter,
                                disable_state_update=True,
                                backend="flashinfer",
                            )
                        return out, inter, pool

                    params = {"H": h, "HV": hv, "B": batch, "T": tokens}
                    calls.append((f"gdn mtp {state} state", params, run))
    return calls


def norm_variant_calls(torch, device):
    """`--sweep norm-variants`: FlashInfer's other CuTe DSL norms on sm_90: Gemma RMSNorm (and
    its fused add), LayerNorm (fp32 gamma and beta) and the 3-D RMSNorm of per-head q/k norms."""
    from flashinfer import norm

    calls = []
    for hidden in (2048, 4096):
        for rows in (1, 256):
            params = {"hidden": hidden, "rows": rows}

            def gemma(seed, hidden=hidden, rows=rows):
                gen = torch.Generator(device=device).manual_seed(seed)
                return (norm.gemma_rmsnorm(randn(gen, rows, hidden), randn(gen, hidden), 1e-6),)

            def gemma_add(seed, hidden=hidden, rows=rows):
                gen = torch.Generator(device=device).manual_seed(seed)
                x, r, w = randn(gen, rows, hidden), randn(gen, rows, hidden), randn(gen, hidden)
                norm.gemma_fused_add_rmsnorm(x, r, w, 1e-6)
                return x, r

            def layer(seed, hidden=hidden, rows=rows):
                gen = torch.Generator(device=device).manual_seed(seed)
                x = randn(gen, rows, hidden)
                gamma, beta = (randn(gen, hidden, dtype=torch.float32) for _ in range(2))
                return (norm.layernorm(x, gamma, beta, 1e-6),)

            calls += [
                ("gemma_rmsnorm bf16", params, gemma),
                ("gemma_fused_add_rmsnorm bf16", params, gemma_add),
                ("layernorm bf16", params, layer),
            ]
    for heads in (8, 32):
        for rows in (1, 256):

            def per_head(seed, heads=heads, rows=rows):
                gen = torch.Generator(device=device).manual_seed(seed)
                return (norm.rmsnorm(randn(gen, rows, heads, 128), randn(gen, 128), 1e-6),)

            calls.append(("rmsnorm 3-D (q/k norm) bf16", {"heads": heads, "rows": rows}, per_head))
    return calls


SWEEPS = {"main": sweep, "norm-variants": norm_variant_calls}


def user_kernel_calls(torch, device):
    """A plain @cute.jit kernel in user code, compiled with cute.compile (no family): with
    TVM-FFI (called on torch tensors) and without (the DSL's own convention: cute tensors from
    from_dlpack and a CUDA stream), each served as the caller's own compile would be."""
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass.cute.runtime import from_dlpack, make_fake_stream

    from tests.user_kernels.scale import scale

    compiled = {}

    def run(seed, n, block, abi):
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(n, device=device, generator=gen)
        y = torch.empty_like(x)
        if abi == "tvm_ffi":
            if (block, abi) not in compiled:  # the user's own cache, as such code keeps one
                compiled[block, abi] = cute.compile[cute.EnableTVMFFI(True)](
                    scale,
                    from_dlpack(x, assumed_align=16).mark_layout_dynamic(),
                    from_dlpack(y, assumed_align=16).mark_layout_dynamic(),
                    1.0,
                    make_fake_stream(use_tvm_ffi_env_stream=True),
                    block=block,
                )
            compiled[block, abi](x, y, 0.5)
            return (y,)
        tensors = [from_dlpack(t, assumed_align=16).mark_layout_dynamic() for t in (x, y)]
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        if (block, abi) not in compiled:
            compiled[block, abi] = cute.compile(scale, *tensors, 1.0, stream, block=block)
        compiled[block, abi](*tensors, 0.5, stream)
        return (y,)

    return [
        (
            f"user kernel scale ({abi})",
            {"n": n, "block": block},
            lambda seed, n=n, block=block, abi=abi: run(seed, n, block, abi),
        )
        for abi in ("tvm_ffi", "c")
        for block in (128, 256)
        for n in (1000, 1 << 20)
    ]


def digest(tensors) -> str:
    """sha256 over every output's bytes; a tensor over 16 MiB (a decode state) is reduced on the
    GPU first, to two weighted 64-bit sums per 64 KiB chunk of its bytes, so that comparing a
    whole sweep does not copy gigabytes to the host."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        words = t.detach().contiguous().view(-1).view(torch.uint8)
        if words.numel() > 16 << 20:
            words = words[: words.numel() // 4 * 4].view(torch.int32).to(torch.int64)
            chunks = torch.nn.functional.pad(words, (0, -words.numel() % 16384)).view(-1, 16384)
            weights = torch.arange(1, 16385, device=words.device, dtype=torch.int64)
            words = torch.stack([chunks.sum(1), (chunks * weights).sum(1)]).view(torch.uint8)
        h.update(words.cpu().numpy().tobytes())
    return h.hexdigest()


@click.group()
def main():
    pass


@main.command()
@click.option(
    "--phase", type=click.Choice(["record", "jit", "bare", "disk", "aot", "family"]), required=True
)
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path))
@click.option("--keep-disk-cache", is_flag=True, help="jit: let FlashInfer fill its disk cache.")
@click.option(
    "--sweep",
    "sweep_name",
    type=click.Choice(sorted(SWEEPS)),
    default="main",
    show_default=True,
    help="Which calls: the main sweep, or FlashInfer's other norms.",
)
def run(phase, out_path, keep_disk_cache, sweep_name):
    """One phase, in this process (set the environment the phase names before calling)."""
    if phase in ("record", "jit", "bare", "aot", "family") and not keep_disk_cache:
        os.environ["FLASHINFER_CUTE_DSL_DISABLE_CACHE"] = "1"
    started = time.perf_counter()
    import torch

    torch.zeros(1, device="cuda")
    import flashinfer  # noqa: F401
    from cutlass.base_dsl.compiler import CompileCallable

    # Every cute.compile call, timed from its entry to its return (the startup hook, if the
    # environment asks, is already installed beneath: a served call is a lookup, else a compile).
    hooked = CompileCallable._compile
    compile_calls = {"calls": 0, "seconds": 0.0, "each": []}

    def timed_compile(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return hooked(self, *args, **kwargs)
        finally:
            compile_calls["calls"] += 1
            compile_calls["seconds"] += time.perf_counter() - t0
            compile_calls["each"].append(time.perf_counter() - t0)

    CompileCallable._compile = timed_compile
    installed = None
    if phase == "family":
        from cute_aot.runtime import flashinfer as served

        installed = served.install(["flashinfer_gdn_decode"])
    imported = time.perf_counter() - started
    device = torch.device("cuda")
    calls = SWEEPS[sweep_name](torch, device)
    passes = []
    for _ in range(2):
        rows = []
        for index, (name, params, call) in enumerate(calls):
            before, t0 = compile_calls["calls"], time.perf_counter()
            try:
                outputs = call(1000 + index)
                torch.cuda.synchronize()
                row = {"ok": True, "digest": digest(outputs)}
            except Exception as exc:  # listed with the call, the sweep goes on
                torch.cuda.synchronize()
                row = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            row.update(
                name=name,
                params=params,
                seconds=time.perf_counter() - t0,
                compile_calls=compile_calls["calls"] - before,
            )
            rows.append(row)
        passes.append(rows)
    first, second = passes
    for index, (_, _, call) in enumerate(calls):  # per-call time where inputs can be made apart
        if hasattr(call, "timed"):
            make, invoke = call.timed
            args = make(7)
            invoke(args)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(STEADY_CALLS):
                invoke(args)
            torch.cuda.synchronize()
            second[index]["steady_us"] = 1e6 * (time.perf_counter() - t0) / STEADY_CALLS
    report = {
        "phase": phase,
        "sweep": sweep_name,
        "gpu": torch.cuda.get_device_name(),
        "import_seconds": imported,
        "calls": len(calls),
        "failed": [r for r in second if not r["ok"]],
        "compile_calls": compile_calls["calls"],  # one per kernel: compiled, or looked up
        "compile_call_seconds": compile_calls["seconds"],
        "compile_call_seconds_each": compile_calls["each"],  # in call order
        "first_pass_seconds": sum(r["seconds"] for r in first),
        "second_pass_seconds": sum(r["seconds"] for r in second),
        "installed": installed,
        "env": {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("CUTE_AOT", "FLASHINFER", "CUTE_DSL"))
        },
        "passes": passes,
    }
    report["readiness_seconds"] = report["first_pass_seconds"] - report["second_pass_seconds"]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1))
    print(
        f"{phase}: {len(calls)} calls, {len(report['failed'])} failed, {compile_calls['calls']} "
        f"cute.compile calls ({1e3 * compile_calls['seconds'] / max(compile_calls['calls'], 1):.3f}"
        f" ms each), first pass {report['first_pass_seconds']:.2f} s, second "
        f"{report['second_pass_seconds']:.3f} s, import {imported:.1f} s"
    )


def _median(values: list) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def steady_ratio(base: dict, other: dict) -> dict:
    """Geomean over the calls timed in both of (other's per-call time / base's)."""
    pairs = [
        (a["steady_us"], b["steady_us"])
        for a, b in zip(base["passes"][1], other["passes"][1], strict=True)
        if "steady_us" in a and "steady_us" in b
    ]
    if not pairs:
        return {}
    ratio = math.exp(sum(math.log(b / a) for a, b in pairs) / len(pairs))
    return {
        "steady_calls_compared": len(pairs),
        "steady_us_ratio": ratio,
        "steady_us_median": sorted(b for _, b in pairs)[len(pairs) // 2],
        "baseline_steady_us_median": sorted(a for a, _ in pairs)[len(pairs) // 2],
    }


@main.command()
@click.argument("baseline", type=click.Path(exists=True, path_type=Path))
@click.argument("others", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def compare(baseline, others, out_path):
    """Bitwise outputs and readiness of each phase against the baseline (JIT) phase."""
    base = json.loads(baseline.read_text())
    kernels = base["compile_calls"]
    summary = {
        "baseline": base["phase"],
        "kernels": kernels,
        "baseline_readiness_ms_per_kernel": 1e3 * base["readiness_seconds"] / max(kernels, 1),
        "phases": {},
    }
    for path in others:
        other = json.loads(path.read_text())
        same = [
            a["digest"] == b.get("digest")
            for a, b in zip(base["passes"][1], other["passes"][1], strict=True)
            if a["ok"]
        ]
        report = path.with_suffix(".report.json")
        compiles = json.loads(report.read_text())["compiles"] if report.exists() else None
        row = {
            "bitwise_equal_calls": sum(same),
            "compared_calls": len(same),
            "compiles": compiles,
            "failed": len(other["failed"]),
            "compile_call_ms": 1e3 * other["compile_call_seconds"] / max(other["compile_calls"], 1),
            # the first call also opens the bundle (or imports the compiler): apart
            "first_compile_call_ms": 1e3 * other["compile_call_seconds_each"][0],
            "later_compile_call_ms_median": 1e3 * _median(other["compile_call_seconds_each"][1:]),
            "readiness_ms_per_kernel": 1e3 * other["readiness_seconds"] / max(kernels, 1),
            "readiness_speedup": base["readiness_seconds"] / max(other["readiness_seconds"], 1e-9),
            **steady_ratio(base, other),
        }
        summary["phases"][other["phase"]] = row
        print(
            f"{other['phase']}: {row['bitwise_equal_calls']}/{row['compared_calls']} "
            f"bitwise equal to "
            f"{base['phase']}, {row['compiles']} compiles (report), cute.compile calls: first "
            f"{row['first_compile_call_ms']:.1f} ms, then a median "
            f"{row['later_compile_call_ms_median']:.3f}"
            f" ms, readiness "
            f"{row['readiness_ms_per_kernel']:.1f} ms/kernel vs "
            f"{summary['baseline_readiness_ms_per_kernel']:.1f}"
            f" ({row['readiness_speedup']:.0f}x)"
            + (f"; per call {row['steady_us_ratio']:.3f}x" if "steady_us_ratio" in row else "")
        )
    if out_path:
        out_path.write_text(json.dumps(summary, indent=1))


@main.command()
@click.argument("generic", type=click.Path(exists=True, path_type=Path))
@click.argument("family", type=click.Path(exists=True, path_type=Path))
@click.argument("jit", type=click.Path(exists=True, path_type=Path))
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def versus(generic, family, jit, out_path):
    """The recorded (generic) path against the hand-written GDN family on the kernels the family
    serves. A kernel is named by the call that compiled it in the JIT phase; the family serves
    it when that call compiled nothing in the family phase. Readiness is that call's first pass
    minus its second; the per-call time is STEADY_CALLS back-to-back calls on fixed inputs."""
    reports = {
        name: json.loads(path.read_text())
        for name, path in (("generic", generic), ("family", family), ("jit", jit))
    }
    jit_first = reports["jit"]["passes"][0]
    fam_first = reports["family"]["passes"][0]
    gdn = [i for i, row in enumerate(jit_first) if row["name"].startswith("gdn")]
    introducing = [i for i in gdn if jit_first[i]["compile_calls"] > 0]
    served = [i for i in introducing if fam_first[i]["ok"] and fam_first[i]["compile_calls"] == 0]
    summary = {
        "gdn_calls": len(gdn),
        "gdn_kernels": len(introducing),
        "kernels_the_family_serves": len(served),
        "served": [f"{jit_first[i]['name']} {jit_first[i]['params']}" for i in served],
        "not_served": [
            f"{jit_first[i]['name']} {jit_first[i]['params']}"
            for i in introducing
            if i not in served
        ],
    }
    for name in ("generic", "family"):
        first, second = reports[name]["passes"]
        summary[name] = {
            "readiness_ms_per_kernel": 1e3
            * sum(first[i]["seconds"] - second[i]["seconds"] for i in served)
            / max(len(served), 1),
            "call_us": sum(second[i].get("steady_us", 0.0) for i in served) / max(len(served), 1),
            "bitwise_equal_to_jit": sum(
                second[i].get("digest") == reports["jit"]["passes"][1][i]["digest"] for i in served
            ),
        }
    print(json.dumps(summary, indent=1))
    if out_path:
        out_path.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
