"""One fresh process of tests/test_flashinfer_gdn_gpu.py: FlashInfer's public
`gated_delta_rule_decode` over every default GDN key at several batch sizes, served either by
FlashInfer's own JIT (`flashinfer`) or by cute-aot's bundles (`bundle`: FLASHINFER_DISABLE_JIT=1,
mode aot, FlashInfer's compile made to raise). Saves outputs and updated states to OUT.

    python tests/flashinfer_gdn_worker.py flashinfer|bundle OUT.pt
"""

from __future__ import annotations

import json
import sys

import torch

BATCHES = {True: (1, 7, 31), False: (32, 100)}  # small-batch kernel, big-batch kernel


def cases():
    from cute_aot.kernels.flashinfer.gdn_decode import family

    for shape in family.default_shapes:
        for problem in family.problems(shape):
            small = problem.batch < 32
            for batch in BATCHES[small]:
                yield problem._replace(batch=batch)


def main(mode: str, out: str) -> None:
    from flashinfer.gdn_decode import gated_delta_rule_decode
    from flashinfer.gdn_kernels import gdn_decode_nontranspose as flashinfer_gdn

    from cute_aot.kernels.flashinfer.gdn_reference import example_inputs

    report = {"mode": mode}
    if mode == "bundle":
        from cute_aot.runtime import flashinfer as serve_flashinfer
        from cute_aot.runtime import serving

        def refuse(module, name, *args, **kwargs):
            raise AssertionError(f"FlashInfer compiled {name}")

        flashinfer_gdn.build_and_load_cute_dsl_kernel = refuse
        report["install"] = serve_flashinfer.install()
    results = {}
    for index, problem in enumerate(cases()):
        inputs = example_inputs(problem, "cuda", seed=index)
        output, state = gated_delta_rule_decode(**inputs)
        results[tuple(problem)] = (output.clone(), state.clone(), inputs)
    torch.cuda.synchronize()
    if mode == "bundle":
        report["hits"] = serving.installed("flashinfer_gdn_decode").hits
        report["graph_bitwise"] = graph_replay_matches(gated_delta_rule_decode, results)
    report["cases"] = len(results)
    torch.save({key: (o.cpu(), s.cpu()) for key, (o, s, _) in results.items()}, out)
    print(json.dumps(report))


def graph_replay_matches(decode, results) -> bool:
    """Capture one decode step per kernel in a CUDA graph; replaying it from the same inputs
    gives bitwise the eager result (the kernel runs on the capturing stream)."""
    matches = []
    for _, _, inputs in list(results.values())[:: len(results) // 4]:
        static = {name: tensor.clone() for name, tensor in inputs.items()}
        initial = inputs["state"].clone()
        static["state"].copy_(initial)
        decode(**static)  # warm the same shapes outside capture
        graph = torch.cuda.CUDAGraph()
        static["state"].copy_(initial)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            graph_output, _ = decode(**static)
        static["state"].copy_(initial)
        graph.replay()
        torch.cuda.synchronize()
        eager_state = initial.clone()
        eager = dict(inputs, state=eager_state)
        eager_output, _ = decode(**eager)
        torch.cuda.synchronize()
        matches.append(
            torch.equal(graph_output, eager_output) and torch.equal(static["state"], eager_state)
        )
    return all(matches) and len(matches) >= 4


if __name__ == "__main__":
    main(*sys.argv[1:])
