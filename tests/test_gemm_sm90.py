"""The Hopper GEMM families (kernels/gemm_sm90): key, dispatch, ABI on CPU; cross-compiled SASS."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
import subprocess
import sys

import pytest

from cute_aot.aot import binary_info
from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.gemm_sm90 import (
    BF16_DTYPE,
    DEFAULT_SHAPES,
    FP8_DTYPE,
    M_BUCKETS,
    GemmProblem,
    GemmSm90Key,
    accumulators_per_thread,
    family,
    fp8_family,
    handwritten_table,
    stages_for,
    stores_by_tma,
    strip_cols,
    tactic_refusal,
)
from cute_aot.kernels.tables import Table

ARCH = "sm_90a"
HAS_TOOLS = bool(binary_info.find_tool("cuobjdump") and binary_info.find_tool("nvdisasm"))


# -- purity --------------------------------------------------------------------------------------
def test_family_module_imports_neither_cutlass_nor_torch():
    code = (
        "import sys; import cute_aot.kernels.gemm_sm90 as g; "
        "print(sorted(m for m in ('cutlass', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_registered_through_the_entry_point_like_any_family():
    from cute_aot.kernels import family as installed

    assert installed("gemm_sm90") is family
    assert installed("gemm_sm90_fp8") is fp8_family


# -- key -----------------------------------------------------------------------------------------
def test_key_is_frozen_with_a_stable_canonical_form():
    key = family.dispatch(GemmProblem(64, 4096, 4096), ARCH).key
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.tile_m = 128
    fields = json.loads(key.canonical_json())
    assert fields["family"] == "gemm_sm90"
    assert set(fields) == {
        "family",
        "dtype",
        "has_bias",
        "tile_m",
        "tile_n",
        "cluster_m",
        "cluster_n",
        "stages",
        "pdl",
        "raster_m",
        "aligned_n",
        "swap_ab",
        "split_k",
        "promote",
        "persistent",
        "pingpong",
        "out_dtype",
        "align_bytes",
        "version",
    }
    assert GemmSm90Key.from_fields(fields) == key
    assert key.symbol == f"gemm_sm90_{key.id}"


def test_fp8_keys_never_share_an_id_with_bf16_keys():
    bf16 = family.dispatch(GemmProblem(4096, 4096, 4096), ARCH).key
    fp8 = fp8_family.dispatch(GemmProblem(4096, 4096, 4096, FP8_DTYPE), ARCH).key
    assert fp8.FAMILY == "gemm_sm90_fp8" and fp8.dtype == FP8_DTYPE
    assert fp8.id != bf16.id


def test_has_bias_changes_the_key():
    with_bias = family.dispatch(GemmProblem(16, 4096, 4096, BF16_DTYPE, True), ARCH).key
    without = family.dispatch(GemmProblem(16, 4096, 4096, BF16_DTYPE, False), ARCH).key
    assert with_bias.has_bias and not without.has_bias
    assert with_bias.id != without.id


# -- dispatch ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fam", [family, fp8_family], ids=lambda f: f.name)
def test_every_default_shape_and_bucket_dispatches(fam):
    for shape in DEFAULT_SHAPES:
        problems = list(fam.problems(shape))
        assert {p.m for p in problems} == set(M_BUCKETS)
        for problem in problems:
            decision = fam.dispatch(problem, ARCH)
            key = decision.key
            assert f"tile {key.tile_m}x{key.tile_n}" in decision.reason
            assert f"cluster {key.cluster_m}x{key.cluster_n}" in decision.reason
            assert f"{key.stages} stages" in decision.reason
            # The resource model's stage count for this tactic (kernel.py allocates by it).
            tactic = (key.tile_m, key.tile_n, key.persistent, key.pingpong, key.swap_ab)
            assert key.stages == stages_for(key.dtype, *tactic) >= 2
            assert key.dtype == fam.dtype and key.has_bias == problem.has_bias


HANDWRITTEN = handwritten_table("gemm_sm90", ARCH)


def test_tactic_follows_m():
    """The hand-written rule (what shapes without a tuned row get)."""

    def key(m, n=4096):
        return family.dispatch(GemmProblem(m, n, 4096), ARCH, HANDWRITTEN).key

    # Decode sizes: swap-AB, M on the wgmma's N side in the narrowest tile that holds it, and
    # K split while the CTAs stay within SPLIT_MAX_CTAS (N=4096: 32 tiles of 128 rows x 2).
    for m, tile_n in ((1, 8), (8, 8), (9, 16), (33, 64), (64, 64)):
        assert (key(m).swap_ab, key(m).tile_m, key(m).tile_n, key(m).split_k) == (
            True,
            128,
            tile_n,
            2,
        )
    assert key(1, n=576).split_k == 8 and key(1, n=1536).split_k == 4
    assert key(1, n=1001).swap_ab is False and key(1, n=1001).split_k == 1  # any-N epilogue
    assert key(1, n=57344).split_k == 1  # 448 tiles already fill the GPU
    assert (key(65).tile_m, key(256).tile_n, key(256).cluster_m) == (128, 128, 1)
    assert (key(128).split_k, key(256).split_k, key(256, n=28672).split_k) == (2, 1, 1)
    assert key(512, n=2560).tile_n == 128  # 4 x 10 tiles of 128 x 256 would leave SMs idle
    big = key(4096)
    assert (big.tile_m, big.tile_n, big.cluster_m, big.cluster_n) == (128, 256, 2, 1)
    assert big.stages == stages_for(BF16_DTYPE, 128, 256) == 4
    narrow = family.dispatch(GemmProblem(8192, 1024, 4096), ARCH, HANDWRITTEN)
    assert narrow.key.tile_n == 128 and "narrows tile_n to 128" in narrow.reason


def test_untuned_shapes_take_the_nearest_tuned_row_or_the_wave_model():
    """A shape with no row of its own: decode sizes run what won for the tuned shape nearest in
    log N (then log K) at the same M; from M = 512 the persistent tile that wastes the least of
    its last wave; an exact row always wins."""
    table = family.default_table(ARCH)
    rows = table.data["shape_rows"]
    for m in (1, 33):
        dispatch = family.dispatch(GemmProblem(m, 2560, 2048), ARCH)
        held = [r for r in rows if r["m"][0] <= m and (r["m"][1] is None or m <= r["m"][1])]
        near = min(
            held,
            key=lambda r: (
                abs(math.log(2560 / r["n"])) + 0.5 * abs(math.log(2048 / r["k"])),
                r["n"],
                r["k"],
            ),
        )
        assert f"nearest tuned shape N={near['n']} K={near['k']}" in dispatch.reason
        assert (dispatch.key.tile_m, dispatch.key.tile_n, dispatch.key.swap_ab) == (
            near["tile_m"],
            near["tile_n"],
            near.get("swap_ab", False),
        )
    # 4608 x 512: 144 tiles of 128 x 128 would take two waves for 1.09 waves of work, 72 tiles
    # of 128 x 256 one wave with 1.8x the work per SM of 128 tiles of 128 x 144 (a fill width).
    wide = family.dispatch(GemmProblem(512, 4608, 3584), ARCH)
    assert "wave model: 128 tiles (fill width) of 128x144 in 1 wave(s)" in wide.reason
    assert (wide.key.persistent, wide.key.cluster_m, wide.key.split_k) == (False, 1, 1)
    # 1024 x 4096: 8 x 4 tiles of 128 x 256 leave 100 SMs idle; 52 tiles of 128 x 80 split
    # 2 ways fill 104 of them, each CTA streaming half of K.
    split = family.dispatch(GemmProblem(512, 1024, 4096), ARCH)
    assert "wave model: 52 tiles of 128x80 x split-K 2 (64 k-tiles) in 1 wave(s)" in split.reason
    assert (split.key.tile_m, split.key.tile_n, split.key.split_k) == (128, 80, 2)
    assert not split.key.persistent
    # fp8's split costs were never measured: its wave model keeps whole-K tiles.
    fp8_split = fp8_family.dispatch(GemmProblem(512, 1024, 4096, FP8_DTYPE), ARCH)
    assert "wave model" in fp8_split.reason and fp8_split.key.split_k == 1
    # At 8192 x 4608 every tile takes several waves: the cheapest per element, persistent.
    large = family.dispatch(GemmProblem(8192, 4608, 3584), ARCH).key
    assert (large.tile_m, large.tile_n, large.persistent, large.cluster_m) == (128, 256, True, 2)
    assert not large.pingpong  # 56 k-tiles: the epilogue is a small part of a tile's time
    # Short K (1024: 16 k-tiles): the persistent 128-row tile runs as ping-pong 128 x 128.
    short = family.dispatch(GemmProblem(8192, 4608, 1024), ARCH)
    assert "16 k-tiles <= 32: ping-pong 128x128" in short.reason
    assert (short.key.tile_m, short.key.tile_n, short.key.pingpong, short.key.cluster_m) == (
        128,
        128,
        True,
        2,
    )
    # fp8 accumulates fast where tuned rows at this M checked it at a longer K: the same tiles.
    for m, n, k in ((512, 4608, 3584), (8192, 4608, 1024)):
        fp8 = fp8_family.dispatch(GemmProblem(m, n, k, FP8_DTYPE), ARCH).key
        bf16 = family.dispatch(GemmProblem(m, n, k), ARCH).key
        assert not fp8.promote and fp8.tile_n == bf16.tile_n and fp8.pingpong == bf16.pingpong
    exact = family.dispatch(GemmProblem(1, 4096, 4096), ARCH)
    assert exact.reason.startswith("tuned row for N=4096 K=4096")
    unaligned = family.dispatch(GemmProblem(1, 1001, 4096), ARCH)
    assert "nearest" not in unaligned.reason and not unaligned.key.swap_ab


def test_fp8_accumulates_fast_only_at_a_k_a_tuned_row_checked():
    """aot-tune checked a fast-accumulating tactic against the fp32 reference at its row's K;
    the error only grows with K. So an untuned shape accumulates fast up to the longest K
    checked at its M, and is promoted past it, whichever path chose its tile."""

    def row(k, promote, m=(257, 512), **tactic):
        fields = {
            "tile_m": 128,
            "tile_n": 128,
            "cluster_m": 1,
            "cluster_n": 1,
            "raster_m": 8,
            "us": 9.0,
            **tactic,
        }
        return {"n": 4096, "k": k, "m": list(m), "promote": promote, **fields}

    rows = [
        row(4096, False),
        row(8192, True),
        row(16384, False, m=(1025, 2048)),
        row(2048, False, m=(33, 64), tile_m=64, tile_n=64, swap_ab=True),
    ]
    table = Table(fp8_family.name, ARCH, dict(HANDWRITTEN.data, shape_rows=rows), {"source": "t"})

    def dispatch(m, k):
        return fp8_family.dispatch(GemmProblem(m, 6144, k, FP8_DTYPE), ARCH, table)

    fast = dispatch(512, 4096)  # wave model; the promoted K=8192 row is no evidence past 4096
    assert not fast.key.promote and "fast accumulation (checked at N=4096 K=4096)" in fast.reason
    slow = dispatch(512, 4112)
    assert slow.key.promote and "fast accumulation unchecked at this K" in slow.reason
    assert not dispatch(2048, 16384).key.promote  # another M's check: its own bucket's rows
    assert dispatch(4096, 1024).key.promote  # no row at M 4096 at all
    near = dispatch(64, 2048)  # the nearest row's fast tactic, at its own K
    assert near.key.swap_ab and not near.key.promote
    longer = dispatch(64, 3072)  # the same row's tactic at a K nobody checked
    assert longer.key.swap_ab and longer.key.promote


def test_a_neighbours_split_that_would_spill_into_another_wave_is_halved():
    """N = 4096's decode row splits 64 tiles of 64 rows in two (128 CTAs, one wave); at N = 4608
    the same split is 144 CTAs on 132 SMs, two waves: the nearest-row tactic runs unsplit."""
    rows = [
        {
            "n": 4096,
            "k": 4096,
            "m": [33, 64],
            "tile_m": 64,
            "tile_n": 64,
            "cluster_m": 1,
            "cluster_n": 1,
            "raster_m": 8,
            "swap_ab": True,
            "split_k": 2,
            "us": 9.0,
        }
    ]
    table = Table(family.name, ARCH, dict(HANDWRITTEN.data, shape_rows=rows), {"source": "t"})
    same = family.dispatch(GemmProblem(64, 4096, 4096), ARCH, table)
    assert same.key.split_k == 2 and "wave" not in same.reason
    assert family.dispatch(GemmProblem(64, 4224, 4096), ARCH, table).key.split_k == 2  # 132
    spill = family.dispatch(GemmProblem(64, 4608, 3584), ARCH, table)
    assert spill.key.split_k == 1 and "split-K 1 keeps N=4608 in 1 wave(s)" in spill.reason


def test_a_borrowed_split_keeps_sixteen_k_tiles_per_cta():
    """M 128-256 on shapes nobody tuned: the tuned tactic borrowed from another shape splits K
    only while every CTA keeps 16 k-tiles (the shipped tables' rows split 2048-long K in 4,
    8 k-tiles each, which ran at 0.58x cuBLAS on the H200); a tuned shape's own split stays."""
    split_rows = [
        r
        for r in family.default_table(ARCH).data["shape_rows"]
        if r.get("split_k", 1) > 1 and r["m"] == [65, 128]
    ]
    assert split_rows  # the borrowed candidates include split tactics
    for m in (128, 256):
        for n, k in ((2048, 2048), (3072, 1536), (2560, 2048), (768, 4096)):
            assert (n, k) not in DEFAULT_SHAPES
            key = family.dispatch(GemmProblem(m, n, k), ARCH).key
            assert key.split_k == 1 or (k // 64) // key.split_k >= 16, (m, n, k, key.describe())
    own = split_rows[0]
    key = family.dispatch(GemmProblem(128, own["n"], own["k"]), ARCH).key
    assert key.split_k == own["split_k"]


def test_untuned_mid_m_takes_the_tuned_tactic_with_the_least_cost_at_its_waves():
    """Two tactics won at N=4096 (M 65..128), each in one wave: 128 x 256 in 10 us, 128 x 128 in
    9 us. Scaled to another N by whole waves x tile elements, 128 x 128 wins where both still
    fit one wave (N = 16896: 66 vs 132 tiles) and loses where it needs a second (N = 17408: 68
    vs 136 tiles)."""

    def row(tile_n, us):
        return {
            "n": 4096,
            "k": 4096,
            "m": [65, 128],
            "tile_m": 128,
            "tile_n": tile_n,
            "cluster_m": 1,
            "cluster_n": 1,
            "raster_m": 8,
            "us": us,
        }

    data = dict(HANDWRITTEN.data, shape_rows=[row(256, 10.0), row(128, 9.0)])
    table = Table("gemm_sm90", ARCH, data, {"source": "test"})
    for n, tile_n in ((16896, 128), (17408, 256)):
        dispatch = family.dispatch(GemmProblem(128, n, 4096), ARCH, table)
        assert dispatch.key.tile_n == tile_n, dispatch.reason
        assert "least measured cost of the tuned rows" in dispatch.reason


def test_enumeration_is_small_and_covers_dispatch():
    """Sizes are symbolic: a bundle holds tactics, not shapes (at most 2 per tuned tactic)."""
    keys = family.enumerate_keys(ARCH)
    tactics = {dataclasses.replace(key, has_bias=True) for key in keys}
    assert len(keys) <= 2 * len(tactics)
    assert set(keys) <= set(family.tactic_space(ARCH))
    asked = {family.dispatch(p, ARCH).key for s in DEFAULT_SHAPES for p in family.problems(s)}
    assert asked == set(keys)
    # The hand-written rule: 4 swap widths and the 128-wide tile, each with K splits 1..8; the
    # 128-wide tile in a 2x1 cluster too, and 128 x 256 in one; each with and without bias.
    handwritten = family.enumerate_keys(ARCH, table=HANDWRITTEN)
    tactics = {(k.swap_ab, k.tile_n, k.cluster_m, k.split_k) for k in handwritten}
    splits = (1, 2, 4, 8)
    swapped = {(True, width, 1, split) for width in (8, 16, 32, 64) for split in splits}
    tiles = {(False, 128, 1, split) for split in splits} | {(False, 128, 2, 1), (False, 256, 2, 1)}
    assert tactics == swapped | tiles
    assert len(handwritten) == 2 * len(tactics) == 44


@pytest.mark.parametrize("fam", [family, fp8_family], ids=["bf16", "fp8"])
def test_any_m_asks_for_a_key_that_its_buckets_enumerate(fam):
    """What is built is what is asked: a build enumerates each shape at M_BUCKETS, so every
    other M (2049 between buckets, 300 in the cost model's band, 20000 past the last) must
    dispatch to one of those keys, tuned shape or not, N % 8 or not, bias or not (the wave
    model once picked 64 x 256 tiles at M = 2049, N = 1000: 33 x 4 tiles, one whole wave)."""
    for n, k in ((4096, 4096), (576, 7168), (1000, 4096), (3000, 1008), (1001, 4096), (136, 80)):
        for has_bias in (False, True):
            built = {
                fam.dispatch(p, ARCH).key for p in fam.problems((n, k)) if p.has_bias == has_bias
            }
            for m in (*range(1, 600), *range(600, 20000, 97), 2049, 4097, 8193):
                key = fam.dispatch(GemmProblem(m, n, k, fam.dtype, has_bias), ARCH).key
                assert key in built, (m, n, k, has_bias, key.describe())


def test_the_default_table_is_the_one_aot_tune_measured():
    for fam in (family, fp8_family):
        table = fam.default_table(ARCH)
        assert table.provenance["source"] == "aot-tune" and "H200" in table.provenance["gpu"]
        rows = table.data["shape_rows"]
        assert {(r["n"], r["k"]) for r in rows} <= set(DEFAULT_SHAPES)
        for row in rows:  # each row serves its M range with the tactic that won
            for m in {row["m"][0], row["m"][1] or row["m"][0]}:
                key = fam.dispatch(GemmProblem(m, row["n"], row["k"], fam.dtype), ARCH).key
                assert (key.tile_m, key.tile_n, key.cluster_m, key.cluster_n, key.raster_m) == (
                    row["tile_m"],
                    row["tile_n"],
                    row["cluster_m"],
                    row["cluster_n"],
                    row["raster_m"],
                )


@pytest.mark.parametrize(
    ("fam", "problem", "message"),
    [
        (family, GemmProblem(16, 4096, 4100), "K % 8 == 0"),
        (fp8_family, GemmProblem(16, 4096, 4104, FP8_DTYPE), "K % 16 == 0"),
        (family, GemmProblem(16, 4096, 4096, FP8_DTYPE), "use gemm_sm90_fp8"),
        (fp8_family, GemmProblem(16, 4096, 4096, BF16_DTYPE), "use gemm_sm90)"),
        (family, GemmProblem(16, 4096, 4096, "float16"), "takes bfloat16"),
        (family, GemmProblem(0, 4096, 4096), "empty problem"),
    ],
)
def test_refusals_carry_the_reason(fam, problem, message):
    with pytest.raises(UnsupportedProblemError, match=re.escape(message)):
        fam.dispatch(problem, ARCH)


def test_refuses_other_architectures():
    with pytest.raises(UnsupportedProblemError, match="sm_90a"):
        family.dispatch(GemmProblem(16, 4096, 4096), "sm_100a")
    assert family.supports("sm_90a") and not family.supports("sm_100a")


# -- ABI and shapes ------------------------------------------------------------------------------
def test_abi():
    assert [(a.name, a.dtype, a.rank) for a in family.abi] == [
        ("x", "bfloat16", 2),
        ("w", "bfloat16", 2),
        ("bias", "bfloat16", 1),
        ("out", "bfloat16", 2),
    ]
    assert family.output.name == "out" and family.output.output
    assert [a.name for a in fp8_family.abi] == ["x", "w", "x_scale", "w_scale", "bias", "out"]
    assert [a.dtype for a in fp8_family.abi[2:4]] == ["float32", "float32"]
    problem = GemmProblem(5, 6144, 4096)
    assert family.input_shapes(problem) == ((5, 4096), (6144, 4096), (6144,))
    assert family.output_shape(problem) == (5, 6144)
    assert fp8_family.input_shapes(problem)[2:4] == ((1,), (1,))


def test_parse_shape_and_problem():
    assert family.parse_shape("6144,4096") == (6144, 4096)
    with pytest.raises(UnsupportedProblemError, match="K % 8"):
        family.parse_shape("6144,4095")
    assert family.parse_problem("7,6144,4096") == GemmProblem(7, 6144, 4096, BF16_DTYPE, True)
    assert family.parse_problem("7,6144,4096,0").has_bias is False
    assert fp8_family.parse_problem("7,6144,4096").dtype == FP8_DTYPE


def test_shapes_from_model_llama3_8b_and_qwen3_32b():
    llama = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    }
    assert family.shapes_from_model(llama) == [
        (6144, 4096),
        (4096, 4096),
        (28672, 4096),
        (4096, 14336),
    ]
    qwen = {
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
    }
    assert family.shapes_from_model(qwen) == [
        (10240, 5120),
        (5120, 8192),
        (51200, 5120),
        (5120, 25600),
    ]
    assert family.shapes_from_model({"model_type": "no-hidden-size"}) == []


def test_problem_and_reference_with_torch():
    torch = pytest.importorskip("torch")
    from cute_aot.artifacts.core.errors import InputError

    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    bias = torch.randn(32, dtype=torch.bfloat16)
    assert family.problem(x, w, bias) == GemmProblem(3, 32, 64, BF16_DTYPE, True)
    with pytest.raises(InputError, match="bias must be"):
        family.problem(x, w, bias[:5])
    out = family.reference(x, w, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 32)
    expected = (x.double() @ w.double().t() + bias.double()).bfloat16()
    torch.testing.assert_close(out, expected, atol=0.1, rtol=0.02)

    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    scales = torch.tensor([0.5]), torch.tensor([4.0])
    assert fp8_family.problem(x8, w8, *scales, bias).dtype == FP8_DTYPE
    out8 = fp8_family.reference(x8, w8, *scales, bias)
    expected8 = (2.0 * (x8.double() @ w8.double().t()) + bias.double()).bfloat16()
    torch.testing.assert_close(out8, expected8, atol=0.1, rtol=0.02)


# -- cross-compiled for sm_90a: the SASS is what the design note says ----------------------------
COMPILED = [  # what the shipped tables pick (the comments: at the time of writing)
    (family, GemmProblem(32, 6144, 4096), "HGMMA"),  # swap-AB 128 x 32
    (family, GemmProblem(4096, 28672, 4096), "HGMMA"),  # persistent 128 x 128, cluster 2x1
    (fp8_family, GemmProblem(4096, 6144, 4096, FP8_DTYPE), "QGMMA"),  # persistent 128 x 256
    (family, GemmProblem(4096, 1001, 4096), "HGMMA"),  # N % 8 != 0: 2-byte stores
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fam", "problem", "mma"),
    COMPILED,
    ids=["bf16-decode-swap-ab", "bf16-large-persistent", "fp8-large-persistent", "bf16-any-n"],
)
def test_cross_compiled_sass(fam, problem, mma, tmp_path, record_property):
    pytest.importorskip("cutlass")
    key = fam.dispatch(problem, ARCH).key
    compiled = importlib.import_module(fam.builder).compile(key, ARCH)
    obj = tmp_path / f"{key.symbol}.o"
    compiled.export_to_c(str(obj), function_name=key.symbol, export_only_tvm_ffi_symbols=True)
    symbols = subprocess.run(
        ["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True
    ).stdout
    assert f" T __tvm_ffi_{key.symbol}\n" in symbols
    if not HAS_TOOLS:
        pytest.skip(
            "cuobjdump / nvdisasm missing: SASS not inspected (pip install "
            "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
        )
    info = binary_info.inspect_object(obj)
    assert info is not None and info["sm"] == [90]
    (kernel,) = info["kernels"]
    opcodes = kernel["opcodes"]
    record_property("registers", kernel["registers"])
    assert kernel["local"] == 0 and kernel["stack"] == 0  # no spills
    # 4 wgmma k-steps per k-tile, unrolled once; a ping-pong warpgroup issues each 64-row atom
    assert opcodes.get(mma, 0) == 4 * (key.tile_m // 64 if key.pingpong else 1)
    assert opcodes.get("UTMALDG", 0) == 2  # one TMA load of x, one of w per k-tile
    per_thread = accumulators_per_thread(key.tile_m, key.tile_n, key.pingpong)  # per consumer
    if key.aligned_n:
        # The bias slice arrives by one cp.async per tile (LDGSTS) and is read from shared
        # memory (at most one LDS per pair of columns): no global load but fp8's two scales.
        assert key.has_bias and key.split_k == 1
        assert opcodes.get("LDGSTS", 0) == 1
        assert opcodes.get("LDG", 0) == (2 if key.dtype == FP8_DTYPE else 0)
        if stores_by_tma(key.tile_n, key.persistent, key.swap_ab):
            # stmatrix (8 bf16 per thread each) into a strip, one TMA store per strip
            assert opcodes.get("STG", 0) == 0 and opcodes.get("STSM", 0) == per_thread // 8
            strip_rows = 64 if key.pingpong else key.tile_m
            strips = key.tile_m // strip_rows * key.tile_n // strip_cols(key.tile_n)
            assert opcodes.get("UTMASTG", 0) == strips
            # bias pairs from sBias, and a few shared loads besides (fp8's ping-pong: 3)
            assert per_thread // 8 <= opcodes.get("LDS", 0) <= per_thread // 2 + 4
        else:  # staged through shared memory, stored 8 bf16 (16 bytes) at a time
            assert opcodes.get("STG", 0) == per_thread // 8
            staged_reads = per_thread // 8
            assert staged_reads < opcodes.get("LDS", 0) <= staged_reads + per_thread // 2
    else:
        assert opcodes.get("STG", 0) == per_thread
    assert kernel["registers"] <= 168


def test_ping_pong_tiles_are_persistent_and_fit_one_warpgroup():
    """Ping-pong: each of two warpgroups holds a whole tile, so 128 x 256 (256 accumulators
    per thread) is out and promotion fits only 64 x 128; each warpgroup stages its own tile."""
    for fam in (family, fp8_family):
        keys = [key for key in fam.tactic_space(ARCH) if key.pingpong]
        assert keys and all(key.persistent and not key.swap_ab for key in keys)
        tiles = {(key.tile_m, key.tile_n, key.promote) for key in keys}
        promoted = {(64, 128, True)} if fam is fp8_family else set()
        assert tiles == {(128, 128, False), (64, 256, False), (64, 128, False)} | promoted
    # Each warpgroup's two 64 x 32 TMA-store strips (8 KiB) and two bias slices leave room
    # for 6 stages of 32 KiB, as the cooperative persistent tile has.
    assert stages_for(BF16_DTYPE, 128, 128, persistent=True) == 6
    assert stages_for(BF16_DTYPE, 128, 128, persistent=True, pingpong=True) == 6
    key = GemmSm90Key(
        BF16_DTYPE, True, 128, 128, 1, 1, 6, True, 8, True, persistent=True, pingpong=True
    )
    assert tactic_refusal(key) is None and "ping-pong" in key.describe()
    walking = dataclasses.replace(key, persistent=False, stages=stages_for(BF16_DTYPE, 128, 128))
    assert "persistent grid" in tactic_refusal(walking)
    wide = dataclasses.replace(key, tile_n=256, stages=stages_for(BF16_DTYPE, 128, 256, True, True))
    assert "at most 128 accumulators" in tactic_refusal(wide)


def test_three_consumer_warpgroups_hold_at_most_96_accumulators_each():
    """192-row tiles (three consumer warpgroups at 152 registers): 192 x 128 and 192 x 192 are
    built, 192 x 256 (128 accumulators per thread) and promoted 192 x 128 are refused."""
    for fam in (family, fp8_family):
        tiles = {(key.tile_n, key.promote) for key in fam.tactic_space(ARCH) if key.tile_m == 192}
        assert tiles == {(128, False), (192, False)}
    assert stages_for(BF16_DTYPE, 192, 192) == 4  # 48 KiB per stage
    key = GemmSm90Key(BF16_DTYPE, True, 192, 256, 1, 1, stages_for(BF16_DTYPE, 192, 256), True)
    assert "at most 96 accumulators" in tactic_refusal(key)
    promoted = GemmSm90Key(
        FP8_DTYPE, True, 192, 128, 1, 1, stages_for(FP8_DTYPE, 192, 128), True, promote=True
    )
    assert "two accumulator sets" in tactic_refusal(promoted)


def _cross_compiled_kernel(key, tmp_path) -> dict:
    """Cross-compile a bf16 `key` for sm_90a and read its one kernel's resources and opcodes
    (skips where the SASS tools are missing)."""
    compiled = importlib.import_module(family.builder).compile(key, ARCH)
    obj = tmp_path / f"{key.symbol}.o"
    compiled.export_to_c(str(obj), function_name=key.symbol, export_only_tvm_ffi_symbols=True)
    if not HAS_TOOLS:
        pytest.skip("cuobjdump / nvdisasm missing: SASS not inspected")
    (kernel,) = binary_info.inspect_object(obj)["kernels"]
    return kernel


@pytest.mark.slow
def test_a_192_row_tile_fits_three_consumer_warpgroups_without_spilling(tmp_path):
    """192 x 192: each of three consumer warpgroups issues 4 wgmma of 64 x 192 per k-tile and
    writes its 96 values with 12 stmatrix into the six 192 x 32 strips that six TMA stores
    take out; nothing in local memory."""
    pytest.importorskip("cutlass")
    key = GemmSm90Key(
        BF16_DTYPE,
        True,
        192,
        192,
        2,
        1,
        stages_for(BF16_DTYPE, 192, 192, True),
        True,
        persistent=True,
    )
    kernel = _cross_compiled_kernel(key, tmp_path)
    opcodes = kernel["opcodes"]
    assert kernel["local"] == 0 and kernel["stack"] == 0
    assert opcodes.get("HGMMA", 0) == 4 and opcodes.get("UTMALDG", 0) == 2
    assert opcodes.get("STG", 0) == 0 and opcodes.get("STSM", 0) == 192 * 192 // 8 // (3 * 128)
    assert opcodes.get("UTMASTG", 0) == 192 // 32


@pytest.mark.slow
def test_ping_pong_warpgroups_take_turns_at_the_main_loop(tmp_path):
    """Ping-pong 128 x 128: one warpgroup issues both 64-row atoms (8 wgmma per k-tile), the
    turn is one named-barrier arrive and its sync; no spills at 128 accumulators per thread.
    The epilogue: eight 64 x 32 strips, each behind two barriers (stmatrix in, TMA store out)."""
    pytest.importorskip("cutlass")
    key = GemmSm90Key(
        BF16_DTYPE, True, 128, 128, 2, 1, 6, True, 8, True, persistent=True, pingpong=True
    )
    kernel = _cross_compiled_kernel(key, tmp_path)
    opcodes = kernel["opcodes"]
    assert kernel["local"] == 0 and kernel["stack"] == 0
    assert opcodes.get("HGMMA", 0) == 8 and opcodes.get("UTMALDG", 0) == 2
    # the bias barrier, 2 per strip, the turn's sync and arrive, and the CTA's own
    assert opcodes.get("BAR", 0) == 1 + 2 * 8 + 2 + 2
    assert opcodes.get("STG", 0) == 0 and opcodes.get("UTMASTG", 0) == 2 * 128 // 32


@pytest.mark.slow
def test_split_k_reduces_through_distributed_shared_memory(tmp_path):
    """Swap-AB 128 x 16, K split over a 1x1x4 cluster: each thread sums one 8-wide segment of
    its CTA's quarter of the tile from the four CTAs' shared memory (two 16-byte
    ld.shared::cluster per CTA: LD in SASS, no LDS) and stores it with one 16-byte STG; cluster
    barriers order the partials (UCGABAR)."""
    pytest.importorskip("cutlass")
    key = GemmSm90Key(
        BF16_DTYPE,
        True,
        128,
        16,
        1,
        1,
        stages_for(BF16_DTYPE, 128, 16),
        True,
        8,
        True,
        swap_ab=True,
        split_k=4,
    )
    kernel = _cross_compiled_kernel(key, tmp_path)
    opcodes = kernel["opcodes"]
    assert kernel["local"] == 0 and opcodes.get("HGMMA", 0) == 4
    assert (opcodes.get("LD", 0), opcodes.get("LDS", 0), opcodes.get("STG", 0)) == (8, 0, 1)
    assert opcodes.get("UCGABAR_ARV", 0) >= 2


@pytest.mark.slow
def test_a_wide_split_tile_sums_its_share_of_rows_from_every_peer(tmp_path):
    """128 x 144 split 4 ways: each CTA sums 32 of the tile's rows, 18 eight-wide segments per
    row over 256 consumer threads (3 rounds); per round two 16-byte ld.shared::cluster from
    each of the 4 CTAs and one 16-byte store, nothing in local memory."""
    pytest.importorskip("cutlass")
    key = GemmSm90Key(
        BF16_DTYPE, True, 128, 144, 1, 1, stages_for(BF16_DTYPE, 128, 144), True, 8, True, split_k=4
    )
    kernel = _cross_compiled_kernel(key, tmp_path)
    opcodes = kernel["opcodes"]
    assert kernel["local"] == 0 and opcodes.get("HGMMA", 0) == 4
    assert (opcodes.get("LD", 0), opcodes.get("STG", 0)) == (3 * 4 * 2, 3)
    assert opcodes.get("UCGABAR_ARV", 0) >= 2
