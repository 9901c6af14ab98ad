"""A test module of a project that knows nothing of cute-aot, run under pytest-xdist by
tests/test_activation.py (named so that the project's own suite does not collect it)."""

import json
import os

import pytest

from tests.user_kernels.plain_program import compile_block


@pytest.mark.parametrize("block", [32, 64, 128, 256])
def test_compile(block):
    result = compile_block(block)
    with open(os.environ["WORKLOAD_OUT"], "a") as out:
        out.write(json.dumps(result) + "\n")
