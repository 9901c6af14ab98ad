"""`aot-cache pull`: download and verify the bundles at a URL, as a server would."""

from __future__ import annotations

from pathlib import Path

import click

from cute_aot.aot.tools.aot_cache.output import (
    Failure,
    emit_json,
    json_option,
    make_console,
    make_table,
    size_text,
)


@click.command("pull")
@click.argument("url")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also copy the verified bundles into this folder, under their own names.",
)
@json_option
def pull_command(url, out_dir, as_json):
    """Download and verify the bundles at URL (a bundle, or a folder or prefix of them) into the
    download cache, as a server would; any refusal or an unreachable store is exit status 1."""
    from cute_aot.runtime import remote

    try:
        pulled = remote.pull(url, out_dir)
    except OSError as exc:
        raise Failure(f"{exc.filename or url}: {exc.strerror or exc}") from None
    rows = [{**vars(item), "path": str(item.path)} for item in pulled]
    if as_json:
        emit_json({"url": url, "pulled": rows})
        return
    table = make_table(f"pulled from {url}", "bundle", "size", "sha256", "path", right=("size",))
    for row in rows:
        table.add_row(row["url"], size_text(row["size"]), row["sha256"], row["path"])
    make_console().print(table)
