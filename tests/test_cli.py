from click.testing import CliRunner

from cute_aot.aot.build import BuildPlan
from cute_aot.aot.cli import main
from cute_aot.kernels.router_gemm import enumerate_keys


def test_help_lists_the_main_options():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for option in ("--arch", "--out", "--shape", "--jobs", "--family"):
        assert option in result.output


def test_bad_shape_is_a_usage_error():
    result = CliRunner().invoke(main, ["--shape", "7168x256"])
    assert result.exit_code == 2
    assert "K,N" in result.output


def test_unknown_arch_fails_cleanly_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(main, ["--arch", "sm_80", "--out", str(tmp_path / "b"), "--quiet"])
    assert result.exit_code == 1
    assert "unsupported architecture 'sm_80'" in result.output
    assert not (tmp_path / "b").exists()


def test_plan_adds_extra_shapes_to_the_defaults():
    plan = BuildPlan(archs=["sm_90a"], extra_shapes={"router_gemm": [(2880, 128)]})
    keys = plan.keys("sm_90a")
    assert set(enumerate_keys("sm_90a")) < set(keys)
    only = BuildPlan(
        archs=["sm_90a"], extra_shapes={"router_gemm": [(2880, 128)]}, default_shapes=False
    )
    assert set(only.keys("sm_90a")) == set(enumerate_keys("sm_90a", [(2880, 128)]))
