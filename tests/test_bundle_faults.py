"""Faults found in reading bundles, each caused for real: FIFOs where bundles are looked for,
libraries declared too large for memory, truncated files behind the trusted cache, and `aot-cache`
finding no bundles without saying so.

Whatever could hang (a FIFO with no writer) or exhaust memory runs in a subprocess with a timeout
or a limit, so a regression fails the test instead of stalling or killing the suite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from cute_aot.aot.tools.aot_cache.cli import main
from cute_aot.artifacts import bundle as bundle_format
from cute_aot.artifacts.bundle import read_manifest
from cute_aot.artifacts.bundle_writer import container
from cute_aot.artifacts.core.errors import BundleIntegrityError
from cute_aot.runtime import REGISTRY, load_bundles
from cute_aot.runtime.paths import expand_bundle_paths

ARCH = "sm_90a"
HANG_S = 20  # far above any of these commands' run time; far below a hung CI job's
MiB = 1 << 20


# -- helpers -------------------------------------------------------------------------------------
@pytest.fixture
def good(stub_bundles) -> Path:
    _, paths, _ = stub_bundles
    return next(p for p in paths if ARCH in p.name)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """The environment of a subprocess: its own cache dir, no bundles from the environment."""
    child = {k: v for k, v in os.environ.items() if k not in ("CUTE_AOT_BUNDLES", "CUTE_AOT_MODE")}
    child["CUTE_AOT_CACHE_DIR"] = str(tmp_path / "cache")
    child["COLUMNS"] = "250"
    return child


def run_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=HANG_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: {' '.join(args)} did not finish in {HANG_S} s")


def run_python(code: str, env: dict[str, str], *args) -> subprocess.CompletedProcess:
    return run_process([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env)


def aot_cache(env: dict[str, str], *args) -> subprocess.CompletedProcess:
    """The `aot-cache` command line, in a process of its own."""
    module = "cute_aot.aot.tools.aot_cache.cli"
    return run_process([sys.executable, "-m", module, *map(str, args)], env)


def cli(*args, env: dict[str, str] | None = None):
    if env is not None:  # None removes a variable the test process may have
        env = {**env, "CUTE_AOT_BUNDLES": env.get("CUTE_AOT_BUNDLES")}
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def lying_bundle(good: Path, payload: bytes, library_size: int, library_sha256: str) -> bytes:
    """The good bundle's manifest over another payload, declaring a library of library_size
    bytes (payload facts honest, so the container checks pass)."""
    manifest = dataclasses.replace(
        read_manifest(good),
        library={"sha256": library_sha256, "size": library_size},
        payload={
            "codec": "zstd",
            "sha256": hashlib.sha256(payload).hexdigest(),
            "size": len(payload),
        },
    )
    return container(manifest, payload)


def padded_frame(size: int, min_payload: int) -> tuple[bytes, str]:
    """A zstd frame inflating to `size` bytes, mostly zeros, with enough random bytes that the
    payload is at least min_payload bytes (under the compression-ratio limit); and the sha256
    of what it inflates to. Streamed: never holds `size` bytes."""
    chunk_size = 16 * MiB
    chunks = -(-size // chunk_size)
    noise = min_payload * 5 // 4 // chunks + 1  # 25% over: zstd squeezes a little
    compressor = zstandard.ZstdCompressor(level=1).compressobj(size=size)
    digest, parts = hashlib.sha256(), []
    for done in range(0, size, chunk_size):
        length = min(chunk_size, size - done)
        chunk = (os.urandom(min(noise, length)) + bytes(chunk_size))[:length]
        digest.update(chunk)
        parts.append(compressor.compress(chunk))
    payload = b"".join(parts) + compressor.flush()
    assert len(payload) >= min_payload
    return payload, digest.hexdigest()


def over_ratio_floor(size: int) -> int:
    return size // bundle_format.MAX_COMPRESSION_RATIO + 64 * 1024


# The child process: read the bundle, report the errors and its peak RSS over the baseline.
# Peak RSS is VmHWM, the peak of this process's own memory map: ru_maxrss carries a parent's
# peak across fork and exec, so a child of a big pytest process would under-report.
READ_AND_MEASURE = """
    import json, resource, sys
    from cute_aot.artifacts.bundle import read_bundle, read_manifest
    from cute_aot.artifacts.core.errors import BundleError

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(l.split()[1]) for l in lines if l.startswith(field + ":")) * 1024

    limit = int(sys.argv[2])
    if limit:  # address space for what is mapped now plus `limit` bytes
        resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + limit, resource.RLIM_INFINITY))
    base = status("VmHWM")
    result = {"error": None, "manifest_error": None}
    try:
        read_manifest(sys.argv[1])
    except BundleError as exc:
        result["manifest_error"] = [type(exc).__name__, str(exc)]
    try:
        read_bundle(sys.argv[1])
    except BundleError as exc:
        result["error"] = [type(exc).__name__, str(exc)]
    except MemoryError as exc:
        result["error"] = ["MemoryError (escaped)", str(exc)]
    result["peak_over_base"] = status("VmHWM") - base
    print(json.dumps(result))
"""


def read_in_child(path: Path, env: dict[str, str], address_limit: int = 0) -> dict:
    done = run_python(READ_AND_MEASURE, env, path, address_limit)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# -- 1. FIFOs, sockets and devices never block a reader ------------------------------------------
@pytest.fixture
def folder_with_fifo(good, tmp_path) -> tuple[Path, Path]:
    """A bundle folder whose first entry by name is a FIFO nobody writes to."""
    folder = tmp_path / "bundles"
    folder.mkdir()
    shutil.copy(good, folder / good.name)
    fifo = folder / f"aa-pipe-{ARCH}.cuteaot"
    os.mkfifo(fifo)
    return folder, fifo


def test_a_folder_lists_only_regular_files(good, folder_with_fifo, tmp_path):
    folder, fifo = folder_with_fifo
    (folder / f"ab-dir-{ARCH}.cuteaot").mkdir()
    (folder / f"ac-null-{ARCH}.cuteaot").symlink_to(os.devnull)
    (folder / f"ad-dangling-{ARCH}.cuteaot").symlink_to(tmp_path / "nowhere")
    (folder / f"ae-link-{ARCH}.cuteaot").symlink_to(good)  # a link to a regular file is fine
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / f"af-socket-{ARCH}.cuteaot"))
        found = expand_bundle_paths([folder])
    assert [p.name for p in found] == [f"ae-link-{ARCH}.cuteaot", good.name]


def test_load_bundles_skips_a_fifo_in_a_folder_and_refuses_one_named(folder_with_fifo, env):
    folder, fifo = folder_with_fifo
    done = run_python(
        """
        import sys
        from cute_aot.artifacts.core.errors import BundleFormatError
        from cute_aot.runtime import load_bundles
        print([b.path.name for b in load_bundles(sys.argv[1], gpu_arch="sm_90a")])
        try:
            load_bundles(sys.argv[2], gpu_arch="sm_90a")
        except BundleFormatError as exc:
            print(exc)
        """,
        env,
        folder,
        fifo,
    )
    assert done.returncode == 0, done.stderr
    loaded, refused = done.stdout.splitlines()
    assert loaded == str([f"e2e-{ARCH}.cuteaot"])
    assert refused == f"{fifo}: cannot read: not a regular file (a FIFO)"


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_aot_cache_skips_a_fifo_in_a_folder(command, folder_with_fifo, env):
    folder, fifo = folder_with_fifo
    done = aot_cache(
        env, command, folder, "--json", *(["--gpu-arch", ARCH] * (command == "verify"))
    )
    assert done.returncode == 0, done.stderr
    assert fifo.name not in done.stdout
    assert [Path(b["path"]).name for b in json.loads(done.stdout)["bundles"]] == [
        f"e2e-{ARCH}.cuteaot"
    ]


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_aot_cache_refuses_a_fifo_named_explicitly(command, folder_with_fifo, env):
    _, fifo = folder_with_fifo
    done = aot_cache(env, command, fifo)
    assert done.returncode == 1
    assert "not a regular file (a FIFO)" in done.stdout + done.stderr


# -- 2. decompression memory ---------------------------------------------------------------------
def test_a_library_over_the_cap_is_refused_from_the_manifest(good, tmp_path, env):
    """An honest 1 GiB declaration in a 2 MB file: refused before a byte is decompressed."""
    size = 1 << 30
    payload, digest = padded_frame(size, over_ratio_floor(size))
    path = tmp_path / f"huge-{ARCH}.cuteaot"
    path.write_bytes(lying_bundle(good, payload, size, digest))
    result = read_in_child(path, env)
    for error in (result["manifest_error"], result["error"]):
        assert error is not None and error[0] == "BundleFormatError", result
        assert error[1].startswith(f"{path}: library size {size} exceeds the limit"), result
    assert result["peak_over_base"] < 200 * MiB, result


@pytest.mark.parametrize("payload_kind", ["short frame", "not zstd"])
def test_a_lie_just_under_the_cap_costs_little_memory(payload_kind, good, tmp_path, env):
    """A declaration just under the cap whose payload inflates to far less, or to nothing: the
    declared size is never allocated up front."""
    size = bundle_format.MAX_LIBRARY_BYTES - 1
    noise = os.urandom(over_ratio_floor(size))  # incompressible: inflates to its own size
    payload = zstandard.ZstdCompressor().compress(noise) if payload_kind == "short frame" else noise
    path = tmp_path / f"lie-{ARCH}.cuteaot"
    path.write_bytes(lying_bundle(good, payload, size, "0" * 64))
    result = read_in_child(path, env)
    assert result["manifest_error"] is None, result
    assert result["error"][0] == "BundleIntegrityError", result
    message = f"{path}: " + (
        f"library decompresses to {len(noise)} bytes, manifest says {size}"
        if payload_kind == "short frame"
        else "payload does not decompress"
    )
    assert result["error"][1].startswith(message), result
    assert result["peak_over_base"] < 200 * MiB, result


@pytest.fixture(scope="module")
def big_honest(stub_bundles, tmp_path_factory) -> tuple[Path, int, Path]:
    """A 256 MiB library, honest; and a copy whose library hash is wrong."""
    _, paths, _ = stub_bundles
    good = next(p for p in paths if ARCH in p.name)
    size = 256 * MiB
    payload, digest = padded_frame(size, over_ratio_floor(size))
    folder = tmp_path_factory.mktemp("big")
    honest, garbage = folder / f"honest-{ARCH}.cuteaot", folder / f"garbage-{ARCH}.cuteaot"
    honest.write_bytes(lying_bundle(good, payload, size, digest))
    garbage.write_bytes(lying_bundle(good, payload, size, "0" * 64))
    return honest, size, garbage


def test_decompression_holds_one_copy_of_the_library(big_honest, env):
    _, size, garbage = big_honest
    result = read_in_child(garbage, env)
    assert result["error"] == ["BundleIntegrityError", f"{garbage}: library hash mismatch"]
    assert result["peak_over_base"] < size * 5 // 4, f"two copies? {result}"


def test_running_out_of_memory_is_a_typed_error_naming_the_file(big_honest, env):
    honest, size, _ = big_honest
    result = read_in_child(honest, env, address_limit=size // 2)
    assert result["error"][0] == "BundleIntegrityError", result
    assert result["error"][1].startswith(f"{honest}: not enough memory"), result


# -- 3. a truncated file is bad wherever it is read ----------------------------------------------
@pytest.fixture
def truncated(good, tmp_path) -> Path:
    path = tmp_path / f"cut-{ARCH}.cuteaot"
    path.write_bytes(good.read_bytes()[:-100])
    return path


def _size_message(path: Path, good: Path, have: int) -> str:
    return f"{path}: file is {have} bytes, its manifest says {good.stat().st_size}"


def test_read_manifest_checks_the_file_size(good, truncated, tmp_path):
    with pytest.raises(BundleIntegrityError) as info:
        read_manifest(truncated)
    assert str(info.value).startswith(_size_message(truncated, good, good.stat().st_size - 100))
    longer = tmp_path / f"long-{ARCH}.cuteaot"
    longer.write_bytes(good.read_bytes() + b"\0")
    with pytest.raises(BundleIntegrityError, match="trailing bytes") as info:
        read_manifest(longer)
    assert str(info.value).startswith(_size_message(longer, good, good.stat().st_size + 1))


def test_ls_show_and_diff_report_a_truncated_bundle(good, truncated):
    message = _size_message(truncated, good, good.stat().st_size - 100)
    listing = cli("ls", truncated, "--no-overlay", "--json")
    assert listing.exit_code == 1
    [row] = json.loads(listing.stdout)["bundles"]
    assert row["status"] == "error" and row["error"].startswith(message)
    for args in (("show", truncated), ("diff", good, truncated), ("diff", truncated, good)):
        result = cli(*args)
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith(f"aot-cache: {message}"), (args, result.stderr)


def test_load_bundles_refuses_a_truncated_bundle_whose_library_is_cached(
    good, truncated, fresh_runtime, env
):
    intact = truncated.with_name(good.name)
    shutil.copy(good, intact)
    [loaded] = load_bundles(intact, gpu_arch=ARCH)  # verifies and caches its library
    assert Path(loaded.library_path).parent == fresh_runtime / "libs"
    REGISTRY.clear()
    message = _size_message(truncated, good, good.stat().st_size - 100)
    with pytest.raises(BundleIntegrityError) as info:  # this process has the library loaded
        load_bundles(truncated, gpu_arch=ARCH)
    assert str(info.value).startswith(message)
    env["CUTE_AOT_CACHE_DIR"] = str(fresh_runtime)  # another process trusts the cached copy
    done = run_python(
        """
        import sys
        from cute_aot.artifacts.core.errors import BundleIntegrityError
        from cute_aot.runtime import load_bundles
        try:
            load_bundles(sys.argv[1], gpu_arch="sm_90a")
        except BundleIntegrityError as exc:
            print(exc)
        """,
        env,
        truncated,
    )
    assert done.returncode == 0 and done.stdout.startswith(message), done.stdout + done.stderr


# -- 4. aot-cache finds what the runtime loads, and says when it finds nothing -------------------
SHAPE = ("--shape", "12,256,7168")  # docs/cli.md's explain example: M, N, K


def test_explain_says_when_no_bundles_are_found(tmp_path, env):
    empty = tmp_path / "empty"
    empty.mkdir()
    for extra, where in (((), "CUTE_AOT_BUNDLES is unset"), (("--bundle", empty), str(empty))):
        result = cli("explain", "router_gemm", *SHAPE, "--arch", ARCH, *extra, env=env)
        assert result.exit_code == 0, result.output
        [line] = [line for line in result.stderr.splitlines() if "no bundles found" in line.lower()]
        assert where in line and "CUTE_AOT_BUNDLES" in line and "--bundle bundles/" in line


def test_ls_says_when_no_bundles_are_found(tmp_path, env):
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, where in (((), "CUTE_AOT_BUNDLES is unset"), ((empty,), str(empty))):
        result = cli("ls", *args, env=env)
        assert result.exit_code == 0, result.output
        [line] = [line for line in result.stderr.splitlines() if "no bundles found" in line.lower()]
        assert where in line and "CUTE_AOT_BUNDLES" in line and "aot-cache ls bundles/" in line


def test_ls_and_verify_of_an_empty_folder_say_so_in_the_same_line(tmp_path, env):
    """One line each, naming the folder: an empty listing is an answer (ls exits 0), a check of
    nothing passes nothing (verify exits 1)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for command, status in (("ls", 0), ("verify", 1)):
        result = cli(command, empty, env=env)
        assert result.exit_code == status, result.output
        [line] = [line for line in result.stderr.splitlines() if "no bundles found" in line]
        assert f"no bundles found in {empty}: name the folder aot-build wrote" in line


def test_the_readme_explain_example_finds_the_bundle_the_runtime_loads(stub_bundles, env):
    folder, _, _ = stub_bundles
    env["CUTE_AOT_BUNDLES"] = str(folder)
    result = cli(
        "explain",
        "router_gemm",
        *SHAPE,
        "--dtype",
        "bf16",
        "--arch",
        ARCH,
        "--mode",
        "aot",
        "--json",
        env=env,
    )
    assert result.exit_code == 0, result.output
    [decision] = json.loads(result.stdout)["decisions"]
    assert decision["source"] == "bundle" and decision["path"] == str(
        folder / f"e2e-{ARCH}.cuteaot"
    )
    assert "no bundles found" not in result.stderr.lower()
