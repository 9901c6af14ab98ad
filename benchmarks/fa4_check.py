"""FlashAttention-4 through its public API, as a trainer calls it: forward and backward at head
dims 64 and 128, causal and not (GQA 16:4, 2 x 512 tokens, bf16). `save PATH` writes outputs and
gradients, `compare PATH` checks bitwise equality with them, and `record` only runs them (a
warm-up to record, on a real or a virtual GPU, whose values a virtual GPU does not compute); each
prints the first call's time per configuration.

    CUTE_AOT_VIRTUAL=h200 CUTE_AOT_RECORD=records/ python benchmarks/fa4_check.py record
    python benchmarks/fa4_check.py save jit.pt                     # FA4's own JIT
    CUTE_AOT_BUNDLES=bundles CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot \
        python benchmarks/fa4_check.py compare jit.pt              # served, 0 compiles
"""

import sys
import time

import torch
from flash_attn.cute import flash_attn_func


def run():
    results, firsts = {}, []
    for hdim in (64, 128):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(hdim + causal)
            q, k, v = (
                torch.randn(
                    2, 512, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g
                ).requires_grad_()
                for h in (16, 4, 4)
            )
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = flash_attn_func(q, k, v, causal=causal)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(torch.ones_like(out))
            torch.cuda.synchronize()
            firsts.append(time.perf_counter() - start)
            results[f"{hdim}-{causal}"] = [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]
    return results, firsts


if __name__ == "__main__":
    what, path = sys.argv[1:2] or [""], sys.argv[2:3]
    if what[0] not in ("record", "save", "compare") or (what[0] != "record") != bool(path):
        sys.exit("usage: fa4_check.py record | save PATH | compare PATH")
    results, firsts = run()
    print("first call of each configuration (fwd+bwd), s:", [round(t, 3) for t in firsts])
    if what[0] == "save":
        torch.save(results, path[0])
    elif what[0] == "compare":
        saved = torch.load(path[0])
        equal = {
            k: all(torch.equal(a, b) for a, b in zip(v, saved[k], strict=True))
            for k, v in results.items()
        }
        print("bitwise equal to JIT:", equal)
