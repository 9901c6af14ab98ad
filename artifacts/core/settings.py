"""Every `CUTE_AOT_*` environment variable: read here, and only here, each time it is asked for.

One table (`SETTINGS`) names each variable, its default and what it does; `aot-cache env` prints
it and docs/settings.md is generated from it. Values are read on every call (a server may change
its environment, and tests do), which costs a dict lookup: the hot path never asks.

The variables are grouped by concern (CONCERNS: serving, caches, trust, capture), as
docs/settings.md lists them. This module sits in the lowest room (artifacts/core/), so that
every room reads its settings through it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import namedtuple
from pathlib import Path

from cute_aot.artifacts.core import cache_layout
from cute_aot.artifacts.core.errors import CuteAotError


# A namedtuple, not a dataclass: the startup hook imports this module in every process that sets
# an activating variable, and dataclasses (with inspect) would cost it several ms.
class Setting(namedtuple("Setting", "name default doc when_unset kind", defaults=(None, "text"))):
    """A CUTE_AOT_* variable: `default` is the value that applies when it is unset (None: no
    value; the reader below works one out, as `when_unset` says in words); `kind` is its type,
    read by that type's one parser (`value()`): "text" (as written), "flag" (the boolean
    grammar), or "choice:a,b,c" (one of those words)."""

    __slots__ = ()

    def raw(self) -> str | None:
        """The variable's value, None when it is unset or empty: an in-process override
        (`scope`) first, else the environment."""
        if self.name in _overrides:
            return _overrides[self.name] or None
        return _environ_get(self.name) or None

    def value(self):
        """The value as its kind reads it (the default where unset); an unknown value is a
        SettingError naming the variable and what it takes, never a silent default."""
        text = self.raw() or self.default or ""
        found = _parsed.get((self.name, text), _parsed)  # a served call asks for the mode
        if found is _parsed:
            found = self.parse(text)
            if len(_parsed) >= 256:  # a program writing ever new values
                _parsed.clear()
            _parsed[self.name, text] = found
        return found

    def parse(self, text: str, said_as: str | None = None):
        """`text` read by this setting's kind: the one grammar, for the environment and for an
        API that takes the same values (`set_mode`); an error names `said_as`, else the
        variable."""
        kind, _, choices = self.kind.partition(":")
        return _PARSERS[kind](said_as or self.name, text, choices)

    @property
    def unset_text(self) -> str:
        """What applies when unset, for people (`aot-cache env`; docs/settings.md has it in
        markdown)."""
        unset = self.when_unset or (self.default if self.default is not None else "none")
        return unset.replace("`", "")


class SettingError(CuteAotError):
    """A CUTE_AOT_* variable holds a value its kind does not take."""


BUNDLES = Setting(
    "CUTE_AOT_BUNDLES",
    None,
    "bundle files, folders or URLs (`s3://`, `https://`, any fsspec protocol), `:`-separated, "
    "loaded at the first op call before installed bundle wheels",
)
MODE = Setting(
    "CUTE_AOT_MODE",
    "auto",
    "`auto` (bundle, overlay, JIT, torch), `aot` (bundles only; a miss raises), `jit`",
    kind="choice:auto,aot,jit",
)
CACHE_DIR = Setting(
    "CUTE_AOT_CACHE_DIR",
    None,
    "per-user cache: verified libraries, JIT overlay, miss log, build cache (keep it 0700)",
    "`$XDG_CACHE_HOME/cute-aot`, else `~/.cache/cute-aot`",
)
MISS_LOG = Setting(
    "CUTE_AOT_MISS_LOG",
    None,
    "where servers record the kernels they had to compile: a file, or a folder or URL prefix "
    "(`s3://bucket/misses/`, any fsspec protocol) with one file per process",
    "`<cache dir>/misses.jsonl`",
)
HOST = Setting(
    "CUTE_AOT_HOST",
    None,
    "the name this process's miss file uses under a prefix",
    "the host name",
)
TRUSTED_KEYS = Setting(
    "CUTE_AOT_TRUSTED_KEYS",
    None,
    "ed25519 public keys (PEM files or folders, `:`-separated) bundles may be signed by",
)
REQUIRE_SIGNATURE = Setting(
    "CUTE_AOT_REQUIRE_SIGNATURE",
    "0",
    "`1`: load only bundles signed by a trusted key (a value that is no flag requires one too, "
    "said once: a typo must not turn it off)",
    kind="flag",
)
OVERLAY_KEY = Setting(
    "CUTE_AOT_OVERLAY_KEY",
    None,
    "private key that signs JIT results in the overlay cache",
    "`<cache dir>/keys/overlay.pem`",
)
REVERIFY = Setting(
    "CUTE_AOT_REVERIFY",
    "0",
    "`1`: verify every bundle's library in full at every load (audits)",
    kind="flag",
)
REMOTE_UNSIGNED = Setting(
    "CUTE_AOT_REMOTE_UNSIGNED",
    "0",
    "`1`: accept unsigned bundles from URLs (remote bundles must otherwise be signed by a "
    "trusted key)",
    kind="flag",
)
RECORD = Setting(
    "CUTE_AOT_RECORD",
    None,
    "a file, a folder or a URL prefix (`s3://bucket/records/`; a folder or prefix gets one file "
    "per process): every distinct `cute.compile` call of every process is recorded there, for "
    "`aot-build --from-record` (activates the startup hook)",
)
INTERCEPT = Setting(
    "CUTE_AOT_INTERCEPT",
    "0",
    "`1`: `cute.compile` serves recorded kernels from the bundles, by `CUTE_AOT_MODE` "
    "(activates the startup hook)",
    kind="flag",
)
REPORT = Setting(
    "CUTE_AOT_REPORT",
    None,
    "a JSON file: at exit each process adds its `cute.compile` compiles, hits and misses per "
    "target and per family (activates the startup hook)",
)
VIRTUAL = Setting(
    "CUTE_AOT_VIRTUAL",
    None,
    "a GPU profile (`h200`, `b200`, ...), an architecture (`sm_100a`: its reference profile) or "
    "a JSON file of overrides: the process becomes a virtual GPU of that profile that records "
    "with none present (fake CUDA tensors, stub launches; activates the startup hook)",
)
DISABLE = Setting(
    "CUTE_AOT_DISABLE",
    "0",
    "`1`: the startup hook does nothing in this process and the ones it starts (cute-aot's own "
    "tools set it for their workers)",
    kind="flag",
)

# Every setting, by concern, in the order docs/settings.md and `aot-cache env` list them.
CONCERNS: dict[str, tuple[Setting, ...]] = {
    "Serving: which kernels a server loads, and what a miss does": (BUNDLES, MODE, MISS_LOG, HOST),
    "Caches": (CACHE_DIR,),
    "Trust: which bundles and cached libraries are loaded": (
        TRUSTED_KEYS,
        REQUIRE_SIGNATURE,
        REMOTE_UNSIGNED,
        OVERLAY_KEY,
        REVERIFY,
    ),
    "Capture: what the startup hook does in every process": (
        RECORD,
        INTERCEPT,
        REPORT,
        VIRTUAL,
        DISABLE,
    ),
}
SETTINGS: tuple[Setting, ...] = tuple(s for group in CONCERNS.values() for s in group)
_BY_NAME = {setting.name: setting for setting in SETTINGS}  # made once: read per call
# What the startup hook (runtime/capture/activation.py) installs the cute.compile hook for.
ACTIVATING: tuple[Setting, ...] = (RECORD, INTERCEPT, REPORT, VIRTUAL)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*\Z")
_URL_HOST = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]*\Z")
_PORT_REST = re.compile(r"^[0-9]+(?:/|\Z)")
# In-process values that win over the environment (name -> value; "" or None: unset), for code
# and tests that set a setting for this process only: a child process sees the environment.
_overrides: dict[str, str | None] = {}
# (name, text) -> its value as read: parsing a flag or a choice costs more than the lookup.
_parsed: dict[tuple[str, str], object] = {}


def _environ_reader():
    """`os.environ.get`, without the exception `os.environ` raises inside for each unset name
    (a served call reads about ten variables, most of them unset): its own mapping, read by the
    encoded name. Changes through os.environ (monkeypatch, a server) show at once, as they do
    through os.environ.get, which stays the reader where that mapping is not what CPython's
    os module keeps."""
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    decode = getattr(os.environ, "decodevalue", None)
    if not isinstance(data, dict) or encode is None or decode is None:
        return os.environ.get
    keys: dict[str, object] = {}  # name -> its key in that mapping

    def get(name: str) -> str | None:
        key = keys.get(name)
        if key is None:
            key = keys[name] = encode(name)
        value = data.get(key)
        return None if value is None else decode(value)

    return get


_environ_get = _environ_reader()


def _as_flag(name: str, text: str, _choices: str) -> bool:
    """The one boolean grammar: 1/true/yes/on, 0/false/no/off (or unset)."""
    value = text.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise SettingError(f"{name}={text!r} is not a flag: use 1, true, yes, on or 0, false, no, off")


def _as_choice(name: str, text: str, choices: str) -> str:
    """The one grammar of a choice: one of its words, in any case, spaces around ignored."""
    words = choices.split(",")
    value = text.strip().lower()
    if value in words:
        return value
    raise SettingError(f"{name}={text!r}: choose one of {', '.join(words)}")


def _as_text(_name: str, text: str, _choices: str) -> str | None:
    return text or None


_PARSERS = {"text": _as_text, "flag": _as_flag, "choice": _as_choice}


@contextlib.contextmanager
def scope(**values: str | None):
    """Settings for this process while the block runs (`scope(CUTE_AOT_MODE="aot")`; None:
    unset), whatever the environment says; as before afterwards. Child processes see only the
    environment."""
    _known_names(values)
    saved = dict(_overrides)
    _overrides.update(values)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def _known_names(names) -> None:
    unknown = sorted(set(names) - {setting.name for setting in SETTINGS})
    if unknown:
        raise SettingError(f"no such setting: {', '.join(unknown)}")


def set_in_process(name: str, value: str | None) -> None:
    """Set a setting for this process until set again (None: back to the environment), as an
    API like `set_mode` does; `scope` inside it still sees and restores it. Child processes see
    only the environment."""
    _known_names([name])
    if value is None:
        _overrides.pop(name, None)
    else:
        _overrides[name] = value


def markdown_table() -> str:
    """The settings, one table per concern (docs/gen_settings.py writes it to docs/settings.md)."""
    lines = []
    for concern, group in CONCERNS.items():
        lines += [f"## {concern}", "", "| variable | default | what it does |", "|---|---|---|"]
        for setting in group:
            unset = setting.when_unset
            default = unset or (f"`{setting.default}`" if setting.default else "(none)")
            lines.append(f"| `{setting.name}` | {default} | {setting.doc} |")
        lines.append("")
    return "\n".join(lines)


def bundle_sources() -> list[str]:
    """CUTE_AOT_BUNDLES: files, folders or URLs, separated like PATH. A URL's own ':'s do not
    separate: a bare scheme (`s3`) joins the `//...` after it, a URL cut at its host the port."""
    joined: list[str] = []
    for part in (BUNDLES.raw() or "").split(os.pathsep):
        last = joined[-1] if joined else ""
        if (part.startswith("//") and _SCHEME.match(last)) or (
            _URL_HOST.match(last) and _PORT_REST.match(part)
        ):
            joined[-1] = last + os.pathsep + part
        else:
            joined.append(part)
    return [part for part in joined if part]


def mode_name() -> str:
    """CUTE_AOT_MODE, read by its grammar (runtime/mode.py makes it a Mode), its default when
    unset."""
    return MODE.value()


def cache_dir() -> Path:
    """$CUTE_AOT_CACHE_DIR, else $XDG_CACHE_HOME/cute-aot, else ~/.cache/cute-aot."""
    explicit = CACHE_DIR.raw()
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cute-aot"


def miss_log() -> str:
    """As written (a trailing '/' or a URL means a prefix, which a Path would lose)."""
    return MISS_LOG.raw() or str(cache_dir() / cache_layout.MISS_LOG)


def host_name() -> str:
    import socket  # on first use: the startup hook imports this module in every process

    return HOST.raw() or socket.gethostname()


def trusted_keys_spec() -> str:
    return TRUSTED_KEYS.raw() or ""


def signature_required() -> bool:
    """Anything but unset, '', 0, false, no or off requires one: it fails closed (a typo must
    not turn it off), said once naming the variable."""
    try:
        return REQUIRE_SIGNATURE.value()
    except SettingError as exc:
        import warnings

        warnings.warn(f"cute-aot: {exc}; requiring signatures", RuntimeWarning, stacklevel=2)
        return True


def overlay_key() -> Path:
    return Path(OVERLAY_KEY.raw() or cache_dir() / cache_layout.KEYS / "overlay.pem")


def reverify() -> bool:
    return REVERIFY.value()


def remote_unsigned() -> bool:
    return REMOTE_UNSIGNED.value()


def record_location() -> str | None:
    """As written: a file, a folder (a trailing '/' or an existing folder) or a URL prefix."""
    return RECORD.raw()


def report_file() -> Path | None:
    raw = REPORT.raw()
    return Path(raw) if raw else None


def virtual_profile() -> str | None:
    """CUTE_AOT_VIRTUAL as written: a profile name, an architecture, or an override file."""
    return VIRTUAL.raw()


def disabled() -> bool:
    return DISABLE.value()


@contextlib.contextmanager
def tool_process():
    """cute-aot's own tools (aot-build, aot-tune) run inside: CUTE_AOT_DISABLE=1, so that the
    startup hook and the cute.compile hook stand aside in this process and in every process it
    starts (compile workers inherit the environment); as before once the block ends."""
    saved = os.environ.get(DISABLE.name)
    os.environ[DISABLE.name] = "1"
    try:
        with scope(**{DISABLE.name: "1"}):  # an in-process override must not undo it here
            yield
    finally:
        if saved is None:
            os.environ.pop(DISABLE.name, None)
        else:
            os.environ[DISABLE.name] = saved


def activating() -> list[str]:
    """The set variables that ask for the cute.compile hook (empty: the hook stays out)."""
    return [
        setting.name
        for setting in ACTIVATING
        if setting.raw() and (setting is not INTERCEPT or intercept())
    ]


def intercept() -> bool:
    return INTERCEPT.value()


# -- variables of other programs that cute-aot reads (here too, so that no module reads the
#    environment on its own) --------------------------------------------------------------------
def c_compiler() -> str | None:
    """The C compiler that links bundles: $CC, else gcc, else cc on PATH."""
    import shutil

    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def cuda_home() -> str | None:
    """The CUDA toolkit folder ($CUDA_HOME, else $CUDA_PATH), where cuobjdump and nvdisasm are
    looked for last."""
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")


def library_path() -> list[str]:
    """$LD_LIBRARY_PATH's folders, in order."""
    return [part for part in os.environ.get("LD_LIBRARY_PATH", "").split(":") if part]


def terminal_columns() -> str | None:
    """$COLUMNS, where the user fixed the width tools print at."""
    return os.environ.get("COLUMNS") or None


def environment(names) -> dict[str, str]:
    """name -> value of each of `names` that is set and not empty (the DSL's code-changing
    variables a record keeps; what `aot-cache env` shows). A setting's value is its reader's,
    an in-process override (`scope`) included."""
    found = {}
    for name in names:
        setting = _BY_NAME.get(name)
        value = setting.raw() if setting is not None else _environ_get(name)
        if value:
            found[name] = value
    return found


def workload_environment(**values: str) -> dict[str, str]:
    """The environment of a program cute-aot runs as a workload (`aot-build record`): this
    process's, without its CUTE_AOT_* variables (a tool's CUTE_AOT_DISABLE above all), with the
    cache dir and host this process uses, and `values` (CUTE_AOT_VIRTUAL=..., ...)."""
    _known_names(values)
    env = {name: value for name, value in os.environ.items() if not name.startswith("CUTE_AOT_")}
    for setting in (CACHE_DIR, HOST):
        if setting.raw() is not None:
            env[setting.name] = setting.raw()
    env.update(values)
    return env


def current() -> dict[str, str | None]:
    """name -> value as set (None: unset), for `aot-cache env`."""
    return {setting.name: setting.raw() for setting in SETTINGS}
