"""Kernels recorded at `cute.compile`: any CuTe DSL kernel, served with no family to write.

A record (runtime/capture/record.py writes them in a real run) describes one `cute.compile` call as
data: what is compiled, the source hash of the code that shapes it, every argument's type, the
compile options. That description is this family's key, so the build replays the call on a CPU
(`aot-build --from-record FILE`, the builder `replay.py`) and the interceptor
(runtime/compile_hook.py) derives the same key from a live call, without tracing, to serve it.

A key has two parts. `call` is what the caller compiled (what changes the binary, as far as
the call says). `replay` is what the build needs besides it: example values for the dynamic
parts (the shape a recorded tensor had, a stream handle) and the hardware queries the trace
made, with the answers of the GPU that recorded them (pinned at build time). Those answers
change the binary too, so they are part of the id: the same call recorded on GPUs that answer
otherwise is two kernels, which one bundle can hold. A server derives the call's own id
(`call_id`) without tracing; a kernel with answers serves only where the live GPU gives every
one of them (runtime/compile_hook.py asks it). A call whose trace asked nothing keeps the id it
always had.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # what canonical_json escapes strings with

from cute_aot.artifacts.core.json_lines import Field, LineSchema, exactly, read_lines
from cute_aot.artifacts.digest import KEY_ID_LENGTH, canonical_json, json_digest, text_digest
from cute_aot.kernels.arch import SUPPORTED_ARCHS
from cute_aot.kernels.contract import Adapter, KernelFamily, Patch
from cute_aot.kernels.keys import KernelKey

FAMILY = "cute_compile"
FAMILY_VERSION = 1
RECORD_FORMAT = 1


# A replay's canonical JSON (sorted keys: "hardware" is the last) ends so where its trace asked
# the GPU nothing.
_NO_ANSWERS = '"hardware":{}}'
_FAMILY_JSON = canonical_json(FAMILY)
_FIELDS = frozenset({"family", "call", "replay", "version"})  # a recorded key's, as written


# The one JSON spelling of record data (sorted keys, no spaces): artifacts/digest.py's.
canonical = canonical_json


def escaped_json(text: str) -> str:
    """`text` as the inside of a JSON string (canonical_json(text) less its quotes)."""
    return encode_basestring_ascii(text)[1:-1]


def call_id_of_escaped(escaped_call: str, version: int = FAMILY_VERSION) -> str:
    """The call id, json_digest({"family", "call", "version"}), from the call's JSON already
    escaped: canonical JSON written in place, keys in sorted order. A server's describer writes
    the escaped call from cached pieces (kernels/recorded/calls.py), which spares escaping 3 KB
    per served call, the costliest step of its id (a test keeps this equal to json_digest)."""
    text = f'{{"call":"{escaped_call}","family":{_FAMILY_JSON},"version":{version}}}'
    return text_digest(text, KEY_ID_LENGTH)


def asks_tvm_ffi(identity: dict) -> bool:
    """Whether the call compiled for TVM-FFI (the option, or CUTE_DSL_ENABLE_TVM_FFI set when
    it was made): what the caller then calls, so what the build exports and the hook returns."""
    env, options = identity.get("env"), identity.get("options")
    flag = env.get("CUTE_DSL_ENABLE_TVM_FFI", "") if isinstance(env, dict) else ""
    asked = options.get("EnableTVMFFI") if isinstance(options, dict) else False
    return bool(asked) or str(flag).lower() in ("1", "true")


@dataclass(frozen=True)
class RecordedCallKey(KernelKey):
    """One recorded `cute.compile` call. Its id covers `call` only (see the module docstring)."""

    FAMILY = FAMILY
    # Out of the id but for the hardware answers it holds (see `id`): example values do not
    # change the binary; the build cache keys on every field.
    REPLAY_ONLY = ("replay",)

    call: str  # canonical JSON: target, source hash, argument types, options
    replay: str = "{}"  # canonical JSON: {"examples": [...], "hardware": {query: value}}
    version: int = FAMILY_VERSION

    @functools.cached_property
    def id(self) -> str:
        """The call's id, and the hardware answers its trace used where it asked any."""
        if not self.hardware:
            return self.call_id
        identity = {
            "family": FAMILY,
            "call": self.call,
            "version": self.version,
            "hardware": self.hardware,
        }
        return json_digest(identity, length=KEY_ID_LENGTH)

    @functools.cached_property
    def call_id(self) -> str:
        """The id of the call alone: what a server derives from a live call, without tracing."""
        if type(self.call) is str and type(self.version) is int:
            return call_id_of_escaped(escaped_json(self.call), self.version)
        identity = {"family": FAMILY, "call": self.call, "version": self.version}
        return json_digest(identity, length=KEY_ID_LENGTH)

    @classmethod
    def from_fields(cls, fields: dict) -> RecordedCallKey:
        """KernelKey.from_fields, made directly where the fields are exactly a recorded key's
        (every entry a build writes: a served call's first use makes one); anything else goes
        the general way, which says what is wrong."""
        if fields.keys() == _FIELDS and fields["family"] == FAMILY:
            key = cls(fields["call"], fields["replay"], fields["version"])
        else:
            key = super().from_fields(fields)
        for name, kind in (("call", str), ("replay", str), ("version", int)):
            value = getattr(key, name)
            if type(value) is not kind:  # read as JSON text and a number: nothing else is a key
                raise TypeError(
                    f"key field {name!r} is {type(value).__name__}, not {kind.__name__}"
                )
        return key

    @functools.cached_property
    def call_data(self) -> dict:
        return json.loads(self.call)

    def of_call(self, call_id: str, call_data: dict) -> RecordedCallKey:
        """This key, told what a live call of the same `call` string worked out already (its
        id and data), instead of deriving them again from the 3 KB string: a served call's
        entry key. The caller has compared the strings."""
        known = vars(self)
        known.update(call_id=call_id, call_data=call_data)
        if self.replay.endswith(_NO_ANSWERS):  # no answers: its id is the call's (see `id`)
            known.update(hardware={}, id=call_id)
        return self

    @functools.cached_property
    def replay_data(self) -> dict:
        return json.loads(self.replay)

    @property
    def abi(self) -> str:
        """TVM-FFI where the caller asked for it, else the DSL's own C ABI. A `call` that is
        not a record's (no JSON object: nothing a build could replay) keeps the default."""
        try:
            call = self.call_data
        except ValueError:
            return "tvm_ffi"
        return "c" if isinstance(call, dict) and not asks_tvm_ffi(call) else "tvm_ffi"

    @functools.cached_property
    def hardware(self) -> dict:
        """The answers the trace got from the GPU ({} where the replay data holds none, or is
        not a record's)."""
        if self.replay.endswith(_NO_ANSWERS):  # nearly every kernel: no JSON to read
            return {}
        try:
            replay = self.replay_data
        except ValueError:
            return {}
        answers = replay.get("hardware") if isinstance(replay, dict) else None
        return answers if isinstance(answers, dict) else {}

    @property
    def target(self) -> str:
        target = self.call_data["target"]
        return target.get("function") or target.get("object", "?")

    def describe(self) -> str:
        settings = call_settings(self.call_data)
        return f"cute.compile of {self.target} ({len(self.call_data.get('args', []))} arguments" + (
            f"; {settings})" if settings else ")"
        )


def call_settings(call_data: dict, limit: int = 600) -> str:
    """The settings a call was compiled with, as a person names a configuration: the plain
    values (numbers, flags, enums, element types, None) of its arguments and of its kernel
    object's state, e.g. FA4's `tile_hdim=128, is_causal=True, pack_gqa=True, mCuSeqlensQ=None`.
    Tensors' layouts are left out: the key says them in full."""
    parts = []
    for name, value in call_data.get("args", []):
        state = value.get("state") if isinstance(value, dict) else None
        items = sorted(state.items()) if isinstance(state, dict) else [(name, value)]
        parts += [f"{field}={text}" for field, item in items if (text := _plain(item)) is not None]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(description) -> str | None:
    if not isinstance(description, dict):
        return None
    if description.get("py") in ("bool", "int", "float", "str", "NoneType"):
        return repr(description.get("value")) if description["py"] != "NoneType" else "None"
    if "enum" in description:
        return str(description.get("name"))
    return description.get("dsl_type")


class RecordedCalls(KernelFamily, Adapter):
    """The family of every recorded `cute.compile` call. It has no op and no default keys: its
    keys come from record files and miss logs, and it serves `cute.compile` itself."""

    name = FAMILY
    version = FAMILY_VERSION
    Key = RecordedCallKey
    # Whatever the recorded kernel supports: a key built for an architecture its code does not
    # support fails to compile, and the build says so with the key.
    archs = tuple(SUPPORTED_ARCHS)
    abi = ()  # each key's exported function has the signature of its own recorded call
    builder = "cute_aot.kernels.recorded.replay"
    # A recorded call's key holds its kernel's source hash, options, target and the DSL's
    # version: what identifies the builder is the description format (calls.py) and what the
    # replay (replay.py) makes of a description. Bump this when either changes for a call that
    # was describable before; new kinds of argument need no bump (no earlier key holds them).
    builder_version = "description format 1"
    # The import-walk hash of releases up to the one that introduced the version (it also
    # covered settings and cache-layout modules, so it moved with unrelated edits); they
    # described and replayed every call as format 1 does.
    earlier_source_hashes = frozenset(
        {"9c2b6e1210a70c8db211561e74eeb8f6dc0e67801f374480d2aa8d9bd4d5b53f"}
    )
    serves = "cutlass.cute.compile"

    def patches(self, serving) -> list[Patch]:
        """Nothing of another library to replace: the runtime's one hook on `cute.compile`
        (cute_aot.runtime.intercept()) asks this family's Serving while it is installed."""
        return []

    def describe_problem(self, problem) -> dict:
        return dict(problem) if isinstance(problem, dict) else {}


family = RecordedCalls()


def _replayable(record: dict) -> bool:
    return record.get("recreatable") is True


def _check_recorded_key(fields: dict) -> None:
    """A record's key: a RecordedCallKey's fields, its call and replay each a JSON object (what
    the build replays and the tools compare)."""
    key = RecordedCallKey.from_fields(fields)
    for name in ("call", "replay"):
        if not isinstance(json.loads(getattr(key, name)), dict):  # JSONDecodeError: ValueError
            raise ValueError(f"key field {name!r} is not a JSON object")


# What a record line holds, for every reader of records (read_records): runtime/capture/record.py
# writes them. A line of another shape (another format, a field of another type) is skipped
# with one warning naming its file, line and field.
RECORD_SCHEMA = LineSchema(
    "record",
    {
        "format": Field((int,), check=exactly(RECORD_FORMAT)),
        "family": Field((str,), check=exactly(FAMILY)),
        "recreatable": Field((bool,)),
        "key": Field((dict,), required=_replayable, check=_check_recorded_key),
        "key_id": Field((str,), required=False),
        "arch": Field((str, type(None)), required=False),
        "site": Field((str,), required=False),
        "target": Field((str,), required=False),
        "reason": Field((str, type(None)), required=False),
        "servable": Field((bool,), required=False),
        "tvm_ffi": Field((bool,), required=False),
    },
)


def read_records(source) -> list[tuple[str, dict]]:
    """(file, record) of every record in a record file, a folder or a URL prefix (one file per
    process: CUTE_AOT_RECORD), in file order; a torn last line (a writer killed mid-append) and
    lines of another shape (RECORD_SCHEMA) are skipped, each said."""
    return read_lines(source, RECORD_SCHEMA)


def hardware_answers(key: RecordedCallKey) -> str:
    """What a record's trace got from its GPU (the answers and the GPU that gave them), as one
    string: two records of one call that differ here were made on GPUs that answer otherwise."""
    replay = key.replay_data
    return canonical({"device": replay.get("device"), "hardware": replay.get("hardware") or {}})
