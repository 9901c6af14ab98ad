"""A bundle's manifest is decoded once per user: later opens take its values from the private
memo (runtime/manifest_memo.py), trusted like the verified libraries beside it, and a memo that
cannot be trusted, read or written is a miss, never a failure."""

from __future__ import annotations

import json
import marshal
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from cute_aot.aot.tools.aot_cache.cli import main
from cute_aot.artifacts.bundle import HEADER, manifest_of, read_manifest
from cute_aot.artifacts.bundle_writer import rewrite_manifest
from cute_aot.artifacts.core.errors import BundleIntegrityError
from cute_aot.artifacts.manifest import Manifest
from cute_aot.runtime import manifest_memo
from cute_aot.runtime.registry import REGISTRY, load_bundles
from tests.faults import fill, small_tmpfs

ARCH = "sm_90a"


def _bundle(stub_bundles) -> Path:
    _, paths, _ = stub_bundles
    return next(path for path in paths if ARCH in path.name)


def _own_copy(stub_bundles, tmp_path: Path) -> Path:
    """A copy of the bundle that a test may change (the stub bundles are shared)."""
    copy = tmp_path / _bundle(stub_bundles).name
    shutil.copyfile(_bundle(stub_bundles), copy)
    return copy


def _open(path: Path) -> Manifest:
    REGISTRY.clear()
    [loaded] = load_bundles(path, gpu_arch=ARCH)
    return loaded.manifest


def _memos(cache: Path) -> list[Path]:
    return sorted((cache / "manifests").glob("*"))


def _manifest_sha(path: Path) -> str:
    """The sha256 of the bundle's manifest bytes, as its header gives it."""
    with open(path, "rb") as handle:
        return HEADER.unpack(handle.read(HEADER.size))[-1].hex()


def _rewrite(memo: Path, data, mode: int = 0o444) -> None:
    memo.chmod(0o644)
    memo.write_bytes(data if isinstance(data, bytes) else marshal.dumps(data))
    memo.chmod(mode)


def test_the_first_open_keeps_the_decoded_manifest_and_later_opens_take_it(
    stub_bundles, fresh_runtime
):
    path = _bundle(stub_bundles)
    assert _open(path) == read_manifest(path)
    [memo] = _memos(fresh_runtime)
    assert manifest_memo.MEMO_NAME.fullmatch(memo.name)
    assert memo.stat().st_mode & 0o777 == 0o444
    data = marshal.loads(memo.read_bytes())
    assert manifest_of(data, str(path)) == read_manifest(path)
    # The next open answers from the memo: a value planted there (by this user, in a private
    # file) is what it reads, where the bundle's own JSON says otherwise.
    _rewrite(memo, {**data, "name": "from-the-memo"})
    assert _open(path).name == "from-the-memo"


def test_a_memo_others_can_write_or_a_damaged_one_is_decoded_again(stub_bundles, fresh_runtime):
    path = _bundle(stub_bundles)
    name = _open(path).name
    [memo] = _memos(fresh_runtime)
    data = marshal.loads(memo.read_bytes())
    _rewrite(memo, {**data, "name": "planted"}, mode=0o666)  # writable by others: not trusted
    assert _open(path).name == name
    _rewrite(memo, b"\x00 not marshal data")  # damaged: decoded again, and kept again
    assert _open(path).name == name
    assert marshal.loads(memo.read_bytes()) == data


def test_a_full_disk_leaves_no_memo_and_the_bundle_opens(stub_bundles, fresh_runtime):
    path = _bundle(stub_bundles)
    with small_tmpfs(fresh_runtime / "manifests") as folder:
        fill(folder)
        assert _open(path) == read_manifest(path)
        assert [item.name for item in folder.iterdir()] == ["filler"]  # no memo, no temporary
        os.unlink(folder / "filler")
        _open(path)
        assert [memo.name for memo in _memos(fresh_runtime)] == [
            f"{_manifest_sha(path)}{manifest_memo.SUFFIX}"
        ]


def test_a_bundle_replaced_at_the_same_path_is_read_not_taken_from_the_memo(
    stub_bundles, fresh_runtime, tmp_path
):
    """The memo is found by the manifest hash the header names: a new manifest (a re-signed or
    rebuilt bundle copied over the old one) has another, and is read and decoded."""
    path = _own_copy(stub_bundles, tmp_path)
    old = _open(path)
    rewrite_manifest(path, replace(old, bundle_version="replaced"))
    assert _open(path).bundle_version == "replaced"
    assert len(_memos(fresh_runtime)) == 2


def test_on_a_memo_hit_the_manifest_bytes_are_not_read_again(stub_bundles, fresh_runtime, tmp_path):
    """What the memo gives was decoded from bytes with the hash the header names, so the file's
    manifest bytes are skipped: damage inside them after the memo was kept is served as the
    intact values, and only a full read names it."""
    path = _own_copy(stub_bundles, tmp_path)
    intact = _open(path)
    data = bytearray(path.read_bytes())
    inside = HEADER.size + data[HEADER.size :].index(b'"bundle_version"')
    data[inside + 1 : inside + 7] = b"BUNDLE"  # the same length: only the hash tells
    path.write_bytes(bytes(data))
    assert _open(path) == intact
    with pytest.raises(BundleIntegrityError, match="manifest hash mismatch"):
        read_manifest(path)


def test_aot_cache_env_shows_the_memos(stub_bundles, fresh_runtime):
    path = _bundle(stub_bundles)
    _open(path)
    _open(path)  # the first open extracted the library; this one went through the memo
    done = CliRunner().invoke(main, ["env", "--json"])
    assert done.exit_code == 0, done.output
    usage = json.loads(done.stdout)["paths"]["manifests"]
    assert usage["path"] == str(fresh_runtime / "manifests")
    assert usage["files"] == 1
    assert usage["bytes"] == _memos(fresh_runtime)[0].stat().st_size
