"""`aot-cache`: see, explain and verify what is shipped, without reading code.

    aot-cache ls | show | verify | explain | diff | records | misses | gc | env | sass | push |
    pull

Every command prints rich tables, or JSON with --json. Nothing here imports cutlass or loads a
bundle's library: manifests are read as data, libraries as bytes (verify, sass), GPU code with
NVIDIA's cuobjdump/nvdisasm. Generic over kernel families: each is asked, through its contract,
how it reads a problem and why it dispatches as it does. This module is the group; each command
parses and presents in its own module (commands/), with the shared renderers of output.py; the
facts come from inventory, check, explain and gc.
"""

from __future__ import annotations

import click

from cute_aot.aot.tools.aot_cache import (
    diff,
    env,
    explain,
    gc,
    ls,
    misses,
    pull,
    push,
    records,
    sass,
    show,
    verify,
)
from cute_aot.aot.tools.aot_cache.output import Failure
from cute_aot.aot.tools.aot_cache.params import parse_age, parse_size
from cute_aot.artifacts import PACKAGE_VERSION
from cute_aot.artifacts.core.errors import CuteAotError

# parse_size and parse_age are part of this module's interface (scripts and tests use them here).
__all__ = ["main", "parse_age", "parse_size"]


class _Group(click.Group):
    """Every CuteAotError becomes one precise line on stderr and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CuteAotError as exc:
            raise Failure(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(PACKAGE_VERSION, prog_name="aot-cache")
def main():
    """See, explain and verify cute-aot bundles, the overlay cache and the miss log.

    Commands that take bundle PATHS (files or folders) fall back to CUTE_AOT_BUNDLES.
    """


for _command in (
    ls.ls_command,
    show.show_command,
    verify.verify_command,
    explain.explain_command,
    diff.diff_command,
    records.records_command,
    misses.misses_command,
    gc.gc_command,
    env.env_command,
    sass.sass_command,
    push.push_command,
    pull.pull_command,
):
    main.add_command(_command)

if __name__ == "__main__":
    main()
