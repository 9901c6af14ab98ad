"""How cute-aot's tools print (aot-build, aot-cache, aot-tune): one console, made here.

On a terminal, the terminal's width. In a pipe or a CI log, where release pipelines read the
output, a width no line reaches: tables keep every path, key and reason whole on one row instead
of folding them into fragments at 80 columns (rich's width for a stream that is not a terminal).
COLUMNS, where set, still decides.
"""

from __future__ import annotations

import sys

from rich.console import Console

from cute_aot.artifacts.core import settings

PIPE_WIDTH = 10_000  # wider than any row a tool prints


def console(*, stderr: bool = False, markup: bool = True) -> Console:
    """A console on stdout (or stderr). markup=False for text that holds [brackets] (paths,
    keys, SASS) and must print as it is."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and not settings.terminal_columns()
    return Console(
        stderr=stderr,
        markup=markup,
        highlight=markup,
        soft_wrap=True,
        width=PIPE_WIDTH if piped else None,
    )
