"""One shape order for every family and command: a GEMM (out = x @ w.T) writes its weight's
shape `N,K` (w is [N, K]) and a problem `M,N,K`, positionally or named (`N=256,K=7168`), in
`aot-build --shape`, `aot-tune --shape` and `aot-cache explain --shape` alike. router_gemm read
`K,N` / `M,K,N` before; a positional router shape with N > K is that older order and is refused
with the corrected spelling instead of being misread."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cute_aot.aot.cli import main as aot_build
from cute_aot.artifacts.errors import CuteAotError, UnsupportedProblemError
from cute_aot.kernels import KernelFamily, families, family
from cute_aot.kernels.contract import parse_ints
from cute_aot.kernels.tables import packaged_tables
from cute_aot.runtime.aot_cache.cli import main as aot_cache
from tests.test_cli import planned

GEMMS = [
    "router_gemm",
    "gemm_sm90",
    "gemm_sm90_fp8",
    "flashinfer_mxfp8_gemm",
    "flashinfer_tgv_gemm",
]
N, K, M = 256, 7168, 12  # a router's experts and hidden size: N < K, as in every released MoE
WEIGHT_SPELLINGS = [f"{N},{K}", f"N={N},K={K}", f"k={K},n={N}"]
PROBLEM_SPELLINGS = [f"{M},{N},{K}", f"M={M},N={N},K={K}", f"K={K},M={M},N={N}"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_AOT_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("CUTE_AOT_BUNDLES", "CUTE_AOT_MISS_LOG", "CUTE_AOT_MODE"):
        monkeypatch.delenv(name, raising=False)


def gemm(name: str) -> KernelFamily:
    if name not in families():
        pytest.skip(f"{name} is not installed")
    return family(name)


def flat(text: str) -> str:
    return " ".join(text.split())


# -- the families ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GEMMS)
def test_every_gemm_reads_its_weight_as_n_k(name):
    found = gemm(name)
    assert found.shape_syntax == "N,K"
    for text in WEIGHT_SPELLINGS:
        shape = found.parse_shape(text)
        for problem in found.problems(shape):
            described = found.describe_problem(problem)
            assert (described["n"], described["k"]) == (N, K), text


@pytest.mark.parametrize("name", GEMMS)
def test_every_gemm_reads_its_problem_as_m_n_k(name):
    found = gemm(name)
    for text in PROBLEM_SPELLINGS:
        described = found.describe_problem(found.parse_problem(text))
        assert (described["m"], described["n"], described["k"]) == (M, N, K), text


def test_a_router_weight_shape_is_the_shape_of_w():
    router = family("router_gemm")
    assert all(n < k for n, k in router.default_shapes)
    assert router.shapes_from_model({"hidden_size": K, "n_routed_experts": N}) == [(N, K)]
    torch = pytest.importorskip("torch")
    gate = torch.nn.ModuleDict({"gate": torch.nn.Linear(K, N, bias=False, dtype=torch.bfloat16)})
    assert router.shapes_from_torch_model(gate) == [tuple(gate["gate"].weight.shape)] == [(N, K)]


@pytest.mark.parametrize(
    "text, fix",
    [
        (f"{K},{N}", f"write {N},{K}, or N={K},K={N} if N > K is meant"),
        (f"{K}, {N}", f"write {N},{K}, or N={K},K={N} if N > K is meant"),
    ],
)
def test_the_router_refuses_the_older_k_n_order_with_the_fix(text, fix):
    with pytest.raises(UnsupportedProblemError, match="the older K,N order") as refused:
        family("router_gemm").parse_shape(text)
    assert fix in str(refused.value)


def test_the_router_refuses_the_older_m_k_n_order_with_the_fix():
    with pytest.raises(UnsupportedProblemError, match="the older M,K,N order") as refused:
        family("router_gemm").parse_problem(f"{M},{K},{N}")
    assert f"write {M},{N},{K}, or M={M},N={K},K={N} if N > K is meant" in str(refused.value)


def test_named_dims_build_a_router_with_more_experts_than_hidden_size():
    router = family("router_gemm")
    assert router.parse_shape("N=512,K=256") == (512, 256)
    assert router.describe_problem(router.parse_problem("M=2,N=512,K=256"))["n"] == 512


@pytest.mark.parametrize("text", ["256", "N=256", "N=256,K=7168,K=8", "256,K=7168", "N=256,X=8"])
def test_dims_are_all_positional_or_all_named_each_once(text):
    with pytest.raises(UnsupportedProblemError, match=r"is not N,K \(2 positive integers"):
        family("router_gemm").parse_shape(text)


def test_a_plug_in_family_gets_the_named_form_from_the_contract():
    class Toy(KernelFamily):
        name, shape_syntax = "toy", "R,C"

    assert Toy().parse_shape("16,4") == Toy().parse_shape("C=4,R=16") == (16, 4)
    assert parse_ints(Toy(), "hv=2,H=1", "H,HV") == (1, 2)


def test_the_shipped_tables_measured_shapes_read_back_in_the_one_order():
    """aot-tune records the shapes it measured; a reader (benchmarks/tuned_vs_default.py) reads
    them back through the family's own rule, which refuses the router's older order."""
    for package in ("cute_aot.kernels.router_gemm", "cute_aot.kernels.gemm_sm90"):
        for (name, _), table in packaged_tables(package).items():
            for shape in table.provenance["shapes"]:
                assert family(name).parse_shape(",".join(map(str, shape))) == tuple(shape)


# -- the commands ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GEMMS)
def test_aot_build_plans_the_same_keys_for_every_spelling(monkeypatch, name):
    found = gemm(name)
    if found.missing_requirements():
        pytest.skip(found.missing_requirements())
    arch = found.archs[0]
    want = set(found.enumerate_keys(arch, [(N, K)]))
    for text in WEIGHT_SPELLINGS:
        plan, _ = planned(
            monkeypatch,
            "--families",
            name,
            "--no-default-shapes",
            "--shape",
            f"{name}:{text}",
            "--arch",
            arch,
        )
        assert want and set(plan[arch]) == want, text


def test_aot_build_reads_a_plain_shape_as_the_routers_n_k(monkeypatch):
    plan, _ = planned(monkeypatch, "--no-default-shapes", "--shape", f"{N},{K}", "--arch", "sm_90a")
    dot = [key for key in plan["sm_90a"] if key.backend == "dot"]
    assert dot and {key.k for key in dot} == {K}  # K compiled into every dot-product kernel


@pytest.mark.parametrize("shape", [f"{K},{N}", f"router_gemm:{K},{N}"])
def test_aot_build_refuses_the_older_router_order_with_the_fix(monkeypatch, tmp_path, shape):
    def accepted(*args, **kwargs):  # stop before compiling rather than build every default key
        raise AssertionError(f"{shape} was accepted")

    monkeypatch.setattr("cute_aot.aot.build_command.run_build", accepted)
    args = ["--shape", shape, "--out", str(tmp_path / "out"), "--no-cache"]
    result = CliRunner().invoke(aot_build, args)
    assert result.exit_code == 2
    output = flat(result.output)
    assert "expected router_gemm:N,K" in output and "the older K,N order" in output
    assert f"write {N},{K}, or N={K},K={N} if N > K is meant" in output


@pytest.mark.parametrize("name", GEMMS)
def test_explain_reads_every_spelling_as_m_n_k(name):
    found = gemm(name)
    for text in PROBLEM_SPELLINGS:
        args = ["explain", name, "--shape", text, "--arch", found.archs[0], "--json"]
        result = CliRunner().invoke(aot_cache, args)
        assert result.exit_code == 0, result.output
        problem = json.loads(result.stdout)["problem"]
        assert (problem["m"], problem["n"], problem["k"]) == (M, N, K), text


def test_explain_refuses_the_older_router_order_with_the_fix():
    result = CliRunner().invoke(aot_cache, ["explain", "router_gemm", "--shape", f"{M},{K},{N}"])
    assert result.exit_code == 2
    output = flat(result.output)
    assert "the older M,K,N order" in output
    assert f"write {M},{N},{K}, or M={M},N={K},K={N} if N > K is meant" in output


@pytest.mark.parametrize("name", ["router_gemm", "gemm_sm90"])
def test_aot_tune_reads_every_spelling_as_n_k(monkeypatch, tmp_path, name):
    import cute_aot.runtime.tuning.cli as aot_tune

    tuned = []

    def record(found, arch, shapes, results_path, console, *options):
        tuned.append(list(shapes))
        raise CuteAotError("stop before measuring")

    monkeypatch.setattr(aot_tune, "_current_arch", lambda: "sm_90a")
    monkeypatch.setattr(aot_tune, "tune", record)
    for text in WEIGHT_SPELLINGS:
        args = ["--family", name, "--shape", text, "--out", str(tmp_path / "t.json")]
        result = CliRunner().invoke(aot_tune.main, args)
        assert result.exit_code == 1 and "stop before measuring" in result.output, result.output
    assert tuned == [[family(name).parse_shape(f"N={N},K={K}")]] * len(WEIGHT_SPELLINGS)


def test_aot_tune_refuses_the_older_router_order_before_looking_for_a_gpu(tmp_path):
    from cute_aot.runtime.tuning.cli import main as aot_tune

    args = ["--family", "router_gemm", "--shape", f"{K},{N}", "--out", str(tmp_path / "t.json")]
    result = CliRunner().invoke(aot_tune, args)
    assert result.exit_code == 2
    output = flat(result.output)
    assert "no supported GPU" not in output
    assert f"the older K,N order; the order is N,K (w is [N, K]): write {N},{K}" in output
    assert not (tmp_path / "t.json").exists()
