"""Recording `cute.compile` calls: every distinct call of a real run, written once to where
`aot-build --from-record` reads it and replays it on a CPU.

    from cute_aot.runtime.capture.record import recording
    with recording("calls.jsonl"):
        run_the_warm_up()                   # or: CUTE_AOT_RECORD=calls.jsonl, in every process

Records are JSON lines, one per distinct call. Each holds the recorded family's key
(kernels/recorded: what is compiled, its source hash, every argument's type, the options;
example values and the hardware answers a replay needs), the architecture, the call site, and
for a call that cannot be replayed the reason instead. Where they go:

- a file: every process appends to it, under a lock (artifacts/atomic.claimed), a call
  already in it not again
  (the one JSON-lines appender and reader: artifacts/core/json_lines.py);
- a folder (a trailing '/', or an existing folder): one file per process, appended to;
- a URL prefix (s3://bucket/records/, any fsspec protocol): one file per process, written in
  the background and at exit or SIGTERM (runtime/process_files.py).

A local record is on disk when the compile returns: a worker that is killed loses none. The
same call recorded on GPUs that answered its hardware queries otherwise is written once per
answer (each is a kernel of its own: the answers are part of its key id). Recording never
changes what the compile returns, and a failure to record is said, not raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from cute_aot.artifacts.core import settings, urls
from cute_aot.artifacts.core.atomic import claimed
from cute_aot.artifacts.core.json_lines import append_line, objects_after
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.kernels.recorded import FAMILY, RECORD_FORMAT, RecordedCallKey, hardware_answers
from cute_aot.kernels.recorded.calls import signature_mismatch
from cute_aot.runtime import compile_hook
from cute_aot.runtime.process_files import host, is_prefix, process_file

__all__ = ["Recorder", "recording"]

# An append holds the lock for milliseconds: one held longer belongs to a process that hangs or
# died on another machine, and is taken over; a wait past that loses the record, said once.
LOCK_STALE = 30.0
LOCK_WAIT = 60.0


class Recorder:
    """Writes records of distinct calls to a file, a folder or a URL prefix."""

    def __init__(self, location: str | os.PathLike):
        self.location = os.fspath(location)
        self.shared = not is_prefix(self.location)  # one file for every process
        self.path = Path(self.location) if self.shared else None
        self._written: set[str] = set()  # subjects written (by this process, or in the file)
        self._read_up_to = 0

    def add(self, call, why: str | None, queried: dict, compiled, site: str) -> None:
        try:
            record, subject = self._record(call, why, queried, compiled, site)
            self._append(record, subject)
        except Exception as exc:  # a record lost is said once; the compile result stands
            warn_once(
                ("record", self.location, type(exc).__name__),
                f"cannot record a cute.compile call into {self.location}: {exc}",
            )

    def _record(self, call, why, queried, compiled, site):
        from cute_aot.runtime.device import current_gpu_arch

        common = {
            "format": RECORD_FORMAT,
            "family": FAMILY,
            "site": site,
            "host": settings.host_name(),
            "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if call is None:
            record = {**common, "recreatable": False, "reason": why}
            return record, _subject(record)
        from cute_aot.kernels.recorded.hardware import live_device

        # The answers hold for this GPU model: a trace that asked any says which it was.
        key = call.key(queried, live_device() if queried else None)
        record = {
            **common,
            "recreatable": True,
            "key_id": key.id,
            "key": key.fields(),
            "arch": call.arch or current_gpu_arch(),
            "target": call.target,
            "tvm_ffi": call.tvm_ffi,
        }
        mismatch = _signature_mismatch(call, compiled)
        if mismatch:
            record.update(servable=False, reason=mismatch)
        return record, _subject(record)

    def _append(self, record: dict, subject: str) -> None:
        if subject in self._written:
            return
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        if not self.shared:
            self._written.add(subject)
            if urls.is_url(self.location):
                process_file(self.location, "record", ".record.jsonl").add(line)
            else:
                append_line(Path(self.location) / f"{host()}-{os.getpid()}.record.jsonl", line)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with claimed(f"{self.path}.lock", wait=LOCK_WAIT, stale_after=LOCK_STALE):
            self._read_others()
            if subject in self._written:
                return
            # Never rotated: every record is a kernel the next build needs. The line is read
            # back by the next _read_others (cheap; the offset then counts what was written).
            append_line(self.path, line, rotate=False)
            self._written.add(subject)

    def _read_others(self) -> None:
        """What other processes appended since this one last looked (under the lock)."""
        done, self._read_up_to = objects_after(self.path, self._read_up_to)
        self._written.update(_subject(record) for record in done)


def _subject(record: dict) -> str:
    """What makes a record distinct: its key id and the GPU that gave its hardware answers (a
    call answered otherwise is another kernel), or for an unreplayable call its site and why."""
    if not record.get("key_id"):
        return f"site:{record.get('site')}:{record.get('reason')}"
    try:
        return f"{record['key_id']}:{hardware_answers(RecordedCallKey.from_fields(record['key']))}"
    except (KeyError, TypeError, ValueError):
        return record["key_id"]


def _signature_mismatch(call, compiled) -> str | None:
    """Compare the signature derived without tracing with the compiled function's own: a
    served kernel must take its arguments exactly as the compiled one did."""
    spec = getattr(getattr(compiled, "execution_args", None), "get_kwargs_wrapper_spec", None)
    if spec is None:
        return None
    return signature_mismatch(call.signature, spec)


@contextlib.contextmanager
def recording(path: str | os.PathLike):
    """Record every distinct `cute.compile` call made inside the block into `path`."""
    compile_hook.install_hook()
    recorder = Recorder(path)
    compile_hook._recorders.append(recorder)
    try:
        yield recorder
    finally:
        compile_hook._recorders.remove(recorder)


def record_from_env() -> Recorder | None:
    """CUTE_AOT_RECORD: record this whole process (runtime/capture/activation.py calls it)."""
    location = settings.record_location()
    if location is None:
        return None
    compile_hook.install_hook()
    recorder = Recorder(location)
    if urls.is_url(location):  # now, on this (main) thread: its SIGTERM handler can be set
        process_file(location, "record", ".record.jsonl")
    compile_hook._recorders.append(recorder)
    return recorder
