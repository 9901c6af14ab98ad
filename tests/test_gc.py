"""`aot-cache gc` over a fake cache dir: the overlay, the unpacked libraries, the decoded
manifests, the build cache and the downloads of bundles at URLs, files of each kind with
controlled sizes and times (atime: last read, mtime: written)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cute_aot.aot.tools.aot_cache.cli import main
from cute_aot.aot.tools.aot_cache.facts import gc
from cute_aot.runtime import manifest_memo, remote

DAY = 86400.0
HOUR = 3600.0
FINGERPRINT = "0123456789abcdef01234567"  # an overlay folder; no test here asks for --stale


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch, settings_scope) -> Path:
    settings_scope(CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "250")
    return tmp_path / "cache"


def put(path: Path, size: int = 100, age: float = 0.0, used: float | None = None) -> Path:
    """A file written `age` seconds ago and last read `used` seconds ago (default: when written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    now = time.time()
    os.utime(path, (now - (age if used is None else used), now - age))
    return path


def digest(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def entry(cache: Path, name: str, **times) -> Path:
    return put(cache / "overlay" / FINGERPRINT / "sm_90a" / f"{name}.cuteaot", **times)


def library(cache: Path, label: str, size: int = 100, **times) -> tuple[Path, Path]:
    """(facts, library): the facts are the commit marker."""
    d = digest(label)
    return (
        put(cache / "libs" / f"{d}.verified.json", 10, **times),
        put(cache / "libs" / f"{d}.so", size, **times),
    )


def manifest(cache: Path, label: str, size: int = 100, **times) -> Path:
    """A decoded manifest, as runtime/manifest_memo.py names it."""
    return put(cache / "manifests" / f"{digest(label)}{manifest_memo.SUFFIX}", size, **times)


def built(root: Path, kind: str, label: str, size: int = 100, **times) -> tuple[Path, Path]:
    """(record, data) of a build-cache object or bundle: the record is the commit marker."""
    d = digest(label)
    suffix = {"objects": ".o", "bundles": ".cuteaot"}[kind]
    folder = root / kind / d[:2]
    return put(folder / f"{d}.json", 10, **times), put(folder / f"{d}{suffix}", size, **times)


def download(cache: Path, label: str, size: int = 100, **times) -> Path:
    """A verified copy of a bundle at a URL, as runtime/remote.py names it."""
    return put(cache / "remote" / f"{digest(label)}.cuteaot", size, **times)


def index(cache: Path, url: str, *copies: Path, age: float = 0.0) -> Path:
    """The URL's index naming `copies`, written by runtime/remote.py's own writer."""
    path = cache / "remote" / "index" / f"{digest(url)[:32]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    bundles = [
        remote.RemoteBundle(
            f"b{i}.cuteaot", f"{url}/b{i}.cuteaot", copy, copy.stem, 100, f'"etag{i}"'
        )
        for i, copy in enumerate(copies)
    ]
    remote._write_index(path, url, bundles)
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def run(*args, code: int = 0):
    result = CliRunner().invoke(main, ["gc", *map(str, args)])
    assert result.exit_code == code, result.output
    return result


def run_json(*args) -> dict:
    return json.loads(run(*args, "--json").stdout)


def removed_names(report: dict) -> list[str]:
    return [Path(unit["path"]).name for unit in report["removed"]]


def exist(*paths: Path) -> list[bool]:
    return [os.path.lexists(path) for path in paths]


def snapshot(root: Path) -> dict[str, tuple | None]:
    """Every file and link under root with its size and times; folders (whose atime any listing
    moves, this one's included) by name only."""
    found: dict[str, tuple | None] = {}
    for folder, dirs, files in os.walk(root):
        found.update((str(Path(folder) / name), None) for name in dirs)
        for name in files:
            info = (Path(folder) / name).lstat()
            found[str(Path(folder) / name)] = (info.st_size, info.st_atime_ns, info.st_mtime_ns)
    return found


# -- by last use -----------------------------------------------------------------------------------
def test_older_than_prunes_every_cache_by_last_use(cache):
    old = {
        "entry": (entry(cache, "old", age=10 * DAY),),
        "library": library(cache, "old", age=10 * DAY),
        "manifest": (manifest(cache, "old", age=10 * DAY),),
        "object": built(cache / "build", "objects", "old", age=10 * DAY),
        "bundle": built(cache / "build", "bundles", "old", age=10 * DAY),
    }
    recent = {  # written long ago, read yesterday: in use
        "entry": (entry(cache, "read", age=30 * DAY, used=DAY),),
        "library": library(cache, "read", age=30 * DAY, used=DAY),
        "manifest": (manifest(cache, "read", age=30 * DAY, used=DAY),),
        "object": built(cache / "build", "objects", "read", age=30 * DAY, used=DAY),
        "bundle": built(cache / "build", "bundles", "fresh", age=2 * DAY),
    }
    report = run_json("--older-than", "7d")
    assert sorted(unit["kind"] for unit in report["removed"]) == sorted(old)
    assert not any(exist(*[path for paths in old.values() for path in paths]))
    assert all(exist(*[path for paths in recent.values() for path in paths]))
    assert {name: row["removed"] for name, row in report["caches"].items()} == {
        "build": 2,
        "libs": 1,
        "manifests": 1,
        "overlay": 1,
        "remote": 0,
    }
    assert report["caches"]["libs"]["bytes_removed"] == 110  # the library and its facts
    assert report["bytes_removed"] == 100 + 110 + 100 + 110 + 110


def test_recent_use_keeps_a_unit_whole(cache):
    """gc keeps what is in use: a unit whose last use is recent survives --older-than 1d, all of
    it, even when only one of its files was read lately."""
    facts, lib = library(cache, "served", age=30 * DAY)
    os.utime(lib, (time.time() - HOUR, time.time() - 30 * DAY))  # a server read the library
    record, data = built(cache / "build", "objects", "hit", age=30 * DAY)
    os.utime(record, (time.time() - HOUR, time.time() - 30 * DAY))  # a build read the record
    used = entry(cache, "used", age=30 * DAY, used=2 * HOUR)
    gone = built(cache / "build", "objects", "cold", age=30 * DAY)

    report = run_json("--older-than", "1d")
    assert removed_names(report) == [gone[1].name]
    assert all(exist(facts, lib, record, data, used))
    assert not any(exist(*gone))


def test_nothing_used_within_the_grace_period_goes(cache):
    fresh = entry(cache, "fresh", age=10)
    facts, lib = library(cache, "fresh", age=10)
    run("--older-than", "0", "--max-size", "0")
    assert all(exist(fresh, facts, lib))
    run("--older-than", "0", "--grace", "0")
    assert not any(exist(fresh, facts, lib))


# -- by size ---------------------------------------------------------------------------------------
def test_max_size_evicts_least_recently_used_across_caches(cache):
    # 100 B of data (+ 10 B of record or facts) each; last use from 5 days to 1 day ago
    lru = [
        entry(cache, "e5", age=5 * DAY),
        library(cache, "l4", age=20 * DAY, used=4 * DAY)[1],  # old but read since
        built(cache / "build", "objects", "o3", age=3 * DAY)[1],
        entry(cache, "e2", age=2 * DAY),
        built(cache / "build", "bundles", "b1", age=DAY)[1],
    ]
    report = run_json("--max-size", "250")  # 530 B held: the three least recently used go
    assert removed_names(report) == [path.name for path in lru[:3]]
    assert all(r["reason"] == "least recently used, over --max-size" for r in report["removed"])
    assert report["bytes_kept"] == 210 <= 250
    assert exist(*lru) == [False, False, False, True, True]


def test_max_size_applies_after_age_pruning(cache):
    old = entry(cache, "old", age=30 * DAY)
    middle = entry(cache, "middle", age=3 * DAY)
    new = entry(cache, "new", age=DAY)
    report = run_json("--older-than", "7d", "--max-size", "150")
    assert [(Path(r["path"]).name, r["reason"]) for r in report["removed"]] == [
        ("old.cuteaot", "unused for longer than --older-than"),
        ("middle.cuteaot", "least recently used, over --max-size"),
    ]
    assert exist(old, middle, new) == [False, False, True]
    run("--max-size", "100")  # already at the limit: nothing more goes
    assert exist(new) == [True]


# -- units -----------------------------------------------------------------------------------------
def test_a_unit_goes_marker_first_and_readers_never_see_half(cache, monkeypatch):
    facts, lib = library(cache, "lib", age=10 * DAY)
    record, data = built(cache / "build", "bundles", "bundle", age=10 * DAY)
    orphan_record, orphan_data = built(cache / "build", "objects", "orphan", age=10 * DAY)
    orphan_data.unlink()  # a reader discarded it: record first, then data, and was stopped
    order: list[str] = []
    real_unlink = gc._unlink

    def watched_unlink(fd: int, name: str) -> None:
        # A concurrent reader, at every step: a marker always comes with its data.
        assert not (facts.exists() and not lib.exists()), "facts left without their library"
        assert not (record.exists() and not data.exists()), "record left without its data"
        order.append(name)
        real_unlink(fd, name)

    monkeypatch.setattr(gc, "_unlink", watched_unlink)
    report = run_json("--older-than", "7d")
    assert order.index(facts.name) == order.index(lib.name) - 1
    assert order.index(record.name) == order.index(data.name) - 1
    assert orphan_record.name in order
    assert not any(exist(facts, lib, record, data, orphan_record))
    assert {unit["kind"] for unit in report["removed"]} == {"library", "bundle", "object"}
    library_unit = next(unit for unit in report["removed"] if unit["kind"] == "library")
    assert library_unit["files"] == [str(facts), str(lib)] and library_unit["size"] == 110


def test_a_unit_used_or_replaced_after_planning_is_kept(cache):
    facts, lib = library(cache, "lib", age=10 * DAY)
    record, data = built(cache / "build", "objects", "obj", age=10 * DAY)
    replaced = entry(cache, "replaced", age=10 * DAY)
    idle = entry(cache, "idle", age=10 * DAY)
    remove, _ = gc.plan(older_than=DAY)
    assert len(remove) == 4

    os.utime(lib, (time.time(), time.time() - 10 * DAY))  # a server opened the library
    os.utime(record, (time.time(), time.time() - 10 * DAY))  # a build read the record
    replaced.unlink()
    entry(cache, "replaced", age=10 * DAY)  # set aside and republished: another file
    removed = gc.remove_files(remove)

    assert [unit.path for unit in removed] == [idle]
    assert all(exist(facts, lib, record, data, replaced))


def test_an_open_library_stays_readable_after_gc(cache):
    _, lib = library(cache, "served", age=10 * DAY)
    with open(lib, "rb") as server:
        run("--older-than", "1d")
        assert not lib.exists()
        assert server.read() == b"x" * 100  # the server's descriptor keeps the inode


# -- temporaries and refused entries --------------------------------------------------------------
def test_temporaries_go_once_an_hour_old_anywhere_in_the_cache_dir(cache):
    old = [
        put(cache / "overlay" / FINGERPRINT / "sm_90a" / ".k.cuteaot.abc12345.tmp", age=2 * HOUR),
        put(cache / "libs" / f".{digest('x')}.so.q1w2e3r4.tmp", age=2 * HOUR),
        put(cache / "build" / "objects" / "ab" / ".ab12.o.zzzzzzzz.tmp", age=2 * HOUR),
        put(cache / "keys" / ".overlay.pem.a1b2c3d4.tmp", age=2 * HOUR),
    ]
    young = [
        put(cache / "libs" / f".{digest('y')}.so.5t6y7u8i.tmp", age=10 * 60),
        put(cache / "keys" / ".overlay.pem.9o8i7u6y.tmp", age=10 * 60),
    ]
    not_ours = [  # never removed, however old: not a cache unit, not a temporary
        put(cache / "keys" / "overlay.pem", age=100 * DAY),
        put(cache / "misses.jsonl", age=100 * DAY),
        put(cache / "notes.tmp", age=100 * DAY),
        put(cache / "libs" / "README", age=100 * DAY),
    ]
    report = run_json()  # no options: only debris goes
    assert sorted(removed_names(report)) == sorted(path.name for path in old)
    assert {r["reason"] for r in report["removed"]} == {"temporary left by a killed writer"}
    assert report["caches"]["other"]["removed"] == 1  # keys/
    assert not any(exist(*old))
    assert all(exist(*young, *not_ours))
    run("--older-than", "0", "--max-size", "0", "--grace", "0")  # a young temporary is its writer's
    assert all(exist(*young, *not_ours))


def test_refused_overlay_entries_always_go(cache):
    good = entry(cache, "k", age=DAY)
    refused = put(good.with_name("k.cuteaot.refused-0123456789ab"), used=0)  # just set aside
    report = run_json()
    assert removed_names(report) == [refused.name]
    assert report["removed"][0]["kind"] == "refused"
    assert exist(good, refused) == [True, False]


# -- downloads of bundles at URLs ------------------------------------------------------------------
def test_downloads_go_by_age_and_size_like_the_other_caches(cache):
    old = download(cache, "old", age=10 * DAY)
    read = download(cache, "read", age=30 * DAY, used=DAY)  # served from the cache yesterday
    recent = download(cache, "recent", age=2 * DAY)
    url_index = index(cache, "s3://b/release", old, read, recent, age=10 * DAY)

    report = run_json("--older-than", "7d")  # the index was read with `read`: in use
    assert removed_names(report) == [old.name]
    assert report["removed"][0]["kind"] == "copy"
    assert report["caches"]["remote"]["removed"] == 1
    assert exist(old, read, recent, url_index) == [False, True, True, True]

    e = entry(cache, "e", age=3 * DAY)  # across caches, the least recently used go first
    report = run_json("--max-size", str(url_index.stat().st_size + 100))
    assert removed_names(report) == [e.name, recent.name]
    assert exist(read, url_index) == [True, True]


def test_what_nothing_reads_again_goes_once_an_hour_unused(cache):
    """A copy no index names (its URL now holds another object) and an index whose copies are
    gone go without options, once unused for an hour; a copy an index names stays until the age
    and size limits say otherwise, and the URL locks are never touched."""
    named = download(cache, "named", age=100 * DAY)
    superseded = download(cache, "superseded", age=2 * HOUR)
    fresh = download(cache, "fresh", age=10 * 60)  # a fetch still downloading the rest
    current = index(cache, "s3://b/current", named, age=100 * DAY)
    dangling = index(
        cache, "s3://b/gone", cache / "remote" / f"{digest('x')}.cuteaot", age=2 * HOUR
    )
    lock = put(
        cache / "remote" / "locks" / f"{digest('s3://b/current')[:32]}.lock", 0, age=100 * DAY
    )
    debris = put(cache / "remote" / ".download.pid1@0123456789ab.abc.tmp", age=2 * HOUR)
    strays = [
        put(cache / "remote" / "notes.txt", age=100 * DAY),
        put(cache / "remote" / "x.cuteaot"),
    ]

    report = run_json()
    assert {Path(r["path"]).name: r["reason"] for r in report["removed"]} == {
        superseded.name: "no index names it (its URL holds another object)",
        dangling.name: "names no copy left",
        debris.name: "temporary left by a killed writer",
    }
    assert all(exist(named, fresh, current, lock, *strays))
    run("--older-than", "0", "--max-size", "0", "--grace", "0")
    assert exist(named, fresh, current, lock, *strays) == [False, False, False, True, True, True]


def test_downloads_are_collected_alone_with_cache_remote(cache):
    copy = download(cache, "c", age=10 * DAY)
    url_index = index(cache, "s3://b/r", copy, age=10 * DAY)
    e = entry(cache, "e", age=10 * DAY)
    report = run_json("--cache", "remote", "--older-than", "1d")
    assert set(report["caches"]) == {"remote"}
    assert report["caches"]["remote"]["root"] == str(cache / "remote")
    assert exist(copy, url_index, e) == [False, False, True]


# -- options ---------------------------------------------------------------------------------------
def test_dry_run_lists_and_deletes_nothing(cache):
    entry(cache, "e", age=10 * DAY)
    library(cache, "l", age=10 * DAY)
    built(cache / "build", "objects", "o", age=10 * DAY)
    put(cache / "libs" / ".x.so.abcdefgh.tmp", age=2 * HOUR)
    put(cache / "overlay" / "k.cuteaot.refused-abc", age=DAY)
    url_index = index(cache, "s3://b/r", download(cache, "d", age=10 * DAY), age=10 * DAY)
    before = snapshot(cache)  # gc reads the index: its atime must not move either

    report = run_json("--dry-run", "--older-than", "0", "--max-size", "0", "--grace", "0")
    assert report["dry_run"] and len(report["removed"]) == 7
    assert report["bytes_removed"] == 100 + 110 + 110 + 100 + 100 + 100 + url_index.stat().st_size
    text = run("--dry-run", "--older-than", "1d").stdout
    assert "would remove" in text and f"{digest('l')}.so" in text
    assert snapshot(cache) == before  # not a file removed, not even an atime touched


def test_cache_option_restricts_what_is_collected(cache):
    e = entry(cache, "e", age=10 * DAY)
    lib = library(cache, "l", age=10 * DAY)
    obj = built(cache / "build", "objects", "o", age=10 * DAY)
    other_tmp = put(cache / "keys" / ".k.pem.abcdefgh.tmp", age=2 * HOUR)
    libs_tmp = put(cache / "libs" / ".x.so.abcdefgh.tmp", age=2 * HOUR)

    report = run_json("--cache", "libs", "--older-than", "1d")
    assert set(report["caches"]) == {"libs"}
    assert exist(e, *lib, *obj, other_tmp) == [True, False, False, True, True, True]
    assert exist(libs_tmp) == [False]
    run("--cache", "overlay", "--cache", "build", "--older-than", "1d")
    assert exist(e, *obj, other_tmp) == [False, False, False, True]  # keys/ is no cache's
    run("--older-than", "1d")
    assert exist(other_tmp) == [False]
    assert "'bundles' is not one of" in run("--cache", "bundles", code=2).output


def test_build_cache_option_collects_only_the_build_cache_there(cache, tmp_path):
    root = tmp_path / "ci-cache"
    obj = built(root, "objects", "o", age=10 * DAY)
    tmp = put(root / "bundles" / "cd" / ".cd.cuteaot.abcdefgh.tmp", age=2 * HOUR)
    unrelated = [  # --build-cache may name a folder that holds more than the cache
        put(root / "notes.txt", age=100 * DAY),
        put(root / ".old.abcdefgh.tmp", age=100 * DAY),
        put(root / "objects" / "stray.o", age=100 * DAY),
    ]
    default = built(cache / "build", "objects", "d", age=10 * DAY)

    report = run_json("--build-cache", root, "--cache", "build", "--older-than", "1d")
    assert report["caches"]["build"]["root"] == str(root)
    assert not any(exist(*obj, tmp))
    assert all(exist(*unrelated, *default))


# -- safety ----------------------------------------------------------------------------------------
def test_links_are_never_followed(cache, tmp_path):
    outside = tmp_path / "outside"
    secret = put(outside / "secret", age=100 * DAY)
    bundle = put(outside / "x.cuteaot", age=100 * DAY)
    debris = put(outside / ".x.so.abcdefgh.tmp", age=100 * DAY)
    d = digest("linked")
    shard = put(outside / d[:2] / f"{d}.o", age=100 * DAY)
    record = put(outside / d[:2] / f"{d}.json", age=100 * DAY)
    files_outside = snapshot(outside)

    link = cache / "libs" / f"{digest('l')}.so"  # where a library belongs, a link to a file
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    (cache / "overlay" / FINGERPRINT).mkdir(parents=True)
    (cache / "overlay" / FINGERPRINT / "sm_90a").symlink_to(outside)  # folders that are links
    (cache / "build" / "objects").mkdir(parents=True)
    (cache / "build" / "objects" / d[:2]).symlink_to(outside / d[:2])
    (cache / "keys").symlink_to(outside)
    old = time.time() - 100 * DAY
    for path in cache.rglob("*"):
        os.utime(path, (old, old), follow_symlinks=False)

    run("--older-than", "0", "--max-size", "0", "--grace", "0")
    assert snapshot(outside) == files_outside
    assert all(exist(secret, bundle, debris, shard, record))
    assert not os.path.lexists(link) or link.is_symlink()  # removed as a link, or left alone


def test_a_cache_folder_that_is_a_link_is_not_walked(cache, tmp_path):
    outside = tmp_path / "outside"
    d = digest("l")
    lib = put(outside / f"{d}.so", age=100 * DAY)
    facts = put(outside / f"{d}.verified.json", age=100 * DAY)
    cache.mkdir()
    (cache / "libs").symlink_to(outside)
    report = run_json("--older-than", "0", "--grace", "0")
    assert report["removed"] == [] and all(exist(lib, facts))


def test_files_vanishing_mid_walk_do_not_crash(cache, monkeypatch):
    facts, lib = library(cache, "lib", age=10 * DAY)
    record, data = built(cache / "build", "objects", "obj", age=10 * DAY)
    other = built(cache / "build", "objects", "other", age=10 * DAY)
    overlay_entry = entry(cache, "e", age=10 * DAY)
    real_list = gc._list

    def racing_list(fd: int) -> list[str]:
        names = real_list(fd)
        # Between the listing and the look at each name, another gc removes what was listed.
        for path in (lib, data):
            if path.name in names:
                path.unlink()
        if FINGERPRINT in names:  # a folder, listed, then gone before it is walked
            shutil.rmtree(cache / "overlay" / FINGERPRINT)
        if other[0].parent.name in names:  # likewise a shard of the build cache
            shutil.rmtree(other[0].parent)
        return names

    monkeypatch.setattr(gc, "_list", racing_list)
    remove, _ = gc.plan(older_than=DAY)
    monkeypatch.setattr(gc, "_list", real_list)
    assert {unit.path.name for unit in remove} == {facts.name, record.name}  # what is left
    assert not any(exist(lib, data, *other, overlay_entry))
    for path in (facts, record):  # and removing what is already gone counts as nothing
        path.unlink(missing_ok=True)
    assert gc.remove_files(remove) == []


def test_racing_collectors_remove_each_unit_once(cache):
    library(cache, "lib", age=10 * DAY)
    entry(cache, "e", age=10 * DAY)
    first, _ = gc.plan(older_than=DAY)
    second, _ = gc.plan(older_than=DAY)
    assert len(gc.remove_files(first)) == 2
    assert gc.remove_files(second) == []


# -- output ----------------------------------------------------------------------------------------
def test_table_shows_counts_and_bytes_freed_per_cache(cache):
    entry(cache, "e", size=2048, age=10 * DAY)
    library(cache, "l", size=1024 * 1024, age=10 * DAY)
    entry(cache, "kept", age=DAY)
    text = run("--older-than", "7d").stdout
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ ")}
    assert "1.0 MiB" in rows["libs"] and "2.0 KiB" in rows["overlay"]
    assert rows["overlay"].split("│")[3].strip() == "1"  # removed
    assert rows["overlay"].split("│")[5].strip() == "1"  # kept
    assert rows["build"].split("│")[3].strip() == "0"
    assert "removed 2 unit(s)" in text
    assert str(cache / "overlay" / FINGERPRINT) not in text  # units listed only with -v
    assert "kept.cuteaot" not in text
    assert "kept.cuteaot" in run("--older-than", "0", "-v").stdout
