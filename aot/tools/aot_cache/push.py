"""`aot-cache push`: upload verified bundles to a folder or prefix URL."""

from __future__ import annotations

import click
from rich.text import Text

from cute_aot.aot.tools.aot_cache.output import (
    Failure,
    emit_json,
    json_option,
    make_console,
    make_table,
    size_text,
)
from cute_aot.artifacts.core import settings


@click.command("push")
@click.argument("bundle_paths", metavar="BUNDLES...", nargs=-1, required=True)
@click.argument("url")
@json_option
def push_command(bundle_paths, url, as_json):
    """Upload bundle files or folders to a folder or prefix URL (s3://bucket/bundles/, any
    fsspec protocol), each verified first. Servers load them with CUTE_AOT_BUNDLES=URL."""
    from cute_aot.runtime import remote

    try:
        pushed = remote.push(list(bundle_paths), url)
    except OSError as exc:
        raise Failure(f"{exc.filename or url}: {exc.strerror or exc}") from None
    if as_json:
        emit_json({"url": url, "pushed": [vars(item) for item in pushed]})
        return
    table = make_table(f"pushed to {url}", "bundle", "size", "sha256", "signed", right=("size",))
    for item in pushed:
        signed = Text("yes", style="green") if item.signed else Text("no", style="yellow")
        table.add_row(item.url, size_text(item.size), item.sha256, signed)
    make_console().print(table)
    if not all(item.signed for item in pushed):
        click.echo(
            "aot-cache push: unsigned bundles are refused from URLs unless servers set "
            f"{settings.REMOTE_UNSIGNED.name}=1 (sign with aot-build --sign-key)",
            err=True,
        )
