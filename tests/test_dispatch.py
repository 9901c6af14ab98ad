import pytest

from cute_aot.artifacts.core.errors import UnsupportedProblemError
from cute_aot.kernels.router_gemm import (
    DEFAULT_SHAPES,
    default_table,
    dispatch,
    enumerate_keys,
    handwritten_table,
    problems,
    tuned_tables,
)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_103a"])
def test_small_m_or_short_k_goes_to_the_dot_product_kernel(arch):
    for m in range(1, 5):
        key = dispatch(m, 256, 7168, arch)
        assert key.backend == "dot" and key.m == m and key.k == 7168
        assert key.split_k == key.num_stages == 0
    short = dispatch(16, 256, 2040, arch)
    assert short.backend == "dot" and short.m == 16 and short.k == 2040


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_large_m_goes_to_split_k_with_symbolic_sizes(arch):
    key = dispatch(5, 128, 2048, arch, table=handwritten_table(arch))
    assert key.backend == "splitk" and key.m == key.k == key.block_size == 0
    assert (key.split_k, key.num_stages) == (6, 4)  # default tactic off-table


@pytest.mark.parametrize(
    "arch, m, n, k, expected",
    [
        # SM90 table
        ("sm_90a", 1, 256, 4096, ("dot", 256)),
        ("sm_90a", 2, 256, 4096, ("dot", 128)),
        ("sm_90a", 2, 384, 7168, ("dot", 256)),
        ("sm_90a", 6, 256, 4096, ("splitk", 8, 2)),
        ("sm_90a", 10, 256, 4096, ("splitk", 8, 5)),
        ("sm_90a", 8, 256, 7168, ("splitk", 6, 5)),
        ("sm_90a", 9, 256, 7168, ("splitk", 6, 4)),
        ("sm_90a", 11, 256, 6144, ("splitk", 8, 2)),
        ("sm_90a", 12, 384, 7168, ("splitk", 8, 2)),
        ("sm_90a", 16, 384, 7168, ("splitk", 7, 5)),
        # SM100 family table: sm_100a and sm_103a share it
        ("sm_100a", 3, 256, 6144, ("dot", 256)),
        ("sm_103a", 4, 256, 6144, ("dot", 256)),
        ("sm_100a", 2, 256, 6144, ("dot", 128)),
        ("sm_100a", 8, 256, 4096, ("splitk", 8, 5)),
        ("sm_103a", 9, 256, 4096, ("splitk", 8, 2)),
        ("sm_100a", 14, 256, 7168, ("splitk", 8, 2)),
        ("sm_100a", 13, 384, 7168, ("splitk", 7, 5)),
        ("sm_100a", 6, 256, 4096, ("splitk", 6, 4)),
    ],
)
def test_handwritten_tables(arch, m, n, k, expected):
    """tuned.json's rows (vLLM's tables, condensed), as they dispatch when given that table."""
    key = dispatch(m, n, k, arch, table=handwritten_table(arch))
    if expected[0] == "dot":
        assert (key.backend, key.block_size) == expected
    else:
        assert (key.backend, key.split_k, key.num_stages) == expected


def test_sm90a_dispatches_with_the_table_aot_tune_measured_on_an_h200():
    table = default_table("sm_90a")
    assert table.provenance["source"] == "aot-tune" and "H200" in table.provenance["gpu"]
    assert default_table("sm_100a") == handwritten_table("sm_100a")  # never tuned: no GPU here
    for row in table.data["rows"]:
        key = dispatch(row["m"][0], row["n"], row["k"], "sm_90a")
        assert key.backend == row["backend"]
        if key.backend == "dot":
            assert key.block_size == row["block_size"]
        else:
            assert (key.split_k, key.num_stages) == (row["split_k"], row["num_stages"])
        assert row["runner_up_us"] is not None, row  # every row was a contest
        assert row["us"] <= row["runner_up_us"], row  # the winner was the fastest


def test_pdl_follows_the_table_defaults():
    assert dispatch(1, 256, 4096, "sm_90a").pdl is bool(tuned_tables()["defaults"]["pdl"])


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 256, 4096), "1..16 tokens"),
        ((17, 256, 4096), "1..16 tokens"),
        ((4, 256, 4100), "K % 8"),
        ((4, 256, 0), "K % 8"),
        ((4, 0, 4096), "N >= 1"),
    ],
)
def test_problems_outside_the_family_are_refused(args, message):
    with pytest.raises(UnsupportedProblemError, match=message):
        dispatch(*args, "sm_90a")


def test_dtypes_are_part_of_the_problem():
    with pytest.raises(UnsupportedProblemError, match="float16"):
        dispatch(4, 256, 4096, "sm_90a", x_dtype="float16")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_103a"])
def test_enumeration_is_exactly_what_dispatch_serves(arch):
    keys = enumerate_keys(arch)
    served = {dispatch(m, n, k, arch) for m, n, k, *_ in problems(DEFAULT_SHAPES)}
    assert set(keys) == served
    assert len(keys) == len(set(keys))
    assert len({key.symbol for key in keys}) == len(keys)
    assert keys == sorted(keys, key=lambda key: key.canonical_json())  # deterministic order


def test_enumeration_covers_extra_shapes():
    base = set(enumerate_keys("sm_90a"))
    more = set(enumerate_keys("sm_90a", list(DEFAULT_SHAPES) + [(128, 2880)]))
    assert base < more
    assert all(key.k == 2880 for key in more - base if key.backend == "dot")
