"""How `aot-cache` prints: one console, JSON, sizes, ages and tables shared by every command."""

from __future__ import annotations

import json
from collections.abc import Callable

import click
from rich.console import Console
from rich.table import Table

from cute_aot.artifacts import toolchain
from cute_aot.artifacts.core import terminal

STATUS_STYLES = {"ok": "green", "fail": "bold red", "skip": "dim", "warn": "yellow"}
SOURCE_STYLES = {"bundle": "green", "overlay": "cyan", "jit": "yellow", "error": "bold red"}


class Failure(click.ClickException):
    """A command's failure: one line on stderr, `aot-cache: <why>`, exit status 1."""

    def show(self, file=None) -> None:
        click.echo(f"aot-cache: {self.message}", err=True)


def make_console() -> Console:
    # No markup: paths, keys and SASS hold [brackets] that must print as they are.
    return terminal.console(markup=False)


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def json_option(command: Callable) -> Callable:
    flag = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
    return flag(command)


def size_text(n: int | None) -> str:
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def age_text(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f} {unit}"
    return f"{seconds:.0f} s"


def problem_words(problem: dict) -> str:
    """{"m": 2, "k": 7168} -> "M=2 K=7168": a problem's fields as operators read them."""
    return " ".join(f"{name.upper()}={value}" for name, value in problem.items())


def toolchain_text(chain: dict) -> str:
    dsl = (chain.get("cutlass_dsl") or {}).get(toolchain.CUTLASS_DSL_PREFIX, "?")
    return (
        f"cutlass-dsl {dsl}\ntvm-ffi {chain.get('tvm_ffi') or '?'}\n"
        f"cuda {chain.get('cuda_runtime_major') or '?'}"
    )


def make_table(title: str, *columns: str, right: tuple[str, ...] = (), **options) -> Table:
    made = Table(title=title, title_justify="left", **options)
    for column in columns:
        # fold: paths, hashes and kernel names must stay whole, never end in an ellipsis
        made.add_column(column, justify="right" if column in right else "left", overflow="fold")
    return made
