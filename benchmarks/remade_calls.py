"""A record's calls made again as their callers made them, for the benchmarks that serve or
describe them on a CPU (tensors over no memory, as the build's replay makes them)."""

from __future__ import annotations


def remade(line: dict) -> tuple:
    """(compile callable, function, positional list, keyword dict) of one recorded call, its
    arguments fresh: `cute.compile[...]` with the recorded options and the record's
    architecture, a kernel object called as itself, as its caller did."""
    import cutlass.cute as cute
    from cutlass.base_dsl import compiler

    from cute_aot.kernels.recorded import RecordedCallKey
    from cute_aot.kernels.recorded.replay import recreate

    key = RecordedCallKey.from_fields(line["key"])
    call = key.call_data
    function, positional, keyword = recreate(key)
    if call["target"].get("object"):
        function = positional.pop(0)
    options = [getattr(compiler, name)(value) for name, value in call["options"].items()]
    options.append(compiler.GPUArch(line["arch"]))
    return cute.compile[tuple(options)], function, positional, keyword
