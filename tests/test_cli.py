"""`aot-build` on the command line: options, shapes per family, the plan over installed families.

A small stand-in family (`toy`, built for sm_90a only) is registered next to router_gemm by
replacing the discovered families, to show that the CLI and the plan are generic: shapes, model
mappings and architectures all come from each family's contract.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import cute_aot.kernels as kernels
from cute_aot.aot.build import BuildPlan
from cute_aot.aot.cli import main, parse_shape_option
from cute_aot.aot.models import preset, shapes_for_models
from cute_aot.kernels import Dispatch, KernelFamily, TensorArg, family
from cute_aot.kernels.keys import KernelKey

ROUTER = "router_gemm"


@dataclass(frozen=True)
class ToyKey(KernelKey):
    FAMILY = "toy"

    rows: int
    cols: int


class ToyFamily(KernelFamily):
    """One key per (rows, cols) shape; reads its shape from a model's hidden_size."""

    name = "toy"
    version = 1
    Key = ToyKey
    archs = ("sm_90a",)
    abi = (TensorArg("x", "float32", 2), TensorArg("out", "float32", 2, output=True))
    builder = "toy.build"  # never imported: these tests stop before compiling
    default_shapes = ((8, 8),)
    shape_syntax = "R,C"

    def problems(self, shape):
        yield tuple(shape)

    def dispatch(self, problem, arch):
        return Dispatch(ToyKey(*problem), "one key per shape")

    def shapes_from_model(self, config):
        hidden = config.get("hidden_size")
        return [(hidden, 2)] if isinstance(hidden, int) else []


@pytest.fixture
def toy(monkeypatch) -> ToyFamily:
    """router_gemm and `toy` as the installed families, for this test only."""
    installed = {"router_gemm": kernels.families()["router_gemm"], "toy": ToyFamily()}
    monkeypatch.setattr(kernels, "_points", dict.fromkeys(installed))
    monkeypatch.setattr(kernels, "_loaded", dict(installed))
    return installed["toy"]


def router_keys(arch: str, shapes) -> set:
    return set(family(ROUTER).enumerate_keys(arch, shapes))


def planned(monkeypatch, *args: str) -> tuple[dict[str, list], str]:
    """The {arch: keys} `aot-build ARGS` would compile (its --dry-run), and what it printed."""
    result = CliRunner().invoke(main, [*args, "--no-cache", "--quiet", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    seen = {
        arch: [family(key["family"]).Key.from_fields(key["key"]) for key in keys]
        for arch, keys in plan.items()
    }
    for keys in plan.values():
        assert all(
            key["key_id"] == family(key["family"]).Key.from_fields(key["key"]).id for key in keys
        )
    return seen, result.output


def flat(text: str) -> str:
    """Help text with click's line wrapping undone."""
    return " ".join(text.split())


# -- help ----------------------------------------------------------------------------------------


def test_help_lists_the_main_options():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for option in ("--arch", "--out", "--shape", "--jobs", "--family", "--model-config"):
        assert option in result.output


def test_help_lists_the_installed_families_and_their_shape_syntax(toy):
    output = flat(CliRunner().invoke(main, ["--help"]).output)
    assert "router_gemm:N,K (or plain N,K), toy:R,C" in output
    assert "every installed one that can be built here: router_gemm,toy" in output


# -- --shape -------------------------------------------------------------------------------------


def test_plain_shape_means_the_unprefixed_family():
    assert parse_shape_option("320,7168") == (ROUTER, (320, 7168))
    assert parse_shape_option("router_gemm:320,7168") == (ROUTER, (320, 7168))


def test_prefixed_and_unprefixed_shapes_reach_their_families(toy, monkeypatch):
    plan, _ = planned(
        monkeypatch,
        *("--shape", "320,7168", "--shape", "router_gemm:64,2880", "--shape", "toy:16,4"),
        *("--shape", "toy:16,4", "--no-default-shapes", "--arch", "sm_90a"),
    )
    assert list(plan) == ["sm_90a"]
    want = router_keys("sm_90a", [(320, 7168), (64, 2880)]) | {ToyKey(16, 4)}
    assert set(plan["sm_90a"]) == want
    assert len(plan["sm_90a"]) == len(want)


def test_shapes_add_to_every_familys_defaults(toy, monkeypatch):
    plan, _ = planned(monkeypatch, "--shape", "toy:16,4", "--arch", "sm_90a")
    want = router_keys("sm_90a", family(ROUTER).default_shapes) | {ToyKey(8, 8), ToyKey(16, 4)}
    assert set(plan["sm_90a"]) == want


@pytest.mark.parametrize(
    "shape, expected",
    [
        ("256x7168", "'256x7168' is not a router_gemm shape, expected router_gemm:N,K"),
        ("router_gemm:2,7", "is not a router_gemm shape, expected router_gemm:N,K"),
        ("toy:1", "'toy:1' is not a toy shape, expected toy:R,C"),
        ("toy:1,0", "'toy:1,0' is not a toy shape, expected toy:R,C"),
        (
            "nope:1,2",
            "unknown kernel family 'nope'; installed families and their shapes: "
            "router_gemm:N,K (or plain N,K), toy:R,C",
        ),
    ],
)
def test_bad_shape_is_a_usage_error_naming_family_and_syntax(toy, shape, expected):
    result = CliRunner().invoke(main, ["--shape", shape])
    assert result.exit_code == 2
    assert expected in flat(result.output)


def test_shape_of_a_family_left_out_is_refused(toy):
    result = CliRunner().invoke(main, ["--families", "toy", "--shape", "320,7168"])
    assert result.exit_code == 2
    assert "--shape for router_gemm, which --families leaves out" in flat(result.output)


# -- families and architectures ------------------------------------------------------------------


def test_unknown_arch_fails_cleanly_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(main, ["--arch", "sm_80", "--out", str(tmp_path / "b"), "--quiet"])
    assert result.exit_code == 1
    assert "unsupported architecture 'sm_80'" in result.output
    assert not (tmp_path / "b").exists()


def test_unknown_family_is_a_usage_error(toy):
    result = CliRunner().invoke(main, ["--families", "toy,nope"])
    assert result.exit_code == 2
    assert "unknown nope; installed: router_gemm, toy" in flat(result.output)


def test_each_family_builds_only_for_its_architectures(toy, monkeypatch):
    plan, output = planned(monkeypatch, "--arch", "sm_90a,sm_100a")
    assert "family toy: skipping sm_100a (built for sm_90a only)" in output
    defaults = family(ROUTER).default_shapes
    assert set(plan["sm_90a"]) == router_keys("sm_90a", defaults) | {ToyKey(8, 8)}
    assert set(plan["sm_100a"]) == router_keys("sm_100a", defaults)


def test_a_family_not_named_and_without_a_requested_arch_is_skipped(toy, monkeypatch):
    plan, output = planned(monkeypatch, "--arch", "sm_100a")
    assert "family toy: skipped (built for sm_90a, none requested)" in output
    assert set(plan) == {"sm_100a"}
    assert set(plan["sm_100a"]) == router_keys("sm_100a", family(ROUTER).default_shapes)


@pytest.mark.parametrize("asked", [["--families", "toy"], ["--shape", "toy:16,4"]])
def test_a_named_family_without_a_requested_arch_is_an_error(toy, asked, tmp_path):
    out = tmp_path / "out"
    args = [*asked, "--arch", "sm_100a,sm_103a", "--out", str(out), "--no-cache"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert (
        "family toy is built for sm_90a, none of the requested architectures (sm_100a, sm_103a)"
        in flat(result.output)
    )
    assert not out.exists()


def test_an_arch_left_without_keys_gets_no_bundle_and_says_so(toy, monkeypatch):
    plan, output = planned(monkeypatch, "--families", "toy", "--arch", "sm_90a,sm_100a")
    assert plan == {"sm_90a": [ToyKey(8, 8)]}
    assert "family toy: skipping sm_100a (built for sm_90a only)" in output
    assert "sm_100a: no keys for this architecture, no bundle" in output


def test_plan_adds_extra_shapes_to_the_defaults():
    router = family(ROUTER)
    plan = BuildPlan(archs=["sm_90a"], extra_shapes={ROUTER: [(128, 2880)]})
    keys = plan.keys("sm_90a")
    assert set(router.enumerate_keys("sm_90a")) < set(keys)
    only = BuildPlan(archs=["sm_90a"], extra_shapes={ROUTER: [(128, 2880)]}, default_shapes=False)
    assert set(only.keys("sm_90a")) == set(router.enumerate_keys("sm_90a", [(128, 2880)]))


def test_plan_defaults_to_every_installed_family_within_its_archs(toy):
    plan = BuildPlan(archs=["sm_90a", "sm100a"])
    assert plan.families == [ROUTER, "toy"]
    assert plan.skipped_archs() == {"toy": ["sm_100a"]}
    assert plan.families_for("sm_100a") == [ROUTER]
    assert ToyKey(8, 8) in plan.keys("sm_90a")
    assert ToyKey(8, 8) not in plan.keys("sm_100a")


# -- models --------------------------------------------------------------------------------------


def test_a_preset_gives_every_familys_shapes(toy, monkeypatch):
    kimi = preset("kimi-k2")
    assert shapes_for_models([kimi], [family(ROUTER), toy]) == {
        ROUTER: [(384, 7168)],
        "toy": [(7168, 2)],
    }
    plan, output = planned(monkeypatch, "--model", "kimi-k2", "--arch", "sm_90a,sm_100a")
    assert "model kimi-k2: router_gemm 384,7168; toy 7168,2" in output
    # A model build is the model's shapes only, each family within its architectures.
    assert set(plan["sm_90a"]) == router_keys("sm_90a", [(384, 7168)]) | {ToyKey(7168, 2)}
    assert set(plan["sm_100a"]) == router_keys("sm_100a", [(384, 7168)])


def test_a_config_gives_every_familys_shapes_from_its_language_section(toy, monkeypatch, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "hidden_size": 1024,  # the vision tower's: the nested language section wins
                "text_config": {"hidden_size": 5120, "num_local_experts": 16},
            }
        )
    )
    plan, output = planned(monkeypatch, "--model-config", str(config), "--arch", "sm_90a")
    assert "router_gemm 16,5120; toy 5120,2" in output
    assert set(plan["sm_90a"]) == router_keys("sm_90a", [(16, 5120)]) | {ToyKey(5120, 2)}


def test_a_dense_config_builds_only_the_families_that_serve_it(toy, monkeypatch, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "model_type": "llama"}))
    plan, output = planned(monkeypatch, "--model-config", str(config), "--arch", "sm_90a,sm_100a")
    assert "router_gemm (none); toy 4096,2" in output
    assert plan == {"sm_90a": [ToyKey(4096, 2)]}
    assert "sm_100a: no keys for this architecture, no bundle" in output


def test_a_model_no_asked_family_serves_is_an_error_naming_it(toy, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "model_type": "llama"}))
    out = tmp_path / "out"
    args = ["--model-config", str(config), "--families", ROUTER, "--out", str(out), "--no-cache"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert str(config) in result.output
    assert "gives no shapes to the families asked (router_gemm)" in result.output
    assert not out.exists()


def test_a_preset_no_asked_family_serves_is_an_error_naming_it(toy, monkeypatch):
    monkeypatch.setattr(toy, "shapes_from_model", lambda config: [])
    args = ["--model", "kimi-k2", "--families", "toy", "--arch", "sm_90a", "--no-cache"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "preset kimi-k2: model kimi-k2 gives no shapes to the families asked (toy)" in (
        result.output
    )


@pytest.mark.parametrize(
    "content, problem",
    [(None, "cannot read"), ("{nope", "not valid JSON"), ("[1, 2]", "not a JSON object")],
)
def test_an_unusable_config_file_is_named(tmp_path, content, problem):
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    if content is not None:
        config.write_text(content)
    # A folder without config.json exists (click checks it) but cannot be read.
    result = CliRunner().invoke(main, ["--model-config", str(config.parent), "--no-cache"])
    assert result.exit_code == 1
    assert f"{config}: {problem}" in result.output


def test_models_lists_each_familys_shapes_and_key_counts(toy, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    rows = [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in result.output.splitlines()
        if line.startswith("│ kimi-k2 ")
    ]
    router = family(ROUTER)
    counts = [
        str(len(router.enumerate_keys(arch, [(384, 7168)])))
        for arch in ("sm_90a", "sm_100a", "sm_103a")
    ]
    assert rows == [
        ["kimi-k2", ROUTER, "N,K: 384,7168", *counts, "preset"],
        ["kimi-k2", "toy", "R,C: 7168,2", "1", "-", "-", "preset"],
    ]


# -- misses --------------------------------------------------------------------------------------


def test_misses_of_families_not_installed_are_skipped_by_name(toy, monkeypatch, tmp_path):
    router_key = family(ROUTER).enumerate_keys("sm_90a", [(256, 7168)])[0]
    log = tmp_path / "misses.jsonl"
    records = [
        {"family": ROUTER, "key": router_key.fields(), "arch": "sm_90a"},
        {"family": "gone", "key": {"family": "gone", "x": 1}, "arch": "sm_90a"},
        {"family": "gone", "key": {"family": "gone", "x": 2}, "arch": "sm_90a"},
        {"family": "toy", "key": ToyKey(4, 4).fields(), "arch": "sm_100a"},
        {"family": "toy", "key": ToyKey(4, 4).fields(), "arch": "sm_90a"},
    ]
    log.write_text("\n".join(json.dumps(record) for record in records))
    plan, output = planned(monkeypatch, "--from-misses", str(log))
    assert plan == {"sm_90a": sorted([router_key, ToyKey(4, 4)], key=lambda k: k.symbol)}
    assert "skipping 2 misses of family 'gone': not installed here" in output
    assert "skipping 1 misses of family 'toy': not built for sm_100a" in output


# -- generic over families -----------------------------------------------------------------------


def test_the_build_reaches_families_only_through_the_contract():
    aot = Path(__file__).resolve().parent.parent / "aot"
    files = [path for path in aot.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    naming = [path.name for path in files if b"router_gemm" in path.read_bytes()]
    assert naming == []


def test_dry_run_prints_each_planned_key_and_builds_nothing(tmp_path):
    args = ["--families", ROUTER, "--no-default-shapes", "--shape", "256,7168", "--arch", "sm_90a"]
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [*args, "--out", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    keys = router_keys("sm_90a", [(256, 7168)])
    lines = result.stdout.splitlines()
    assert len(lines) == len(keys) > 0
    for line, key in zip(lines, sorted(keys, key=lambda key: key.symbol), strict=True):
        arch, name, key_id, fields = line.split(" ", 3)
        assert (arch, name, key_id) == ("sm_90a", ROUTER, key.id)
        assert family(ROUTER).Key.from_fields(json.loads(fields)) == key
    assert not out.exists()
    refused = CliRunner().invoke(main, [*args, "--dry-run", "--wheel"])
    assert refused.exit_code == 2 and "--dry-run builds nothing" in refused.output
