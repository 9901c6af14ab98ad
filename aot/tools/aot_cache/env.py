"""`aot-cache env`: versions, tools, paths, settings, GPU and serving mode."""

from __future__ import annotations

import click

from cute_aot.aot import binary_info
from cute_aot.aot.tools.aot_cache.facts.inventory import (
    environment,
)
from cute_aot.aot.tools.aot_cache.output import (
    emit_json,
    json_option,
    make_console,
    make_table,
    size_text,
)
from cute_aot.artifacts.core import cache_layout, settings


@click.command("env")
@json_option
def env_command(as_json):
    """Versions, tools, paths, environment variables, GPU and serving mode."""
    report = environment()
    if as_json:
        emit_json(report)
        return
    table = make_table("cute-aot environment", "", "", "", show_header=False)
    for name, version in report["versions"].items():
        table.add_row("version", name, str(version))
    for name, tool in report["tools"].items():
        missing = f"not found: pip install {binary_info.TOOL_DISTRIBUTIONS[name]}"
        table.add_row(
            "tool", name, f"{tool['path']} ({tool['version']})" if tool["path"] else missing
        )
    where = report["paths"]
    table.add_row("path", "cache dir", where["cache_dir"])
    for area in cache_layout.AREAS:
        if area.label:
            usage = where[area.name]
            table.add_row(
                "path",
                area.label,
                f"{usage['path']} ({usage['files']} files, {size_text(usage['bytes'])})",
            )
    log = where["miss_log"]
    state = {True: "", False: " (none yet)", None: " (a URL: not checked)"}[log["exists"]]
    table.add_row("path", "miss log", log["path"] + state)
    table.add_row(
        "path", "bundles", "\n".join(where["bundles"]) or f"none ({settings.BUNDLES.name} unset)"
    )
    defaults = {setting.name: setting.unset_text for setting in settings.SETTINGS}
    for name, value in report["env"].items():
        unset = f"(unset: {defaults[name]})" if name in defaults else "(unset)"
        table.add_row("env", name, unset if value is None else value)
    gpu = report["gpu"]
    if gpu:
        device = (
            f"{gpu['name']} (compute {gpu['capability']}, bundles {gpu['arch'] or 'none built'})"
        )
    table.add_row("gpu", "device", device if gpu else "none")
    driver = report["driver_cuda"]
    table.add_row("gpu", "driver", f"supports CUDA {driver}" if driver else "no CUDA driver")
    table.add_row("mode", "serving mode", f"{report['mode']} ({report['mode_source']})")
    jit = (
        "available (nvidia-cutlass-dsl installed)"
        if report["jit_available"]
        else "unavailable: auto falls back to torch"
    )
    table.add_row("mode", "JIT fallback", jit)
    hook = report["startup_hook"]
    table.add_row(
        "hook",
        "startup hook",
        hook["installed_at"] or "not in a site directory (see docs/recording.md: Activation)",
    )
    state = "active" if hook["active"] else "inactive"
    table.add_row("hook", "cute.compile hook", f"{state} in processes started here: {hook['why']}")
    make_console().print(table)
