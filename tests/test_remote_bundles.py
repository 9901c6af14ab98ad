"""Bundles at URLs (runtime/remote.py), against real stores started here on loopback: moto's S3
server (its WSGI app, behind a layer that counts each object's GETs) reached through s3fs, and a
plain http.server that counts, slows down or cuts its downloads. The runtime is configured for
them the way an operator would: environment variables only (AWS_ENDPOINT_URL, AWS credentials).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import http.server
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from cute_aot.aot.tools.aot_cache.cli import main as aot_cache
from cute_aot.artifacts import signing
from cute_aot.artifacts.bundle import BUNDLE_SUFFIX, read_manifest
from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.atomic import owner_tag
from cute_aot.artifacts.core.errors import BundleIntegrityError, SignatureError
from cute_aot.runtime import REGISTRY, load_bundles, remote, set_mode
from tests import test_integrity
from tests.conftest import child_env

keys = test_integrity.keys  # the integrity tests' release and stranger keys (a fixture)
ARCH = "sm_90a"
NAME = f"e2e-{ARCH}{BUNDLE_SUFFIX}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached(cache: Path) -> dict[str, list[str]]:
    """The download cache's copies, and anything else in its folder (temporaries)."""
    names = sorted(p.name for p in (cache / "remote").iterdir() if p.is_file())
    copies = [n for n in names if re.fullmatch(r"[0-9a-f]{64}\.cuteaot", n)]
    return {"copies": copies, "other": [n for n in names if n not in copies]}


# -- bundles and trust ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def signed(stub_bundles, keys, tmp_path_factory) -> Path:
    """The stub bundles (both architectures), signed by the release key."""
    out = tmp_path_factory.mktemp("signed")
    for path in stub_bundles[1]:
        shutil.copy(path, out / path.name)
        signing.sign_bundle(out / path.name, keys.release)
    return out


@pytest.fixture
def trusted(fresh_runtime, settings_scope, keys) -> Path:
    """A clean runtime that trusts the release key; its cache dir (a child process that must
    share both gets `child_env()`)."""
    settings_scope(
        CUTE_AOT_TRUSTED_KEYS=str(keys.release_pub),
        CUTE_AOT_REQUIRE_SIGNATURE=None,
        CUTE_AOT_REMOTE_UNSIGNED=None,
    )
    return fresh_runtime


# -- S3 --------------------------------------------------------------------------------------------
class CountingS3:
    """moto's S3 server app (what ThreadedMotoServer serves) on a loopback port; `gets` counts
    the GET requests of each bundle object, as the store saw them."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        self.gets: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()
        app = DomainDispatcherApplication(create_backend_app)

        def counting(environ, start_response):
            if environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"].endswith(BUNDLE_SUFFIX):
                with lock:
                    self.gets[environ["PATH_INFO"]] += 1
            return app(environ, start_response)

        self.server = make_server(
            "127.0.0.1", 0, counting, threaded=True, request_handler=MotoRequestHandler
        )
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # connections are refused from now on


@dataclass
class Bucket:
    store: CountingS3
    name: str
    client: object  # boto3's: the test's own hands on the store, apart from the code under test

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}"


def _aws_environment(monkeypatch, endpoint: str) -> None:
    """What an operator sets: the endpoint and credentials, nothing from this host's ~/.aws."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)


def _bucket(store: CountingS3, monkeypatch) -> Bucket:
    import boto3

    _aws_environment(monkeypatch, store.endpoint)
    name = f"bundles-{secrets.token_hex(4)}"
    client = boto3.client("s3", endpoint_url=store.endpoint)
    client.create_bucket(Bucket=name)
    return Bucket(store, name, client)


@pytest.fixture(scope="module")
def s3_store():
    store = CountingS3()
    yield store
    store.stop()


@pytest.fixture
def bucket(s3_store, monkeypatch) -> Bucket:
    return _bucket(s3_store, monkeypatch)


# -- HTTP ------------------------------------------------------------------------------------------
class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith(BUNDLE_SUFFIX):
            with self.server.lock:
                self.server.gets[self.path] += 1
            time.sleep(self.server.delay)  # a slow link: concurrent ranks would overlap
        super().do_GET()

    def copyfile(self, source, outputfile) -> None:
        if self.server.cut and self.path.endswith(BUNDLE_SUFFIX):
            data = source.read()  # headers promised all of it: send half, then hang up
            outputfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        super().copyfile(source, outputfile)


class HttpStore(http.server.ThreadingHTTPServer):
    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
        self.root, self.url = root, f"http://127.0.0.1:{self.server_port}"
        self.gets: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.delay, self.cut = 0.0, False


@pytest.fixture
def http_store(tmp_path):
    (tmp_path / "www").mkdir()
    store = HttpStore(tmp_path / "www")
    threading.Thread(target=store.serve_forever, daemon=True).start()
    yield store
    store.shutdown()
    store.server_close()


# -- ranks -----------------------------------------------------------------------------------------
RANK = """
import json, sys, time
from pathlib import Path
import fsspec.implementations.http, s3fs  # imported before the start line, as a server would
from cute_aot.runtime import remote
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.002)
print(json.dumps([str(path) for path in remote.fetch(sys.argv[1])]))
"""


def _ranks(url: str, folder: Path, count: int = 8) -> list[list[str]]:
    """`count` processes of one node fetching `url` at the same moment (with this test's
    settings, hence its cache dir and trusted keys); what each got."""
    go = folder / "go"
    ready = [folder / f"ready-{rank}" for rank in range(count)]
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, url, str(path), str(go)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in ready
    ]
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [rank.communicate(timeout=120) for rank in ranks]
    for rank, (_, err) in zip(ranks, results, strict=True):
        assert rank.returncode == 0, err
    return [json.loads(out) for out, _ in results]


# -- tests -----------------------------------------------------------------------------------------
def test_push_then_load_from_an_s3_prefix(bucket, signed, trusted, settings_scope, tmp_path):
    url = bucket.url("release/")
    pushed = CliRunner().invoke(aot_cache, ["push", str(signed), url, "--json"])
    assert pushed.exit_code == 0, pushed.output
    report = {item["name"]: item for item in json.loads(pushed.stdout)["pushed"]}
    for path in signed.glob(f"*{BUNDLE_SUFFIX}"):
        assert report[path.name]["sha256"] == _sha256(path)
        assert report[path.name]["size"] == path.stat().st_size
        assert report[path.name]["signed"] and report[path.name]["url"] == url + path.name

    loaded = load_bundles(url)
    assert sorted(b.arch for b in loaded) == ["sm_100a", "sm_90a"]
    for bundle in loaded:  # content-addressed copies, signed by the release key
        assert bundle.path.parent == trusted / "remote"
        assert bundle.path.name == _sha256(bundle.path) + BUNDLE_SUFFIX
        assert bundle.signer is not None
    (index,) = (trusted / "remote" / "index").iterdir()
    recorded = json.loads(index.read_text())
    assert recorded["url"] == url
    assert {o["name"] for o in recorded["objects"]} == set(report)
    assert all(o["version"] for o in recorded["objects"])  # the ETag lets the next process skip

    # An operator's way: CUTE_AOT_BUNDLES names the URL (its ':' does not split it).
    REGISTRY.clear()
    (tmp_path / "empty").mkdir()
    settings_scope(CUTE_AOT_BUNDLES=f"{tmp_path / 'empty'}:{url}")
    REGISTRY.load_from_env()
    assert sorted(b.path for b in REGISTRY.bundles) == sorted(b.path for b in loaded)
    downloads = {path: n for path, n in bucket.store.gets.items() if bucket.name in path}
    assert downloads == {f"/{bucket.name}/release/{name}": 1 for name in report}  # once, for all

    pulled = CliRunner().invoke(aot_cache, ["pull", url, "--out", str(tmp_path / "out"), "--json"])
    assert pulled.exit_code == 0, pulled.output
    for path in signed.glob(f"*{BUNDLE_SUFFIX}"):
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes()


def test_eight_ranks_download_each_http_bundle_once(http_store, signed, trusted, tmp_path):
    shutil.copytree(signed, http_store.root / "release")
    http_store.delay = 0.3  # long enough for every rank to be asking at once
    results = _ranks(f"{http_store.url}/release/", tmp_path)
    assert all(result == results[0] for result in results) and len(results[0]) == 2
    assert http_store.gets == {f"/release/{p.name}": 1 for p in signed.glob(f"*{BUNDLE_SUFFIX}")}
    assert _cached(trusted) == {"copies": sorted(Path(p).name for p in results[0]), "other": []}


def test_eight_ranks_download_each_s3_bundle_once(bucket, signed, trusted, tmp_path):
    remote.push([signed], bucket.url("release/"))
    results = _ranks(bucket.url("release/"), tmp_path)
    assert all(result == results[0] for result in results) and len(results[0]) == 2
    expected = {f"/{bucket.name}/release/{p.name}": 1 for p in signed.glob(f"*{BUNDLE_SUFFIX}")}
    assert {path: n for path, n in bucket.store.gets.items() if bucket.name in path} == expected
    assert _cached(trusted)["other"] == []


def test_an_unreachable_store_serves_the_verified_copy_and_says_so_once(
    signed, trusted, monkeypatch
):
    store = CountingS3()
    try:
        bucket = _bucket(store, monkeypatch)
        url = bucket.url("release/")
        remote.push([signed], url)
        first = sorted(b.path for b in load_bundles(url))
    finally:
        store.stop()
    REGISTRY.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert sorted(b.path for b in load_bundles(url)) == first
        assert sorted(remote.fetch(url)) == first  # still served; not said again
    offline = [str(w.message) for w in said if "cannot reach" in str(w.message)]
    assert len(offline) == 1 and url in offline[0] and "verified" in offline[0]


def test_an_unreachable_store_without_a_copy_falls_back_or_fails_mode_aot(
    trusted, monkeypatch, settings_scope
):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _aws_environment(monkeypatch, f"http://127.0.0.1:{port}")
    url = "s3://bundles/release/"
    with pytest.raises(OSError, match=re.escape(url)) as raised:
        load_bundles(url)
    assert "no verified copy" in str(raised.value)

    settings_scope(CUTE_AOT_BUNDLES=url)
    set_mode("aot")
    with pytest.raises(OSError, match=re.escape(url)):
        REGISTRY.load_from_env()
    set_mode(None)  # auto: kernels fall back, the source is tried again later
    with pytest.warns(RuntimeWarning, match=re.escape(url)):
        REGISTRY.load_from_env()
    assert REGISTRY.bundles == [] and REGISTRY.env_pending()
    assert _cached(trusted)["copies"] == []


def test_aot_cache_reads_an_http_url_as_a_server_does(http_store, signed, trusted):
    """ls, verify and show take a URL, fetched by the runtime's own reader (remote.fetch): a
    folder URL lists every bundle, a bundle URL shows and verifies the verified copy."""
    shutil.copytree(signed, http_store.root / "release")
    folder, bundle = f"{http_store.url}/release/", f"{http_store.url}/release/{NAME}"
    listed = CliRunner().invoke(aot_cache, ["ls", folder, "--no-overlay", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["bundles"]
    assert sorted(row["arch"] for row in rows) == ["sm_100a", "sm_90a"]
    assert all(row["status"] == "ok" for row in rows), rows
    shown = CliRunner().invoke(aot_cache, ["show", bundle, "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert report["arch"] == ARCH and report["entries"]
    assert Path(report["path"]).read_bytes() == (signed / NAME).read_bytes()
    verified = CliRunner().invoke(aot_cache, ["verify", bundle, "--gpu-arch", ARCH, "--json"])
    assert json.loads(verified.stdout)["bundles"][0]["checks"][0]["status"] == "ok"


@pytest.mark.parametrize("command", ["ls", "verify", "show"])
def test_aot_cache_names_an_unreachable_url_whole_with_the_servers_reason(
    trusted, settings_scope, command
):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x"
    settings_scope(CUTE_AOT_BUNDLES=url)
    with warnings.catch_warnings(record=True) as said:  # a server, given the same URL
        warnings.simplefilter("always")
        REGISTRY.load_from_env()
    (server,) = [str(w.message) for w in said if url in str(w.message)]
    reason = re.search(r"cannot be read now \((.*)\); trying again", server).group(1)
    assert "cannot reach the store" in reason

    result = CliRunner().invoke(aot_cache, [command, url])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if "cannot read" in line]
    assert len(lines) == 1, result.stderr
    assert f"{url}: " in lines[0] and f"cannot read ({reason})" in " ".join(lines[0].split())
    assert "No such file" not in result.output


def test_a_tampered_remote_object_is_refused_and_never_cached(bucket, signed, trusted, keys):
    prefix, key = bucket.url("release/"), f"release/{NAME}"
    remote.push([signed], prefix)
    load_bundles(prefix)
    before = _cached(trusted)
    good = (signed / NAME).read_bytes()

    flipped = bytearray(good)
    flipped[-100] ^= 0x01  # a payload byte: the container's hashes catch it
    bucket.client.put_object(Bucket=bucket.name, Key=key, Body=bytes(flipped))
    REGISTRY.clear()
    with pytest.raises(BundleIntegrityError, match=re.escape(bucket.url(key))):
        remote.fetch(bucket.url(key))
    with pytest.warns(RuntimeWarning, match=re.escape(bucket.url(key))):
        assert [b.arch for b in load_bundles(prefix)] == ["sm_100a"]  # mode auto: the other loads
    set_mode("aot")
    with pytest.raises(BundleIntegrityError, match=re.escape(bucket.url(key))):
        load_bundles(prefix)
    set_mode(None)

    # Edited and re-hashed (a sound container): only the signature tells.
    manifest = read_manifest(signed / NAME)
    edited = dataclasses.replace(manifest, created_by="someone else")
    payload = good[-manifest.payload["size"] :]
    bucket.client.put_object(
        Bucket=bucket.name, Key=key, Body=test_integrity.raw_container(edited.to_json(), payload)
    )
    with pytest.raises(SignatureError, match="does not match"):
        remote.fetch(bucket.url(key))
    stranger = signing.sign_manifest(manifest, keys.stranger)
    bucket.client.put_object(
        Bucket=bucket.name, Key=key, Body=test_integrity.raw_container(stranger.to_json(), payload)
    )
    with pytest.raises(SignatureError, match="not trusted"):
        remote.fetch(bucket.url(key))
    assert _cached(trusted) == before  # nothing refused was kept


def test_an_unsigned_remote_bundle_is_refused_unless_allowed(
    bucket, stub_bundles, trusted, settings_scope
):
    pushed = CliRunner().invoke(aot_cache, ["push", str(stub_bundles[0]), bucket.url("unsigned/")])
    assert pushed.exit_code == 0, pushed.output
    assert settings.REMOTE_UNSIGNED.name in pushed.stderr  # the publisher is told
    url = bucket.url(f"unsigned/{NAME}")
    with pytest.raises(SignatureError, match=settings.REMOTE_UNSIGNED.name):
        remote.fetch(url)
    assert _cached(trusted)["copies"] == []

    settings_scope(CUTE_AOT_REMOTE_UNSIGNED="1")
    assert [b.arch for b in load_bundles(url)] == [ARCH]


def test_an_interrupted_download_is_never_used(http_store, signed, trusted):
    shutil.copytree(signed, http_store.root / "release")
    url = f"{http_store.url}/release/{NAME}"
    # A writer killed mid-download left its temporary: the next fetch removes it.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    leftover = f".download.{owner_tag().replace(f'pid{os.getpid()}', f'pid{dead}')}.x1.tmp"
    (trusted / "remote").mkdir(parents=True)
    (trusted / "remote" / leftover).write_bytes(b"half")

    http_store.cut = True
    with pytest.raises(OSError, match=re.escape(url)) as raised:
        remote.fetch(url)
    assert "no verified copy" in str(raised.value)
    assert http_store.gets[f"/release/{NAME}"] == remote.urls.ATTEMPTS  # retried, then given up
    assert _cached(trusted) == {"copies": [], "other": []}  # no part kept, the leftover gone

    http_store.cut = False  # a later retry succeeds
    (copy,) = remote.fetch(url)
    assert copy.read_bytes() == (signed / NAME).read_bytes()
    assert copy.name == _sha256(signed / NAME) + BUNDLE_SUFFIX


def test_bundle_sources_keep_urls_whole(settings_scope):
    settings_scope(CUTE_AOT_BUNDLES="/a:s3://b/p/:http://127.0.0.1:8080/x/:/c")
    assert settings.bundle_sources() == ["/a", "s3://b/p/", "http://127.0.0.1:8080/x/", "/c"]
