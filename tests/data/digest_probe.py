# What tests/test_one_digest.py must flag: the digests as they were written before
# artifacts/digest.py (lines ending in "json digest", "source hash" or "store call"), and what
# it must let through (sha256 of bytes, of a URL or host name; calls inside a retried step).
import hashlib
import json
from pathlib import Path

from cute_aot.artifacts.core import urls

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def canonical(value):
    return _CANONICAL.encode(value)


def build_cache_digest(facts):
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()  # json digest


def overlay_fingerprint(f):
    return hashlib.sha256(json.dumps(f, sort_keys=True).encode()).hexdigest()[:24]  # json digest


def key_id(key):
    return hashlib.sha256(key.canonical_json().encode()).hexdigest()[:20]  # json digest


def recorded_id(identity):
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:20]  # json digest


def call_id(family, call, version):
    identity = canonical({"family": family, "call": call, "version": version})
    return hashlib.sha256(identity.encode()).hexdigest()[:20]  # json digest


def table_digest(family, arch, data):
    text = json.dumps({"family": family, "arch": arch, "data": data}, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]  # json digest


def manifest_hash(manifest):
    raw = manifest.to_json()
    return hashlib.sha256(raw).digest()  # json digest


def hash_modules(modules, read):
    digest = hashlib.sha256()
    for module in sorted(modules):
        digest.update(module.encode() + b"\0" + read(module) + b"\0")  # source hash
    return digest.hexdigest()


def hash_files(paths, sha256_file):
    digest = hashlib.sha256()
    for path in paths:
        digest.update(sha256_file(path)[0].encode())  # source hash
    return digest.hexdigest()


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest(), hashlib.sha256(Path(path).read_bytes()).hexdigest()


def url_id(url, host):
    return hashlib.sha256(url.encode()).hexdigest()[:32], hashlib.sha256(host.encode()).digest()


def fetch(url, tmp):
    fs, root = urls.filesystem(url)
    names = fs.find(root)  # store call
    data = fs.cat_file(names[0])  # store call

    def once():
        fs.get_file(root, tmp)  # retried as a whole below: let through
        return fs.unstrip_protocol(root)

    return data, urls.retried(url, once), urls.store_call(url, fs, "info", root)


def push(fs, path, target):
    fs.put_file(path, target)  # store call
