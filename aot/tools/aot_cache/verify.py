"""`aot-cache verify`: every hash, the schema, keys, exports and fit with this machine."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from cute_aot.aot.tools.aot_cache.facts import check
from cute_aot.aot.tools.aot_cache.facts.inventory import (
    bundle_sources,
    no_bundles_found,
)
from cute_aot.aot.tools.aot_cache.output import (
    STATUS_STYLES,
    emit_json,
    json_option,
    make_console,
    make_table,
)
from cute_aot.aot.tools.aot_cache.params import (
    arch_param,
)
from cute_aot.artifacts.core.errors import CuteAotError


@click.command("verify")
@click.argument("bundle_paths", metavar="[PATHS]...", nargs=-1)
@click.option(
    "--gpu-arch",
    callback=arch_param,
    help="Check against this GPU architecture instead of the local GPU (e.g. sm_90a).",
)
@json_option
def verify_command(bundle_paths, gpu_arch, as_json):
    """Every hash, the manifest schema, keys, exports, and fit with this machine.

    Per bundle: container and every sha256 (manifest, payload, library); key ids and symbols;
    exported functions; each kernel's fatbin by sha256 and SM; GPU architecture; tvm-ffi ABI; CUDA
    driver against the linked runtime; kernel sources against the installed cute-aot. Exit status
    1 on any failure, or when a GPU is present and no bundle fits it.
    """
    sources = bundle_sources(bundle_paths)
    if not sources:
        # One line, as `ls` gives it; a failure here: a check of nothing passes nothing.
        raise CuteAotError(
            f"nothing to verify: {no_bundles_found(bundle_paths, 'aot-cache verify bundles/')}"
        )
    gpu = None if gpu_arch else check.local_gpu()
    target = gpu_arch or (gpu or {}).get("arch")
    driver = check.driver_cuda_version()
    reports = [
        check.verify_bundle(path, from_folder, target, gpu, driver)
        for path, _, from_folder in sources
    ]
    failures = [
        f"{r['path']}: {c['check']}: {c['detail']}"
        for r in reports
        for c in r["checks"]
        if c["status"] == "fail"
    ]
    if target and not failures and not any(r["usable"] for r in reports):
        failures.append(f"no bundle for this GPU's architecture {target} ({len(reports)} checked)")
    result = {
        "ok": not failures,
        "gpu_arch": target,
        "gpu": gpu,
        "driver_cuda": ".".join(map(str, driver)) if driver else None,
        "bundles": reports,
        "failures": failures,
    }
    if as_json:
        emit_json(result)
    else:
        table = make_table("aot-cache verify", "bundle", "check", "result", "detail")
        for report in reports:
            for index, item in enumerate(report["checks"]):
                status = Text(item["status"], style=STATUS_STYLES[item["status"]])
                first = report["path"] if index == 0 else ""
                table.add_row(first, item["check"], status, item["detail"])
        make_console().print(table)
    for line in failures:
        click.echo(f"aot-cache verify: FAILED {line}", err=True)
    if failures:
        sys.exit(1)
    if not as_json:
        make_console().print(Text(f"{len(reports)} bundle(s) verified", style="green"))
