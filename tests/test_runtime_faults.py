"""A call never fails because of a cache, and never runs bytes nobody verified: one regression
test per fault found from outside (each failed on the runtime before the resolution epoch, the one
fallback policy and the private-library checks).

No GPU: as in test_family_ops_cpu, the router op runs on a fake sm_90a GPU (tests/fake_gpu.py),
with its own validation and resolution, and kernels are Python functions in LoadedBundle values
unless a real bundle is needed.
Faults are caused for real: read-only and full tmpfs mounts, FIFOs, links, other owners.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from cute_aot.artifacts.bundle import read_bundle
from cute_aot.artifacts.bundle_writer import write_bundle
from cute_aot.artifacts.core.errors import InputError, KernelNotFoundError
from cute_aot.kernels import family
from cute_aot.runtime import REGISTRY, jit, load_bundles, mode, ops, policy, set_mode
from cute_aot.runtime.loader import LoadedBundle, open_bundle
from cute_aot.runtime.misses import miss_log_path, read_misses, record_miss
from cute_aot.runtime.registry import ENV_RETRY_SECONDS
from cute_aot.runtime.resolution import key_function
from tests.fake_gpu import on_gpu
from tests.faults import fill, read_only_folder, small_tmpfs
from tests.stubs import loaded_bundle, without_cutlass

ARCH = "sm_90a"  # the fake GPU's (an H200)
ROUTER = family("router_gemm")
PROBLEM = ROUTER.parse_problem("M=2,N=8,K=64")
KEY = ROUTER.dispatch(PROBLEM, ARCH).key


def _fake_bundle(key, function, path="fake.cuteaot") -> LoadedBundle:
    return loaded_bundle(key, function, ARCH, path=path)


@pytest.fixture
def router_op(fresh_runtime, fake_gpu):
    return ops.family_op("router_gemm")


def _inputs(problem=PROBLEM):
    m, n, k = problem.m, problem.n, problem.k
    return on_gpu(torch.ones(m, k, dtype=torch.bfloat16)), on_gpu(
        torch.ones(n, k, dtype=torch.bfloat16)
    )


def _no_jit(monkeypatch):
    without_cutlass(monkeypatch)


def _reference(x, w):
    return ROUTER.reference(x, w)


# -- 1: an unwritable cache directory --------------------------------------------------------------
def test_a_miss_with_a_read_only_cache_dir_falls_back_instead_of_failing(
    router_op, monkeypatch, settings_scope, tmp_path
):
    with read_only_folder(tmp_path / "ro") as cache:
        settings_scope(CUTE_AOT_CACHE_DIR=str(cache / "cute-aot"))
        _no_jit(monkeypatch)
        x, w = _inputs()
        with pytest.warns(RuntimeWarning, match="overlay cache unusable"):
            out = ops.op("router_gemm")(x, w)
    assert torch.equal(out, _reference(x, w))
    assert policy.counters()["router_gemm"]["degradations"] == 2  # the overlay, then JIT


# -- 3 and 4: a mode change or a load while resolving; the environment's mode --------------------
def test_a_resolution_computed_while_the_mode_changed_is_not_remembered(router_op, monkeypatch):
    jitted = []

    def slow_compile(key, arch, publish):  # a JIT compile, during which the mode changes
        mode.set_mode("aot")
        jitted.append(key.id)
        return lambda x, w, out: out.fill_(7)

    monkeypatch.setattr(jit, "jit_available", lambda: True)
    monkeypatch.setattr(jit, "compiled_function", slow_compile)
    x, w = _inputs()
    with pytest.warns(RuntimeWarning, match="compiling it now"):
        with pytest.raises(KernelNotFoundError):  # resolved again under aot: no bundle
            ops.op("router_gemm")(x, w)
    assert jitted == [KEY.id]
    with pytest.raises(KernelNotFoundError):
        ops.op("router_gemm")(x, w)


def test_mode_modules_set_mode_and_the_environment_reach_every_op(
    router_op, monkeypatch, settings_scope
):
    _no_jit(monkeypatch)
    x, w = _inputs()
    with pytest.warns(RuntimeWarning, match="torch reference"):
        ops.op("router_gemm")(x, w)  # auto: remembered as the torch fallback
    mode.set_mode("aot")  # the lower-level function, not cute_aot.runtime.set_mode
    with pytest.raises(KernelNotFoundError):
        ops.op("router_gemm")(x, w)
    mode.set_mode(None)
    ops.op("router_gemm")(x, w)
    settings_scope(CUTE_AOT_MODE="aot")  # as a changed CUTE_AOT_MODE reads
    other = ROUTER.parse_problem("M=3,N=8,K=64")
    with pytest.raises(KernelNotFoundError):  # the next resolution sees the environment
        ops.op("router_gemm")(*_inputs(other))
    with pytest.raises(KernelNotFoundError):  # and every remembered shape is resolved again
        ops.op("router_gemm")(x, w)


# -- 5: a bundle source that cannot be read yet ---------------------------------------------------
def test_a_bundle_folder_that_appears_later_is_loaded(
    router_op, monkeypatch, settings_scope, tmp_path
):
    _no_jit(monkeypatch)
    folder = tmp_path / "not-mounted-yet"
    settings_scope(CUTE_AOT_BUNDLES=str(folder))
    x, w = _inputs()
    with pytest.warns(RuntimeWarning, match="cannot be read now"):
        ops.op("router_gemm")(x, w)
    assert policy.counters()["router_gemm"]["hits"] == 0
    served = []
    folder.mkdir()
    time.sleep(ENV_RETRY_SECONDS)  # the registry tries a failed source again after this

    def kernel(x, w, out):
        served.append(1)

    def load_folder(sources, gpu_arch, skip_bad_files):  # the folder's bundle, as loaded
        REGISTRY.add(_fake_bundle(KEY, kernel, folder / "router.cuteaot"))
        return []

    monkeypatch.setattr(REGISTRY, "_load", load_folder)
    ops.op("router_gemm")(x, w)  # the load moved the epoch: resolved again, from the bundle
    hits = policy.counters()["router_gemm"]["hits"]
    ops.op("router_gemm")(x, w)  # remembered now: the hit path
    # two resolutions in the first call: one while the load moved the epoch (not remembered),
    # then the bundle's; the second call is the hit path, which resolves nothing
    assert served == [1, 1] and hits == 2
    assert policy.counters()["router_gemm"]["hits"] == hits


# -- 6: umask 002 --------------------------------------------------------------------------------
def test_under_umask_002_the_library_cache_is_private_and_trusted_next_time(stub_bundles, tmp_path):
    _, paths, _ = stub_bundles
    bundle = next(p for p in paths if "sm_90a" in p.name)
    script = textwrap.dedent(
        f"""
        import json, os, stat
        os.umask(0o002)
        from cute_aot.runtime.loader import open_bundle
        opened = open_bundle({str(bundle)!r}, "sm_90a")
        libs = os.path.join(os.environ["CUTE_AOT_CACHE_DIR"], "libs")
        print(json.dumps({{"libs_mode": stat.S_IMODE(os.stat(libs).st_mode),
                          "trusted_copy": opened.key_class is not None,
                          "where": opened.library_path}}))
        """
    )
    env = {**os.environ, "CUTE_AOT_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    assert runs[0]["libs_mode"] & 0o022 == 0
    assert runs[0]["trusted_copy"] is False and runs[1]["trusted_copy"] is True
    assert runs[1]["where"].startswith(str(tmp_path / "cache" / "libs"))


# -- 7: a KeyError inside a served function ------------------------------------------------------
def test_a_kernel_that_raises_key_error_runs_once(router_op, monkeypatch):
    calls = []

    def kernel(x, w, out):  # updates state in place, then fails
        calls.append(1)
        raise KeyError("inside the kernel")

    REGISTRY.add(_fake_bundle(KEY, kernel))
    x, w = _inputs()
    with pytest.raises(KeyError, match="inside the kernel"):
        ops.op("router_gemm")(x, w)  # resolved on the checked path, then called
    assert calls == [1]
    with pytest.raises(KeyError, match="inside the kernel"):
        ops.op("router_gemm")(x, w)  # the hit path
    assert calls == [1, 1]


# -- 8: bytes others can change between the check and the dlopen ---------------------------------
PLANTED = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE *f = fopen("%s", "w"); if (f) { fputs("ran", f); fclose(f); }
}
"""


def test_a_library_others_can_write_is_never_dlopened_from_the_cache(stub_bundles, tmp_path):
    """The loader maps only bytes it verified: with the cache's libs folder and file owned by
    another user and writable by all, a writer flipping the file between the verified library
    and a planted one never gets its constructor run, and the library comes from memory."""
    _, paths, _ = stub_bundles
    bundle = next(p for p in paths if "sm_90a" in p.name)
    manifest, library = read_bundle(bundle)
    marker = tmp_path / "planted-ran"
    source = tmp_path / "planted.c"
    source.write_text(PLANTED % marker)
    planted_so = tmp_path / "planted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(planted_so)], check=True)
    planted = planted_so.read_bytes().ljust(len(library), b"\0")[: len(library)]
    caches = []
    for trial in range(6):
        libs = tmp_path / f"cache{trial}" / "libs"
        libs.mkdir(parents=True)
        target = libs / f"{manifest.library['sha256']}.so"
        target.write_bytes(library)
        for path in (libs, target):
            os.chown(path, 65534, 65534)  # another user's
            os.chmod(path, 0o777 if path == libs else 0o666)
        caches.append((libs.parent, target))
    stop = threading.Event()

    def flip():  # the other user, writing in place
        while not stop.is_set():
            for _, target in caches:
                for data in (planted, library):
                    with open(target, "r+b") as handle:
                        handle.write(data)

    writer = threading.Thread(target=flip)
    writer.start()
    try:
        script = textwrap.dedent(
            f"""
            import json, os
            from cute_aot.runtime.loader import open_bundle
            where = []
            for cache in {[str(c) for c, _ in caches]!r}:
                os.environ["CUTE_AOT_CACHE_DIR"] = cache
                try:
                    where.append(open_bundle({str(bundle)!r}, "sm_90a").library_path)
                except Exception as exc:
                    where.append(type(exc).__name__)
            print(json.dumps(where))
            """
        )
        result = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stop.set()
        writer.join()
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "a library nobody verified ran its constructor in the loader"
    where = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(w.startswith("memfd:") for w in where), where


# -- 9 and 11: the miss log as a FIFO, a link, on a full disk ------------------------------------
def test_a_fifo_as_miss_log_never_blocks_the_op_path(tmp_path):
    fifo = tmp_path / "misses.jsonl"
    os.mkfifo(fifo)
    script = textwrap.dedent(
        """
        from cute_aot.kernels import family
        from cute_aot.runtime.misses import record_miss
        router = family("router_gemm")
        key = router.dispatch(router.parse_problem("M=2,N=8,K=64"), "sm_90a").key
        record_miss(key, "sm_90a", {})
        print("returned")
        """
    )
    env = {**os.environ, "CUTE_AOT_MISS_LOG": str(fifo)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "returned" in result.stdout, result.stderr
    assert "cannot write the miss log" in result.stderr


def test_the_miss_log_never_follows_a_link(fresh_runtime, settings_scope, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "misses.jsonl"
    link.symlink_to(victim)
    settings_scope(CUTE_AOT_MISS_LOG=str(link))
    with pytest.warns(RuntimeWarning, match="cannot write the miss log"):
        record_miss(KEY, ARCH, {})
    assert victim.read_text() == "precious\n"


def test_a_record_cut_short_by_a_full_disk_costs_only_itself(
    fresh_runtime, settings_scope, tmp_path
):
    from cute_aot.runtime.misses import forget_recorded

    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        settings_scope(CUTE_AOT_MISS_LOG=str(disk / "misses.jsonl"))
        keys = [
            ROUTER.dispatch(ROUTER.parse_problem(f"M=1,N=8,K={k}"), ARCH).key
            for k in range(64, 64 + 8 * 400, 8)
        ]
        record_miss(keys[0], ARCH, {})
        fill(disk)
        written = 1
        with pytest.warns(RuntimeWarning, match="cannot write the miss log"):
            for key in keys[1:]:  # fills the log's last page, then one is cut short
                record_miss(key, ARCH, {})
                written += 1
                if not (disk / "misses.jsonl").read_bytes().endswith(b"\n"):
                    break
        assert not (disk / "misses.jsonl").read_bytes().endswith(b"\n")
        (disk / "filler").unlink()
        forget_recorded()
        record_miss(keys[-1], ARCH, {})
        records = read_misses(miss_log_path())
    assert [r["key_id"] for r in records] == [k.id for k in keys[: written - 1]] + [keys[-1].id]


def test_the_miss_log_rotates_and_both_generations_are_read(fresh_runtime, monkeypatch):
    from cute_aot.artifacts.core import json_lines

    path = miss_log_path()
    record_miss(KEY, ARCH, {})
    with open(path, "ab") as handle:
        handle.truncate(json_lines.MAX_LOG_BYTES + 1)  # a log past its size, sparse
    other = ROUTER.dispatch(ROUTER.parse_problem("M=1,N=16,K=64"), ARCH).key
    record_miss(other, ARCH, {})
    assert path.stat().st_size < 4096 and json_lines.rotated_path(path).exists()
    assert [r["key_id"] for r in read_misses(path)] == [KEY.id, other.id]


# -- also found --------------------------------------------------------------------------------
def test_shapes_longer_than_the_c_table_stay_in_the_python_table(router_op, stub_bundles):
    _, paths, plan = stub_bundles
    bundle = next(p for p in paths if "sm_90a" in p.name)
    REGISTRY.load(bundle, gpu_arch=ARCH)
    function = REGISTRY.bundle_function("router_gemm", plan[ARCH][0].id, ARCH)
    shapes = [torch.Size([1] * 30), torch.Size([8, 64])]  # 33 dims: more than the C key holds
    from cute_aot.runtime import epoch

    assert router_op.remember(shapes, 0, (function, (1, 8)), epoch.current())
    assert router_op.table[tuple(shapes)][0] is function


def test_an_overlay_entry_this_host_cannot_use_is_left_for_others(
    fresh_runtime, stub_bundles, tmp_path
):
    """An environment refusal (another tvm-ffi here) is not damage: the entry stays in place."""
    from cute_aot.runtime import overlay

    _, paths, plan = stub_bundles
    manifest, library = read_bundle(next(p for p in paths if "sm_90a" in p.name))
    key = plan[ARCH][0]
    toolchain_elsewhere = {**manifest.toolchain, "tvm_ffi": "9.9.9"}
    import dataclasses

    entry = overlay.overlay_path(key, ARCH)
    entry.parent.mkdir(parents=True)
    write_bundle(entry, dataclasses.replace(manifest, toolchain=toolchain_elsewhere), library)
    with pytest.warns(RuntimeWarning, match="not using overlay entry"):
        assert REGISTRY.overlay_function(key, ARCH) is None
    assert entry.exists() and not list(entry.parent.glob("*refused*"))


def test_a_damaged_entry_found_at_first_use_falls_back_in_mode_auto(
    router_op, stub_bundles, monkeypatch, tmp_path
):
    """The trusted path re-derives each key at its first use; a bundle whose entry lies about
    its key then degrades to the next step in mode auto instead of failing the call."""
    import dataclasses

    _no_jit(monkeypatch)
    _, paths, plan = stub_bundles
    good = next(p for p in paths if "sm_90a" in p.name)
    open_bundle(good, ARCH)  # caches the verified library: later opens trust it
    manifest, library = read_bundle(good)
    key = plan[ARCH][0]
    entries = tuple(
        dataclasses.replace(e, key={**e.key, "version": 999}) if e.key_id == key.id else e
        for e in manifest.entries
    )
    lying = tmp_path / "lying-sm_90a.cuteaot"
    write_bundle(lying, dataclasses.replace(manifest, entries=entries), library)
    REGISTRY.load(lying, gpu_arch=ARCH)
    problem = next(
        p
        for p in (ROUTER.parse_problem(s) for s in ("M=2,N=256,K=4096", "M=12,N=256,K=7168"))
        if ROUTER.dispatch(p, ARCH).key == key
    )
    x, w = _inputs(problem)
    with pytest.warns(RuntimeWarning, match="unusable"):
        out = ops.op("router_gemm")(x, w)
    assert torch.equal(out, _reference(x, w))
    set_mode("aot")
    with pytest.raises(Exception, match="key"):
        ops.op("router_gemm")(x, w)


def test_no_listener_outlives_what_registered_it(fresh_runtime):
    """Ops, served libraries and modes share one epoch: nothing registers callbacks."""
    assert not hasattr(REGISTRY, "_listeners") and not hasattr(REGISTRY, "on_change")


def test_the_tests_never_write_into_the_users_cache():
    home_cache = Path(os.path.expanduser("~")) / ".cache" / "cute-aot"
    from cute_aot.artifacts.core import settings

    assert not str(settings.cache_dir()).startswith(str(home_cache))


def test_a_callers_mistake_is_not_chained_to_an_internal_lookup(router_op):
    x, w = _inputs()
    with pytest.raises(InputError, match="x must be bfloat16") as info:
        ops.op("router_gemm")(x.float(), w)
    assert info.value.__context__ is None and info.value.__cause__ is None


@pytest.mark.slow
def test_sixteen_processes_load_one_bundle_into_an_empty_cache(stub_bundles, tmp_path):
    _, paths, plan = stub_bundles
    bundle = next(p for p in paths if "sm_90a" in p.name)
    cache = tmp_path / "cache"
    script = textwrap.dedent(
        f"""
        import json
        from cute_aot.runtime.loader import open_bundle
        opened = open_bundle({str(bundle)!r}, "sm_90a")
        function = opened.function({plan[ARCH][0].id!r})
        print(json.dumps({{"where": opened.library_path, "type": type(function).__name__}}))
        """
    )
    env = {**os.environ, "CUTE_AOT_CACHE_DIR": str(cache)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(16)
    ]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    manifest, library = read_bundle(bundle)
    (copy,) = (cache / "libs").glob("*.so")
    assert copy.read_bytes() == library and not list((cache / "libs").glob("*.tmp"))
    assert {r["type"] for r in reports} == {"Function"}
    assert {r["where"] for r in reports} == {str(copy)}


# -- CI fault injection: read-only $HOME, a full disk, a read-only miss log ----------------------
def test_a_server_with_a_read_only_home_loads_and_falls_back(stub_bundles, tmp_path):
    _, paths, plan = stub_bundles
    bundle = next(p for p in paths if "sm_90a" in p.name)
    script = textwrap.dedent(
        f"""
        import json, sys, warnings
        warnings.simplefilter("ignore")
        sys.modules["cutlass"] = None  # a server without the compiler: no cutlass to find
        import torch
        from cute_aot.kernels import family
        from cute_aot.runtime import REGISTRY, counters, jit, load_bundles, policy
        from cute_aot.runtime.resolution import key_function
        from cute_aot.runtime import resolution
        (opened,) = load_bundles({str(bundle)!r}, gpu_arch="sm_90a")
        router = family("router_gemm")
        missing = router.dispatch(router.parse_problem("M=1,N=128,K=2880"), "sm_90a").key
        served = resolution.resolve("router_gemm", "sm_90a", lambda: missing,
                                reference=lambda: "torch reference")
        hit = REGISTRY.bundle_function("router_gemm", {plan[ARCH][0].id!r}, "sm_90a")
        print(json.dumps({{"where": opened.library_path, "served": served.source,
                           "hit": type(hit).__name__, "counters": counters()}}))
        """
    )
    with read_only_folder(tmp_path / "home") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTE_AOT_", "XDG_"))}
        env["HOME"] = str(home)
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["where"].startswith("memfd:") and report["hit"] == "Function"
    assert report["served"] == "reference"
    assert report["counters"]["router_gemm"]["degradations"] == 2  # overlay, then JIT


def test_a_full_cache_disk_loads_libraries_from_memory(stub_bundles, settings_scope, tmp_path):
    from cute_aot.runtime import library_store

    _, paths, _ = stub_bundles
    bundle = next(p for p in paths if "sm_90a" in p.name)
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        fill(disk)
        settings_scope(CUTE_AOT_CACHE_DIR=str(disk / "cache"))
        with pytest.warns(RuntimeWarning, match="cannot hold verified libraries"):
            opened = open_bundle(bundle, ARCH)
        assert opened.library_path.startswith("memfd:")
        assert isinstance(library_store.store(), library_store.MemoryStore)
        assert not list(disk.rglob("*.so")) and not list(disk.rglob("*.tmp"))


def test_a_miss_log_on_a_read_only_filesystem_warns_once(fresh_runtime, settings_scope, tmp_path):
    import warnings

    with read_only_folder(tmp_path / "ro") as folder:
        settings_scope(CUTE_AOT_MISS_LOG=str(folder / "misses.jsonl"))
        with pytest.warns(RuntimeWarning, match="cannot write the miss log"):
            record_miss(KEY, ARCH, {})
        other = ROUTER.dispatch(ROUTER.parse_problem("M=1,N=24,K=64"), ARCH).key
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            record_miss(other, ARCH, {})  # said once; never raises


@pytest.mark.slow
def test_a_kernel_whose_export_fails_still_serves_and_is_compiled_once(
    fresh_runtime, monkeypatch, tmp_path
):
    """Publishing a JIT result to the overlay fails (here: the linker fails); the compiled kernel
    serves anyway, and the key is not compiled again in this process."""
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'linker refused' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    key = ROUTER.dispatch(ROUTER.parse_problem("M=1,N=128,K=2880"), ARCH).key
    before = jit.compile_count
    with pytest.warns(RuntimeWarning, match="overlay cache off"):
        first = key_function(key, ARCH)
    assert callable(first) and jit.compile_count == before + 1
    assert key_function(key, ARCH) is first and jit.compile_count == before + 1
    assert policy.counters()["router_gemm"]["degradations"] == 1  # the overlay, once


def test_a_bundle_name_linked_to_a_folder_is_skipped_with_one_warning(tmp_path, fresh_runtime):
    """`x.cuteaot` that links to a folder is not read as that folder (it loaded nothing and said
    nothing): one warning names the link and where it points."""
    (tmp_path / "folder").mkdir()
    link = tmp_path / "x.cuteaot"
    link.symlink_to(tmp_path / "folder")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert load_bundles(link) == []
    naming = [str(w.message) for w in said if str(link) in str(w.message)]
    assert len(naming) == 1 and "a link to a folder" in naming[0], [str(w.message) for w in said]
