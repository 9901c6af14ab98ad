"""`aot-cache sass`: one kernel's SASS, read from the bundle's library."""

from __future__ import annotations

from pathlib import Path

import click

from cute_aot.aot import binary_info
from cute_aot.aot.tools.aot_cache.facts.inventory import (
    describe_key,
    entry_fatbin,
    entry_matching,
)
from cute_aot.aot.tools.aot_cache.output import (
    emit_json,
    json_option,
)
from cute_aot.artifacts.bundle import read_bundle


@click.command("sass")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("key_id", metavar="KEY")
@click.option("--hex", "show_encoding", is_flag=True, help="Show instruction encodings too.")
@json_option
def sass_command(bundle, key_id, show_encoding, as_json):
    """One kernel's SASS (KEY: key id, unique prefix, or symbol), via cuobjdump and nvdisasm."""
    manifest, library = read_bundle(bundle)  # verified: the SASS shown is what would run
    entry = entry_matching(bundle, manifest, key_id)
    text = binary_info.disassemble(entry_fatbin(bundle, manifest, library, entry), show_encoding)
    describe = describe_key(entry.family, entry.key)
    if as_json:
        facts = {"path": str(bundle), "arch": manifest.arch, "key_id": entry.key_id}
        emit_json({**facts, "symbol": entry.symbol, "describe": describe, "sass": text})
        return
    click.echo(f"// {bundle} · {manifest.arch} · key {entry.key_id} · {entry.family}: {describe}")
    click.echo(text, nl=False)
