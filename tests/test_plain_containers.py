"""Plain containers are data (kernels/recorded/calls.py): NamedTuples, dataclasses, dicts, lists,
tuples, frozensets, enums and None, as arguments and inside them, tensors and classes among their
items, are described and rebuilt exactly (describe, rebuild, describe again: the same identity),
and anything else is still refused, named by its path in the call."""

import dataclasses

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the [build] extra)")


def _call(*args, **kwargs):
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import describe_call
    from tests.user_kernels.containers import consume

    options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
    return describe_call(options, consume, args, kwargs)


def _arguments():
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.containers import Mode, Operands, Options

    x, y, _, _ = arguments(1000)
    return (
        Operands(x, 0.5),  # a NamedTuple holding a tensor, passed dynamically
        [y, (3, None)],  # a list holding a tensor and a tuple
        Options(tile=128, kind=float, modes=frozenset({Mode.FAST, Mode.EXACT})),  # a class
        {"splits": 2, ("m", 64): Mode.EXACT, "none": None},  # a dict of mixed keys
    )


def _rebuilt(call):
    from cute_aot.kernels.recorded.replay import rebuild

    symbols: dict = {}
    return [
        rebuild(described, example, symbols)
        for (_, described), example in zip(call.identity["args"], call.examples, strict=True)
    ]


def test_each_kind_of_container_is_described_and_rebuilt_exactly():
    from tests.user_kernels.containers import Mode, Operands, Options

    operands, items, options, table = _arguments()
    call = _call(operands, items, options, table, mode=Mode.FAST)
    described = dict(call.identity["args"])
    assert described["operands"]["namedtuple"] == "tests.user_kernels.containers:Operands"
    assert [name for name, _ in described["operands"]["fields"]] == ["tensor", "scale"]
    assert "dlpack" in described["operands"]["fields"][0][1]
    assert described["options"]["dataclass"] == "tests.user_kernels.containers:Options"
    assert dict(described["options"]["fields"])["kind"] == {"class": "builtins:float"}
    assert described["mode"] == {"enum": "tests.user_kernels.containers:Mode", "name": "FAST"}
    rebuilt_operands, rebuilt_items, rebuilt_options, rebuilt_table, rebuilt_mode = _rebuilt(call)
    assert type(rebuilt_operands) is Operands and rebuilt_operands.scale == 0.5
    assert type(rebuilt_items) is list and rebuilt_items[1] == (3, None)
    assert type(rebuilt_options) is Options
    assert dataclasses.asdict(rebuilt_options) == dataclasses.asdict(options)
    assert rebuilt_table == table and rebuilt_mode is Mode.FAST
    again = _call(
        rebuilt_operands, rebuilt_items, rebuilt_options, rebuilt_table, mode=rebuilt_mode
    )
    assert again.identity_json == call.identity_json
    assert again.key().id == call.key().id


def test_a_dict_is_described_by_its_items_not_its_order():
    operands, items, options, table = _arguments()
    reordered = dict(reversed(list(table.items())))
    assert list(reordered) != list(table)
    first = _call(operands, items, options, table)
    second = _call(operands, items, options, reordered)
    assert first.identity_json == second.identity_json
    changed = _call(operands, items, options, {**table, "splits": 3})
    assert changed.identity_json != first.identity_json


def test_a_tensor_inside_a_container_keeps_its_layout_in_the_key():
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.containers import Operands

    operands, items, options, table = _arguments()
    aligned_8 = arguments(1000, align=8)[0]
    first = _call(operands, items, options, table)
    second = _call(Operands(aligned_8, 0.5), items, options, table)
    assert first.identity_json != second.identity_json


def test_any_other_object_is_refused_by_its_path_in_the_call():
    from cute_aot.kernels.recorded.calls import NotRecreatable
    from tests.user_kernels.containers import Operands

    operands, items, options, table = _arguments()
    with pytest.raises(NotRecreatable, match=r"argument 'operands'\.scale: a builtins\.object"):
        _call(Operands(operands.tensor, object()), items, options, table)
    with pytest.raises(NotRecreatable, match=r"argument 'table'\['lock'\]: a _thread\.lock"):
        import threading

        _call(operands, items, options, {**table, "lock": threading.Lock()})


def test_the_recorded_familys_identity_is_its_builder_version_not_its_files():
    """Editing cute-aot's own modules (settings, cache layout, the describer) moves no recorded
    bundle to stale: the family's source hash is derived from its declared builder version, and
    every check a server makes compares that (or an earlier release's hash declared equal)."""
    from cute_aot.artifacts.digest import source_digest
    from cute_aot.kernels import binary_modules, family, source_hash, source_is_current

    recorded = family("cute_compile")
    assert binary_modules("cute_compile") == []
    version = f"cute_compile {recorded.builder_version}".encode()
    assert source_hash("cute_compile") == source_digest([("builder_version", version)])
    earlier = next(iter(recorded.earlier_source_hashes))
    modules = ["cute_aot.artifacts.core.settings", "cute_aot.kernels.recorded.calls"]
    assert source_is_current("cute_compile", {"source_hash": earlier, "source_modules": modules})
    assert source_is_current("cute_compile", {"source_hash": source_hash("cute_compile")})
    assert not source_is_current("cute_compile", {"source_hash": "0" * 64})
    assert binary_modules("router_gemm")  # a family without a version is still its files


def test_a_class_made_at_run_time_is_refused_when_recorded_not_when_built():
    """A kernel object of a class made with type(...) under a module's name (quack's generated
    epilogue classes) cannot be imported by a replay: the record says so, with its name."""
    import cutlass.cute as cute

    from cute_aot.kernels.recorded.calls import NotRecreatable, describe_call
    from tests.user_kernels.compile_calls import arguments
    from tests.user_kernels.keyed import KeyedScale

    made = type("KeyedScaleMade", (KeyedScale,), {"__module__": KeyedScale.__module__})
    with pytest.raises(NotRecreatable, match="KeyedScaleMade is made at run time"):
        describe_call(cute.compile, made(128), (arguments(1000)[0], 1000), {})
