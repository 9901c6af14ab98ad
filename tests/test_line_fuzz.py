"""Fuzz: any JSON value at any field of a record line or a miss-log line (or the field left out).
Every reader (`aot-build --from-record`'s and `--from-misses`'s planning, `aot-cache misses`,
`aot-cache records`) plans or lists it, or skips it with a warning; the only exception it may
raise is the project's own (CuteAotError, one line on the command line), never a traceback.

The build's planning is called directly (what `aot-build` reads, then hands to the compiler):
compiling each example would make the test minutes long and fuzz the compiler, not the reader."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cute_aot.aot.planning import plan_from_misses, plan_from_record
from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from cute_aot.artifacts.core.errors import CuteAotError
from tests.test_line_schemas import GOOD_MISS, GOOD_RECORD

# Modest: each example writes a file and runs its readers (a few ms each on a 2-core machine).
EXAMPLES = 300
LEFT_OUT = object()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _field_paths(line: dict) -> list[tuple[str, ...]]:
    """Every field of `line` and of its key, and one it does not have."""
    return [(name,) for name in line] + [("key", name) for name in line["key"]] + [("extra",)]


def _mutated(line: dict, path: tuple[str, ...], value) -> dict:
    changed = json.loads(json.dumps(line))
    *parents, name = path
    holder = changed
    for parent in parents:
        holder = holder[parent]
    if value is LEFT_OUT:
        holder.pop(name, None)
    else:
        holder[name] = value
    return changed


def _lines(good: dict):
    """A file's lines: one mutated line, alone or before the good one."""
    mutated = st.builds(
        _mutated,
        st.just(good),
        st.sampled_from(_field_paths(good)),
        json_values | st.just(LEFT_OUT),
    )
    return st.tuples(mutated, st.booleans()).map(
        lambda found: [found[0], good] if found[1] else [found[0]]
    )


class KeptNotes:
    """planning.Notes kept in lists (what aot-build's console would show)."""

    def __init__(self):
        self.said: list[str] = []

    def note(self, text: str) -> None:
        self.said.append(text)

    warning = note

    def not_built(self, calls) -> None:
        self.said += [" ".join(map(str, call)) for call in calls]


def _reads_or_says(read) -> None:
    """`read()` returns, or raises the project's own error; warnings are what it may say."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            read()
        except CuteAotError:
            pass


def _cli_answers(*args: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = CliRunner().invoke(aot_cache, list(args))
    assert result.exit_code in (0, 1), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )


def _write(folder: Path, name: str, lines: list[dict]) -> Path:
    path = folder / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


# each example writes a file under tmp_path: the fixture is shared on purpose
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(lines=_lines(GOOD_RECORD))
def test_any_value_at_any_record_field_is_built_or_skipped(tmp_path, lines):
    record = _write(tmp_path, "calls.jsonl", lines)
    _reads_or_says(lambda: plan_from_record(str(record), [], KeptNotes()))
    _reads_or_says(lambda: plan_from_record(str(record), ["sm_100a"], KeptNotes()))
    _cli_answers("records", str(record), str(record), "--json")


@FUZZ
@given(lines=_lines(GOOD_MISS))
def test_any_value_at_any_miss_field_is_built_listed_or_skipped(tmp_path, lines):
    log = _write(tmp_path, "misses.jsonl", lines)
    _reads_or_says(lambda: plan_from_misses(str(log), [], [], KeptNotes()))
    _cli_answers("misses", "--log", str(log))
    _cli_answers("misses", "--log", str(log), "--json")
