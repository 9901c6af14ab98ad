"""One shape order for every family and command: a GEMM (out = x @ w.T) writes its weight's
shape `N,K` (w is [N, K]) and a problem `M,N,K`, positionally or named (`N=256,K=7168`), in
`aot-build --shape`, `aot-tune --shape` and `aot-cache explain --shape` alike. router_gemm read
`K,N` / `M,K,N` before; a positional router shape with N > K is that older order and is refused
with the corrected spelling instead of being misread."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from cute_aot.aot.cli import main as aot_build
from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from cute_aot.artifacts.core.errors import CuteAotError, UnsupportedProblemError
from cute_aot.kernels import KernelFamily, families, family
from cute_aot.kernels.contract import parse_ints
from cute_aot.kernels.tables import packaged_tables
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
def isolated(tmp_path, settings_scope):
    settings_scope(
        CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"),
        CUTE_AOT_BUNDLES=None,
        CUTE_AOT_MISS_LOG=None,
        CUTE_AOT_MODE=None,
    )


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
def test_aot_build_refuses_the_older_router_order_with_the_fix(tmp_path, shape):
    # --dry-run: were the shape accepted, it would plan (exit 0) rather than build every key
    args = ["--shape", shape, "--out", str(tmp_path / "out"), "--no-cache", "--dry-run"]
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
    import cute_aot.aot.tools.aot_tune.cli as aot_tune

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
    from cute_aot.aot.tools.aot_tune.cli import main as aot_tune

    args = ["--family", "router_gemm", "--shape", f"{K},{N}", "--out", str(tmp_path / "t.json")]
    result = CliRunner().invoke(aot_tune, args)
    assert result.exit_code == 2
    output = flat(result.output)
    assert "no supported GPU" not in output
    assert f"the older K,N order; the order is N,K (w is [N, K]): write {N},{K}" in output
    assert not (tmp_path / "t.json").exists()


# -- numbers: the router's Python API takes (M, N, K) too ----------------------------------------
# Key ids of default router keys as they were before the Python API moved to (M, N, K): the move
# changes how a problem is spelled, never a key (the fields stay m, k, ...; ids stay these).
DEFAULT_KEY_IDS = {  # (arch, M, N, K) -> key id
    ("sm_90a", 1, 256, 7168): "5ff242f3c44aa045d2fe",
    ("sm_90a", 12, 256, 7168): "52196d503cd6c843426c",
    ("sm_100a", 12, 256, 7168): "8ce1476a355780f834f2",
    ("sm_100a", 16, 256, 4096): "8ce1476a355780f834f2",
    ("sm_100a", 1, 384, 7168): "97d4de4947b8da2acec2",
    ("sm_103a", 16, 384, 7168): "b4a5671e2072f9d9fd03",
}
# sha256 of every default key id, in enumeration order, per architecture (26 and 16 keys).
DEFAULT_KEYS_DIGEST = {"sm_90a": "40f645b0a58aa4d4", "sm_100a": "2ed0a64eb18cbd26"}
OLD = (M, K, N)  # a problem in the router's older (M, K, N) order: reads as N=7168 > K=256
OLD_FIX = f"write {(M, N, K)}, or name the dims if N > K is meant: RouterProblem(m={M}, n={K}"


def test_the_router_dispatches_m_n_k_to_the_keys_it_always_had():
    from cute_aot.kernels.router_gemm import RouterProblem, dispatch

    router = family("router_gemm")
    for (arch, m, n, k), key_id in DEFAULT_KEY_IDS.items():
        assert dispatch(m, n, k, arch).id == key_id
        assert router.dispatch(RouterProblem(m, n, k), arch).key.id == key_id
        assert router.dispatch((m, n, k), arch).key.id == key_id  # a bare tuple, same order
    key = dispatch(2, N, K, "sm_90a")
    assert (key.backend, key.m, key.k) == ("dot", 2, K)  # K compiled in: the weight's 7168
    for arch, digest in DEFAULT_KEYS_DIGEST.items():
        ids = " ".join(key.id for key in router.enumerate_keys(arch, router.default_shapes))
        assert hashlib.sha256(ids.encode()).hexdigest()[:16] == digest, arch


def test_the_routers_problem_fields_are_m_n_k():
    from cute_aot.kernels.router_gemm import RouterProblem

    router = family("router_gemm")
    assert RouterProblem._fields[:3] == ("m", "n", "k")
    assert RouterProblem(M, N, K) == router.parse_problem(f"{M},{N},{K}")
    assert list(router.problems((N, K)))[M - 1] == RouterProblem(M, N, K)
    assert router.input_shapes((M, N, K)) == ((M, K), (N, K))
    assert router.output_shape((M, N, K)) == (M, N)


def test_the_router_refuses_older_order_numbers_with_the_fix():
    from cute_aot.kernels.router_gemm import RouterProblem, dispatch

    router = family("router_gemm")
    refusals = [
        lambda: dispatch(*OLD, "sm_90a"),
        lambda: RouterProblem(*OLD),
        lambda: router.dispatch(OLD, "sm_90a"),
        lambda: router.tune_candidates(OLD, "sm_90a"),
        lambda: router.input_shapes(OLD),
    ]
    for refused in refusals:
        with pytest.raises(UnsupportedProblemError, match=r"the older \(M, K, N\) order") as why:
            refused()
        assert OLD_FIX in str(why.value)


def test_named_numbers_build_a_router_with_more_experts_than_hidden_size():
    import copy
    import pickle

    from cute_aot.kernels.router_gemm import RouterProblem

    wide = RouterProblem(m=2, n=512, k=256)
    assert (wide.n, wide.k) == (512, 256)
    assert pickle.loads(pickle.dumps(wide)) == copy.copy(wide) == wide._replace() == wide
    assert family("router_gemm").dispatch(wide, "sm_90a").key.k == 256


@pytest.fixture
def router_op(fresh_runtime, fake_gpu, monkeypatch):
    """The router op on a fake sm_90a GPU, with no bundle and no JIT: preload resolves to the
    torch reference, which is enough to see which shapes a problem was read as."""
    from cute_aot.runtime import ops
    from tests.stubs import without_cutlass

    without_cutlass(monkeypatch)
    return ops.family_op("router_gemm")


def _preloaded(router_op) -> set[tuple[tuple[int, ...], ...]]:
    return {tuple(tuple(shape) for shape in shapes) for shapes in router_op.table}


def test_preload_reads_m_n_k_tuples_and_named_dims(router_op):
    from cute_aot.runtime import preload
    from tests.fake_gpu import GPU

    problems = [(1, N, K), {"M": 2, "N": N, "K": K}, f"M=3,N={N},K={K}", f"4,{N},{K}"]
    with pytest.warns(RuntimeWarning):
        assert preload({"router_gemm": problems}, GPU) == 4
    assert _preloaded(router_op) == {((m, K), (N, K)) for m in (1, 2, 3, 4)}
    with pytest.warns(RuntimeWarning):
        preload([{"m": 2, "n": 512, "k": 256}], GPU)  # named: N > K taken as written
    assert ((2, 256), (512, 256)) in _preloaded(router_op)


def test_preload_refuses_an_older_order_tuple_with_the_fix(router_op):
    from cute_aot.runtime import preload
    from tests.fake_gpu import GPU

    for problems in ([OLD], {"router_gemm": [list(OLD)]}):
        with pytest.raises(UnsupportedProblemError, match=r"the older \(M, K, N\) order") as why:
            preload(problems, GPU)
        assert OLD_FIX in str(why.value) and f"'M={M},N={K},K={N}'" in str(why.value)
    with pytest.raises(UnsupportedProblemError, match="the older M,K,N order"):
        preload([f"{M},{K},{N}"], GPU)  # positional text: the text rule, the same words
    assert router_op.table == {}  # nothing was resolved for a refused problem
