"""Dispatch tables as data that travel with bundles (kernels/tables.py): the table format, tuned
tables of both families, the round trip build -> manifest -> runtime, dispatch with the serving
bundle's table, the two-bundles rule, and what aot-cache shows of them. No GPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cute_aot.aot.build import BuildPlan, run_build
from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.core.errors import TableError
from cute_aot.kernels import family, family_facts
from cute_aot.kernels.gemm_sm90 import GemmProblem, handwritten_table, stages_for
from cute_aot.kernels.router_gemm import RouterProblem
from cute_aot.kernels.tables import Table, read_tables, write_tables
from cute_aot.runtime import REGISTRY, ops
from cute_aot.runtime.loader import LoadedBundle
from tests.fake_gpu import on_gpu
from tests.stubs import loaded_bundle, stub_compile

ARCH = "sm_90a"
ROUTER = family("router_gemm")
GEMM = family("gemm_sm90")


def router_tuned(split_k: int = 3) -> Table:
    """A tuned router table: (K=64, N=8) at M=2 goes to split-K (the default rule says dot)."""
    key = ROUTER.Key("splitk", 0, 0, 0, split_k, 2, True)
    return ROUTER.tuned_table(
        ARCH,
        [(RouterProblem(2, 8, 64), key, {key.id: 3.0, "other": 4.5})],
        {"source": "aot-tune", "gpu": "test GPU"},
    )


# -- the format ----------------------------------------------------------------------------------
def test_digest_covers_what_dispatch_reads_and_not_the_provenance():
    table = router_tuned()
    same = Table(table.family, table.arch, json.loads(json.dumps(table.data)), {"source": "x"})
    assert same == table and hash(same) == hash(table)
    assert router_tuned(split_k=4) != table
    assert ROUTER.default_table(ARCH) != table


def test_tables_file_round_trip_and_refusals(tmp_path):
    path = tmp_path / "tables.json"
    tables = [router_tuned(), GEMM.default_table(ARCH)]
    write_tables(path, tables)
    assert read_tables(path) == tables
    document = json.loads(path.read_text())
    document["tables"][0]["data"]["rows"][0]["split_k"] = 7  # edited, digest kept
    path.write_text(json.dumps(document))
    with pytest.raises(TableError, match="does not match its data"):
        read_tables(path)
    path.write_text(json.dumps({"tables": [tables[0].record(), tables[0].record()]}))
    with pytest.raises(TableError, match="two tables for router_gemm on sm_90a"):
        read_tables(path)
    path.write_text("[]")
    with pytest.raises(TableError, match=r"expected \{\"tables\""):
        read_tables(path)


# -- tuned tables of both families ---------------------------------------------------------------
def test_router_dispatch_follows_the_tuned_row_and_the_rule_elsewhere():
    table = router_tuned()
    tuned = ROUTER.dispatch(RouterProblem(2, 8, 64), ARCH, table)
    assert (tuned.key.backend, tuned.key.split_k) == ("splitk", 3)
    assert "table row (K=64, N=8, M in [2])" in tuned.reason and table.digest in tuned.reason
    assert ROUTER.dispatch(RouterProblem(2, 8, 64), ARCH).key.backend == "dot"
    elsewhere = ROUTER.dispatch(RouterProblem(3, 8, 64), ARCH, table)
    assert elsewhere.key == ROUTER.dispatch(RouterProblem(3, 8, 64), ARCH).key


def test_gemm_tuned_rows_serve_their_m_range():
    handwritten = handwritten_table("gemm_sm90", ARCH)
    wide = GEMM.dispatch(GemmProblem(200, 4096, 4096), ARCH, handwritten).key
    best = GEMM.Key("bfloat16", True, 64, 64, 1, 1, stages_for("bfloat16", 64, 64), True, 8, True)
    table = GEMM.tuned_table(
        ARCH,
        [(GemmProblem(256, 4096, 4096), best, {best.id: 10.0, wide.id: 12.0})],
        {"source": "aot-tune"},
    )
    (row,) = table.data["shape_rows"]
    assert row["m"] == [129, 256] and row["runner_up_us"] == 12.0
    for m in (129, 200, 256):
        assert GEMM.dispatch(GemmProblem(m, 4096, 4096), ARCH, table).key == best
    below = GemmProblem(128, 4096, 4096)  # another M bucket, no row: the rule
    assert GEMM.dispatch(below, ARCH, table).key == GEMM.dispatch(below, ARCH, handwritten).key
    # Past the row, M = 257 is in M = 512's bucket and is chosen there (the wave model).
    above = GEMM.dispatch(GemmProblem(257, 4096, 4096), ARCH, table)
    assert above.key == GEMM.dispatch(GemmProblem(512, 4096, 4096), ARCH, table).key
    assert "wave model" in above.reason
    other_shape = GEMM.dispatch(GemmProblem(200, 6144, 4096), ARCH, table)  # the nearest row
    assert dataclasses.replace(other_shape.key, stages=best.stages) == best
    assert "least measured cost of the tuned rows (won at N=4096 K=4096)" in other_shape.reason
    assert (
        "tuned row for N=4096 K=4096 M in [129, 256]"
        in GEMM.dispatch(GemmProblem(200, 4096, 4096), ARCH, table).reason
    )


def test_keys_are_enumerated_with_the_table():
    plain = set(ROUTER.enumerate_keys(ARCH, [(8, 64)]))
    tuned = set(ROUTER.enumerate_keys(ARCH, [(8, 64)], router_tuned()))
    assert tuned - plain == {ROUTER.Key("splitk", 0, 0, 0, 3, 2, True)}


# -- build -> manifest -> runtime ----------------------------------------------------------------
def _build(tmp_path: Path, name: str, tables: dict | None = None) -> Path:
    plan = BuildPlan(
        archs=[ARCH],
        families=["router_gemm"],
        extra_shapes={"router_gemm": [(8, 64)]},
        default_shapes=False,
        tables=tables or {},
    )
    outcome = run_build(
        plan, tmp_path / name, name=name, jobs=1, show_progress=False, worker=stub_compile
    )
    (bundle,) = outcome.bundles
    return bundle


def test_a_bundle_records_the_table_it_was_built_with(tmp_path):
    table = router_tuned()
    tuned = read_manifest(_build(tmp_path, "tuned", {("router_gemm", ARCH): table}))
    plain = read_manifest(_build(tmp_path, "plain"))
    assert Table.from_record(tuned.families["router_gemm"]["table"], "m") == table
    recorded = Table.from_record(plain.families["router_gemm"]["table"], "m")
    assert recorded == ROUTER.default_table(ARCH)  # the package's own (aot-tune's on sm_90a)
    assert recorded.provenance["source"] == "aot-tune"
    # what was built is what the table asks for: the tuned row's split-K key is in the bundle
    assert ROUTER.Key("splitk", 0, 0, 0, 3, 2, True).id in {e.key_id for e in tuned.entries}


def test_registry_dispatches_with_the_first_bundles_table_and_says_when_another_differs(
    tmp_path, fresh_runtime
):
    first = _build(tmp_path, "first", {("router_gemm", ARCH): router_tuned(3)})
    second = _build(tmp_path, "second", {("router_gemm", ARCH): router_tuned(4)})
    REGISTRY.load(first, gpu_arch=ARCH)
    assert REGISTRY.table("router_gemm", ARCH) == router_tuned(3)
    with pytest.warns(RuntimeWarning, match=r"differs from that of .*first.*loaded first"):
        REGISTRY.load(second, gpu_arch=ARCH)
    assert REGISTRY.table("router_gemm", ARCH) == router_tuned(3)
    REGISTRY.clear()
    assert REGISTRY.table("router_gemm", ARCH) is None  # the package's own, again


def _fake_bundle(key, function, table: Table) -> LoadedBundle:
    facts = {**family_facts(key.FAMILY), "table": table.record()}
    return loaded_bundle(key, function, ARCH, facts=facts)


def test_the_op_dispatches_with_the_serving_bundles_table(fresh_runtime, fake_gpu):
    assert fake_gpu.arch == ARCH
    op = ops.family_op("router_gemm")
    calls = []
    key = ROUTER.Key("splitk", 0, 0, 0, 3, 2, True)
    REGISTRY.add(_fake_bundle(key, lambda x, w, out: calls.append("tuned split-K"), router_tuned()))
    x = on_gpu(torch.ones(2, 64, dtype=torch.bfloat16))
    w = on_gpu(torch.ones(8, 64, dtype=torch.bfloat16))
    op.call(x, w, out=torch.empty(2, 8, device="cuda"))
    assert calls == ["tuned split-K"]  # the default table would have asked for a dot key
    op.table.clear()


# -- aot-cache -----------------------------------------------------------------------------------
def test_show_tables_diff_and_explain_name_the_table(tmp_path):
    tuned = _build(tmp_path, "tuned", {("router_gemm", ARCH): router_tuned()})
    plain = _build(tmp_path, "plain")
    runner = CliRunner()
    shown = runner.invoke(aot_cache, ["show", str(tuned), "--tables"])
    assert shown.exit_code == 0, shown.output
    assert "source: aot-tune" in shown.output and "gpu: test GPU" in shown.output
    assert router_tuned().digest in shown.output

    diff = runner.invoke(aot_cache, ["diff", str(plain), str(tuned), "--json"])
    change = json.loads(diff.output)["tables"]["router_gemm"]
    assert change["digest"] == [ROUTER.default_table(ARCH).digest, router_tuned().digest]
    assert change["fields"]["rows"]["added"] == router_tuned().data["rows"]

    explained = runner.invoke(
        aot_cache,
        [
            "explain",
            "router_gemm",
            "--shape",
            "2,8,64",
            "--arch",
            ARCH,
            "--bundle",
            str(tuned),
            "--json",
        ],
    )
    (decision,) = json.loads(explained.output)["decisions"]
    assert decision["key"]["backend"] == "splitk" and decision["source"] == "bundle"
    assert decision["table"]["provenance"]["gpu"] == "test GPU"
    assert "table row (K=64, N=8, M in [2])" in decision["dispatch"]


# -- aot-tune on a machine without a GPU ---------------------------------------------------------
def test_aot_tune_needs_the_gpu_it_tunes_for(tmp_path):
    from cute_aot.aot.tools.aot_tune.cli import main as aot_tune

    result = CliRunner().invoke(aot_tune, ["--family", "router_gemm", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "no supported GPU here" in result.output
    assert not (tmp_path / "t").exists()


def test_aot_tune_resumes_from_its_results_file(tmp_path):
    from rich.console import Console

    from cute_aot.aot.tools.aot_tune.cli import Tuner

    results = tmp_path / "t.results.jsonl"
    row = {
        "family": "router_gemm",
        "arch": ARCH,
        "problem": [2, 64, 8, "bfloat16", "bfloat16"],
        "key_id": "k1",
        "us": 3.0,
        "ok": True,
    }
    other = {**row, "family": "gemm_sm90", "key_id": "k2"}
    results.write_text(json.dumps(row) + "\n" + json.dumps(other) + "\n" + '{"family": "rou')
    tuner = Tuner(ROUTER, ARCH, results, Console(file=None))
    assert tuner.done == {(json.dumps(row["problem"]), "k1"): row}  # a cut-off line is skipped


def test_aot_tune_re_times_only_the_close_finishers_together():
    """Candidates are timed one after another, and on a GPU at its power limit a later one runs
    at lower clocks: the fastest few within FINALIST_MARGIN are timed again, interleaved."""
    from cute_aot.aot.tools.aot_tune.cli import FINALIST_MARGIN, MAX_FINALISTS, finalists

    assert finalists({}) == [] and finalists({"only": 5.0}) == []
    times = {"a": 10.0, "b": 9.0, "c": 9.0 * FINALIST_MARGIN, "d": 9.0 * FINALIST_MARGIN + 0.01}
    assert finalists(times) == ["b", "a", "c"]  # fastest first; d is past the margin
    many = {f"k{i}": 1.0 + i / 1000 for i in range(2 * MAX_FINALISTS)}
    assert finalists(many) == [f"k{i}" for i in range(MAX_FINALISTS)]


def test_shards_carry_the_table_into_the_merged_bundles(tmp_path):
    from cute_aot.aot.build import merge
    from cute_aot.aot.shard import Shard

    tables = {("router_gemm", ARCH): router_tuned()}
    plan = BuildPlan(
        archs=[ARCH],
        families=["router_gemm"],
        extra_shapes={"router_gemm": [(8, 64)]},
        default_shapes=False,
        tables=tables,
    )
    for index in range(2):
        run_build(
            plan,
            tmp_path / "shards",
            name="t",
            jobs=1,
            show_progress=False,
            worker=stub_compile,
            shard=Shard(index, 2),
        )
    (bundle,) = merge([tmp_path / "shards"], tmp_path / "out").bundles
    recorded = read_manifest(bundle).families["router_gemm"]["table"]
    assert Table.from_record(recorded, "m") == router_tuned()
    assert bundle.read_bytes() == _build(tmp_path, "t", tables).read_bytes()  # as unsharded


def _cli_build(monkeypatch, tmp_path, *args) -> Path:
    """`aot-build ARGS` with stub kernels (the real plan, link, pack and manifest)."""
    from cute_aot.aot.cli import main as aot_build

    out = tmp_path / "out"
    result = CliRunner().invoke(
        aot_build,
        [
            *args,
            "--arch",
            ARCH,
            "--families",
            "router_gemm",
            "--out",
            str(out),
            "--no-cache",
            "--quiet",
        ],
        obj={"worker": stub_compile},  # the compile worker (aot/cli.py: compile_worker)
    )
    assert result.exit_code == 0, result.output
    return out / f"default-{ARCH}.cuteaot"


def test_aot_build_tables_option_records_the_table_it_enumerated_with(monkeypatch, tmp_path):
    path = tmp_path / "tables.json"
    write_tables(path, [router_tuned()])
    args = ("--no-default-shapes", "--shape", "8,64")
    manifest = read_manifest(_cli_build(monkeypatch, tmp_path, "--tables", str(path), *args))
    assert Table.from_record(manifest.families["router_gemm"]["table"], "m") == router_tuned()
    assert ROUTER.Key("splitk", 0, 0, 0, 3, 2, True).id in {e.key_id for e in manifest.entries}
    plain = read_manifest(_cli_build(monkeypatch, tmp_path / "plain", *args))
    recorded = Table.from_record(plain.families["router_gemm"]["table"], "m")
    assert recorded == ROUTER.default_table(ARCH)


def test_a_build_from_a_miss_log_records_no_table(monkeypatch, tmp_path):
    """Missed keys were asked for with whatever table those servers had: such a bundle must not
    decide a server's table (the first bundle that carries one does)."""
    key = ROUTER.Key("splitk", 0, 0, 0, 3, 2, True)
    log = tmp_path / "misses.jsonl"
    log.write_text(
        json.dumps(
            {
                "family": "router_gemm",
                "arch": ARCH,
                "key": key.fields(),
                "key_id": key.id,
                "problem": {},
            }
        )
        + "\n"
    )
    manifest = read_manifest(_cli_build(monkeypatch, tmp_path, "--from-misses", str(log)))
    assert [e.key_id for e in manifest.entries] == [key.id]
    assert "table" not in manifest.families["router_gemm"]


def test_retuning_some_m_keeps_the_other_rows_of_the_base_table():
    """aot-tune --m 128 --base tables.json: the new row replaces the base's rows it overlaps
    at that (N, K); every other row of the base stays, and the provenance says so."""
    base = GEMM.default_table(ARCH)
    best = GEMM.Key("bfloat16", True, 64, 64, 1, 1, stages_for("bfloat16", 64, 64), True, 8, True)
    table = GEMM.tuned_table(
        ARCH,
        [(GemmProblem(128, 4096, 4096), best, {best.id: 9.0})],
        {"source": "aot-tune"},
        base=base,
    )
    rows = table.data["shape_rows"]
    replaced = [
        r for r in base.data["shape_rows"] if (r["n"], r["k"], r["m"]) == (4096, 4096, [65, 128])
    ]
    assert replaced and len(rows) == len(base.data["shape_rows"])
    (new,) = [r for r in rows if (r["n"], r["k"], r["m"]) == (4096, 4096, [65, 128])]
    assert (new["tile_m"], new["tile_n"], new["us"]) == (64, 64, 9.0)
    others = [r for r in rows if r is not new]
    assert others == [r for r in base.data["shape_rows"] if r not in replaced]
    assert table.provenance["kept_rows_from"] == base.provenance


def test_tune_where_filters_candidates_by_key_fields():
    import click

    from cute_aot.aot.tools.aot_tune.cli import matches, parse_where

    keys = GEMM.tune_candidates(GemmProblem(512, 4096, 4096), ARCH)
    where = parse_where(["persistent=1", "tile_m=128"], GEMM.Key)
    chosen = [key for key in keys if matches(key, where)]
    assert chosen and all(key.persistent and key.tile_m == 128 for key in chosen)
    assert [key for key in keys if matches(key, parse_where(["persistent=false"], GEMM.Key))] == [
        key for key in keys if not key.persistent
    ]
    fill = parse_where(["tile_n=144|160", "persistent=False"], GEMM.Key)
    assert fill == {"tile_n": ("144", "160"), "persistent": ("0",)}
    widths = {key.tile_n for key in keys if matches(key, fill)}
    assert widths == {144, 160}
    with pytest.raises(click.BadParameter, match="no field 'tiles'"):
        matches(keys[0], parse_where(["tiles=2"], GEMM.Key))
    with pytest.raises(click.BadParameter, match="not FIELD=VALUE"):
        parse_where(["persistent"], GEMM.Key)


def test_aot_tune_refuses_an_unknown_where_field_before_looking_for_a_gpu(tmp_path):
    from cute_aot.aot.tools.aot_tune.cli import main as aot_tune

    args = ["--family", "gemm_sm90", "--where", "tiles=2", "--out", str(tmp_path / "t.json")]
    result = CliRunner().invoke(aot_tune, args)
    assert result.exit_code == 2
    assert "gemm_sm90 keys have no field 'tiles'" in " ".join(result.output.split())
    assert "no supported GPU" not in result.output
    assert not (tmp_path / "t.json").exists()
