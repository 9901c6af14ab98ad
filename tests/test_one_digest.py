"""One home for digests and store retries, and the digests themselves unchanged.

- Canonical-JSON digests (key ids, tables, build-cache, overlay and shard-plan digests) are made
  by artifacts/digest.py only: `json_digest`/`text_digest` over `canonical_json`.
- Source hashes (a family's modules, the packer's, foreign files, a recorded call's files) are
  made by artifacts/digest.py's `source_digest` only.
- Every call to an fsspec store goes through artifacts/core/urls.py's `store_call` or `retried`,
  which alone decide attempts, backoff and deadlines.
- The digests persisted in bundles, caches and records are what the commit before this one made:
  values pinned here, computed by that commit's code.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cute_aot.artifacts import digest as digests
from cute_aot.artifacts.digest import ABSENT, SPACED, json_digest, source_digest
from tests.package_source import ROOT, package_files, parsed

DIGEST_HOME = ROOT / "artifacts" / "digest.py"
STORE_HOME = ROOT / "artifacts" / "core" / "urls.py"
PROBE = ROOT / "tests" / "data" / "digest_probe.py"
# sha256 over JSON text left where it is:
# - the bundle header's checksum of the manifest bytes as written to the file (read back and
#   checked as bytes), in packer code that is itself hashed into every cache digest;
# - the key id in kernels/keys.py, which is hashed into every family's source hash: editing it
#   would turn every bundle built before stale. Its form is the one json_digest(KEY_ID_LENGTH)
#   writes, which test_key_ids_are_the_digest_s_form checks.
JSON_HASH_ALLOWED = {"artifacts/bundle_writer.py": 1, "kernels/keys.py": 1}
# Pure fsspec methods: no request is made.
PURE_STORE_METHODS = frozenset({"unstrip_protocol"})


def _modules():
    return package_files()


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


def _names(node: ast.AST) -> list[str]:
    """The identifiers of an expression: names and attribute names."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.append(sub.attr)
    return found


def _makes_json(node: ast.AST) -> bool:
    """Whether an expression holds JSON text: json.dumps, an encoder's or a `canonical`
    function's output, or a value named for JSON (`canonical_json()`, `to_json()`, `x_json`)."""
    for name in _names(node):
        lowered = name.lower()
        if lowered == "dumps" or "canonical" in lowered or lowered.endswith("json"):
            return True
    return False


def _hashes(node: ast.AST) -> bool:
    """hashlib.sha256(...), hashlib.new(...), ... (any constructor of the module)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "hashlib"
    )


def _scopes(tree: ast.Module):
    """The module and each function: names are followed within one scope."""
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node


def _own_nodes(scope: ast.AST):
    """The nodes of `scope` outside the functions nested in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += ast.iter_child_nodes(node)


def _assigned(scope: ast.AST) -> list[tuple[list[str], ast.AST]]:
    pairs = []
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign):
            targets = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            pairs.append((targets, node.value))
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            target = [node.target.id] if isinstance(node.target, ast.Name) else []
            pairs.append((target, node.value))
    return pairs


def _hash_objects(scope: ast.AST) -> set[str]:
    return {name for names, value in _assigned(scope) if _hashes(value) for name in names}


def json_digests(path: Path) -> list[str]:
    """file:line of each sha256 (or other hashlib digest) taken over JSON text, directly or
    through a name assigned from JSON in the same function."""
    tree = parsed(path)
    found = []
    for scope in _scopes(tree):
        assigned = _assigned(scope)
        tainted: set[str] = set()
        while True:  # names assigned from JSON, or from names that are
            more = {
                name
                for names, value in assigned
                if _makes_json(value) or tainted & set(_names(value))
                for name in names
            }
            if more <= tainted:
                break
            tainted |= more
        hashers = _hash_objects(scope)
        for node in _own_nodes(scope):
            if not isinstance(node, ast.Call):
                continue
            updates = (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in hashers
            )
            if not (_hashes(node) or updates):
                continue
            arguments = [*node.args, *(k.value for k in node.keywords)]
            if any(_makes_json(a) or tainted & set(_names(a)) for a in arguments):
                found.append(_where(path, node))
    return found


def source_hashes(path: Path) -> list[str]:
    """file:line of each digest updated in a loop with anything but one file's blocks: the
    shape of a hash over several sources (modules, files, their own digests)."""
    tree = parsed(path)
    found = []
    for scope in _scopes(tree):
        hashers = _hash_objects(scope)
        for loop in _own_nodes(scope):
            if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While, *_COMPREHENSIONS)):
                continue
            for node in ast.walk(loop):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "update"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in hashers
                    and not all(isinstance(a, ast.Name) for a in node.args)
                ):
                    found.append(_where(path, node))
    return sorted(set(found), key=lambda site: int(site.rsplit(":", 1)[1]))


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def store_calls(path: Path) -> list[str]:
    """file:line of each request to an fsspec filesystem (a name bound from urls.filesystem()
    or a parameter `fs`) made outside urls.store_call/urls.retried: a call that the one retry
    policy does not cover. Calls inside a function handed to urls.retried are covered."""
    tree = parsed(path)
    retried_steps = {
        node.args[1].id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "retried"
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Name)
    }
    filesystems = {"fs"}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and "filesystem" in _names(node.value.func)
        ):
            target = node.targets[0]
            first = target.elts[0] if isinstance(target, ast.Tuple) else target
            if isinstance(first, ast.Name):
                filesystems.add(first.id)
    found = []
    for scope in _scopes(tree):
        if getattr(scope, "name", None) in retried_steps:
            continue
        for node in _own_nodes(scope):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in filesystems
                and node.func.attr not in PURE_STORE_METHODS
            ):
                found.append(_where(path, node))
    return sorted(found, key=lambda site: int(site.rsplit(":", 1)[1]))


def _marked(marker: str) -> list[int]:
    lines = PROBE.read_text().splitlines()
    return [number for number, line in enumerate(lines, 1) if line.endswith(f"# {marker}")]


def _lines(sites: list[str]) -> list[int]:
    return sorted(int(site.rsplit(":", 1)[1]) for site in sites)


# -- the rules see what they are for -------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "marker", "count"),
    [
        (json_digests, "json digest", 7),
        (source_hashes, "source hash", 2),
        (store_calls, "store call", 3),
    ],
)
def test_the_rules_flag_the_old_forms_and_let_bytes_through(rule, marker, count):
    assert _lines(rule(PROBE)) == _marked(marker)
    assert len(_marked(marker)) == count


# -- one home each -------------------------------------------------------------------------------
def test_canonical_json_digests_are_made_in_one_place():
    found = {}
    for path in _modules():
        if path != DIGEST_HOME:
            for site in json_digests(path):
                found.setdefault(site.rsplit(":", 1)[0], []).append(site)
    extra = [
        site for file, sites in found.items() for site in sites[JSON_HASH_ALLOWED.get(file, 0) :]
    ]
    assert extra == [], "digest JSON with artifacts/digest.py's json_digest: " + ", ".join(extra)


def test_canonical_json_is_spelled_in_one_place():
    """A second spelling of the compact form (an encoder, or json.dumps with its separators)
    would be a second canonical JSON; the manifest's is the one exception (see digest.py)."""
    compact = re.compile(r"""separators=\(\s*["'],["']\s*,\s*["']:["']\s*\)""")
    found = [
        str(path.relative_to(ROOT))
        for path in _modules()
        if path != DIGEST_HOME
        and (compact.search(path.read_text()) or "JSONEncoder(" in path.read_text())
    ]
    assert found == ["artifacts/manifest.py", "kernels/keys.py"]


def test_key_ids_are_the_digest_s_form():
    from cute_aot.artifacts.digest import KEY_ID_LENGTH, text_digest
    from cute_aot.artifacts.digest import canonical_json as one_spelling
    from cute_aot.kernels import family

    for name in ("router_gemm", "gemm_sm90"):
        for key in list(family(name).enumerate_keys("sm_90a"))[:5]:
            assert key.canonical_json() == one_spelling(key.fields())
            assert key.id == text_digest(one_spelling(key.fields()), KEY_ID_LENGTH)


def test_sources_are_hashed_in_one_place():
    found = [site for path in _modules() if path != DIGEST_HOME for site in source_hashes(path)]
    assert found == [], "hash sources with artifacts/digest.py's source_digest: " + ", ".join(found)


def test_every_store_call_is_retried_by_one_policy():
    found = [site for path in _modules() if path != STORE_HOME for site in store_calls(path)]
    assert found == [], "call stores through urls.store_call or urls.retried: " + ", ".join(found)


def test_retry_settings_live_with_the_retry_wrapper():
    """Attempts, backoff and deadlines of store calls are decided in artifacts/core/urls.py only."""
    spelled = re.compile(r"^\s*[A-Z_]*(ATTEMPT|BACKOFF|DEADLINE|RETRIES)[A-Z_]*\s*=", re.M)
    found = [
        str(path.relative_to(ROOT))
        for path in _modules()
        if path != STORE_HOME and spelled.search(path.read_text())
    ]
    assert found == []


# -- the digests are the ones made before --------------------------------------------------------
# Fields of the first default key of each family, and the ids the previous commit gave them.
KEY_IDS = [
    (
        "router_gemm",
        {
            "align_bytes": 16,
            "backend": "dot",
            "block_size": 128,
            "k": 4096,
            "m": 5,
            "num_stages": 0,
            "out_dtype": "float32",
            "pdl": True,
            "split_k": 0,
            "version": 1,
            "w_dtype": "bfloat16",
            "x_dtype": "bfloat16",
        },
        "40940c5b55885675fcf1",
    ),
    (
        "router_gemm",
        {
            "align_bytes": 16,
            "backend": "dot",
            "block_size": 128,
            "k": 4096,
            "m": 1,
            "num_stages": 0,
            "out_dtype": "float32",
            "pdl": True,
            "split_k": 0,
            "version": 1,
            "w_dtype": "bfloat16",
            "x_dtype": "bfloat16",
        },
        "0e059bb80832fb76a711",
    ),
    *(
        (
            family,
            {
                "align_bytes": 16,
                "aligned_n": True,
                "cluster_m": 1,
                "cluster_n": 1,
                "dtype": dtype,
                "has_bias": False,
                "out_dtype": "bfloat16",
                "pdl": True,
                "persistent": False,
                "pingpong": False,
                "promote": False,
                "raster_m": 16,
                "split_k": 1,
                "stages": 4,
                "swap_ab": False,
                "tile_m": 128,
                "tile_n": 256,
                "version": 2,
            },
            key_id,
        )
        for family, dtype, key_id in [
            ("gemm_sm90", "bfloat16", "1f7efa927e6025f07503"),
            ("gemm_sm90_fp8", "float8_e4m3fn", "490a64f62d31ea1573ce"),
        ]
    ),
]


def _key(family: str, fields: dict):
    from cute_aot.kernels import family as find

    return find(family).Key.from_fields(fields)


@pytest.mark.parametrize(("family", "fields", "key_id"), KEY_IDS)
def test_key_ids_are_unchanged(family, fields, key_id):
    key = _key(family, fields)
    assert key.id == key_id
    assert key.symbol == f"{family}_{key_id}"
    assert key.canonical_json() == json.dumps(
        {"family": family, **fields}, sort_keys=True, separators=(",", ":")
    )


def test_recorded_call_ids_are_unchanged():
    from cute_aot.kernels.recorded import RecordedCallKey, canonical

    call = canonical({"target": {"function": "m:f"}, "source": {"m.py": "ab"}, "args": ["é", 1.5]})
    plain = RecordedCallKey(call=call)
    answered = RecordedCallKey(
        call=call, replay='{"examples":[],"hardware":{"sm_count":132,"ü":1}}'
    )
    assert (plain.id, plain.call_id) == ("7b030fc4c57af4ab496b", "7b030fc4c57af4ab496b")
    assert (answered.id, answered.call_id) == ("50ed37cbfdff6b36afd3", "7b030fc4c57af4ab496b")


def test_table_digest_is_unchanged():
    from cute_aot.kernels.tables import Table

    table = Table("f", "sm_90a", {"b": [1, 2.5], "a": "é"})
    assert table.digest == "17652246e47bac3a"


def test_the_two_json_forms_are_unchanged():
    facts = {"b": [1, 2.5], "a": {"é": None}}
    full = "cc0c527fc194154dcfca9819d207d07dfb5c351fba07c5a01cd8fafd78d564d9"
    assert json_digest(facts, separators=SPACED) == full
    assert json_digest(facts, separators=SPACED, length=digests.OVERLAY_LENGTH) == full[:24]
    assert json_digest(facts, length=digests.KEY_ID_LENGTH) == "5378cdf8509c1d5d62ed"
    with pytest.raises(KeyError):
        digests.canonical_json(facts, separators=(",", ": "))  # no third spelling


FIXED_TOOLCHAIN = {
    "cutlass_dsl": {"nvidia-cutlass-dsl": "4.3"},
    "tvm_ffi": "0.1",
    "cuda_runtime_major": 12,
}
ROUTER_KEY = KEY_IDS[0][:2]


def test_build_cache_digests_are_unchanged(tmp_path):
    """The digests of fixed facts, and that an entry's digest is the digest of its facts, whose
    names are these: the values that vary by machine are fixed by giving the facts."""
    from cute_aot.aot import build_cache

    cache = build_cache.BuildCache(tmp_path)
    key = _key(*ROUTER_KEY)
    facts = cache.object_facts(key, "sm_90a")
    assert cache.object_digest(key, "sm_90a") == build_cache.cache_digest(facts)
    assert facts == {
        "cache_format": build_cache.CACHE_FORMAT,
        "key": key.canonical_json(),
        "arch": "sm_90a",
        "toolchain": cache.toolchain,
        "source_hash": build_cache.source_hash("router_gemm"),
        "worker": build_cache.worker_fingerprint(),
    }
    fixed = {
        **facts,
        "toolchain": FIXED_TOOLCHAIN,
        "source_hash": "S" * 64,
        "worker": {"modules": "W", "tools": {"cuobjdump": None}},
    }
    assert build_cache.cache_digest(fixed) == (
        "c19e8ff44b36e28b23887102ef59507179e1cb64e1fa45ab584d8baddfcd6e3a"
    )
    rows = [{"family": "router_gemm", "sha256": "x", "size": 3}]
    bundle = ("n", "sm_90a", "1.0", rows, {"t": {"d": 1}})
    facts = cache.bundle_facts(*bundle)
    assert cache.bundle_digest(*bundle) == build_cache.cache_digest(facts)
    assert facts == {
        "cache_format": build_cache.CACHE_FORMAT,
        "name": "n",
        "arch": "sm_90a",
        "bundle_version": "1.0",
        "created_by": build_cache.PACKAGE_VERSION,
        "toolchain": cache.toolchain,
        "families": {"router_gemm": build_cache.family_facts("router_gemm")},
        "objects": rows,
        "tables": {"t": {"d": 1}},
        "packer": build_cache.packer_fingerprint(),
    }
    fixed = {
        **facts,
        "toolchain": FIXED_TOOLCHAIN,
        "families": {"router_gemm": {"version": 1, "source_hash": "S", "é": [1, 2.5]}},
        "packer": {"code": "P", "zstd": "1.5"},
    }
    assert build_cache.cache_digest(fixed) == (
        "a1eb9c14f847d1fe4a06488752a7a15f4ceaf962c9c44c86e097fb83dbe39204"
    )


def test_overlay_folder_is_unchanged():
    from cute_aot.artifacts import toolchain
    from cute_aot.kernels import family_facts
    from cute_aot.runtime import overlay

    facts = overlay.fingerprint_facts("router_gemm")
    assert overlay.fingerprint("router_gemm") == overlay.fingerprint("router_gemm", facts)
    assert facts == {
        "toolchain": toolchain.fingerprint(),
        "family": "router_gemm",
        "facts": family_facts("router_gemm"),
        "packer": overlay.packer_identity(),
        "signer": overlay.signer_key_id(),
    }
    fixed = {
        "toolchain": FIXED_TOOLCHAIN,
        "family": "router_gemm",
        "facts": {"version": 1, "source_hash": "S", "fam": "router_gemm"},
        "packer": "P" * 64,
        "signer": "K" * 32,
    }
    assert overlay.fingerprint("router_gemm", fixed) == "cf12046b3b5ed2ea7f462702"
    where = overlay.overlay_path(_key(*ROUTER_KEY), "sm_90a").relative_to(overlay.overlay_root())
    folder = overlay.fingerprint("router_gemm")
    assert str(where) == f"{folder}/sm_90a/40940c5b55885675fcf1.cuteaot"


def test_shard_plan_and_signed_record_bytes_are_unchanged():
    from cute_aot.aot import shard
    from cute_aot.artifacts import signing

    plan = shard.plan_record({"sm_90a": [_key(*ROUTER_KEY)]})
    assert shard.plan_sha256(plan) == (
        "3a2cb4e77e679e180189ed6c33bc673b4312df4a7f90982e596f1e4d23d74cf3"
    )
    record = {"sha256": "x", "size": 3, "row": {"é": 1.0}, "signature": {"v": 1}}
    signed = signing.cache_record_bytes("object", "d" * 64, record)
    assert hashlib.sha256(signed).hexdigest() == (
        "cb7f5ba92099510ba7fac447eb66dfb6593573b0ff746859df7d6a2c719f4cac"
    )


def test_source_digest_forms_are_unchanged(tmp_path):
    from cute_aot.kernels.recorded import calls

    named = [("a.b", b"x = 1\n"), ("a.c", ABSENT)]
    assert source_digest(named) == (
        "ecb021081350df6838ce304e8346e046eff6b4ffd2e489bf67eee4d764d9cac0"
    )
    (tmp_path / "one.py").write_bytes(b"one\n")
    (tmp_path / "two.py").write_bytes(b"two\n")
    paths = (str(tmp_path / "one.py"), str(tmp_path / "two.py"))
    assert calls._hash_files(paths) == (
        "a5329b436bdfa399cd0b2c461c23fba4bdf119d47fdf7159726bd892f184d1b4"
    )


# The previous commit's source hashes, written out as it wrote them: the installed files give the
# same values through artifacts/digest.py.
def _previous_module_hash(modules, ordered: bool) -> str:
    digest = hashlib.sha256()
    for name in sorted(modules) if ordered else modules:
        spec = importlib.util.find_spec(name)
        source = Path(spec.origin).read_bytes() if spec and spec.origin else b"<absent>"
        digest.update(name.encode() + b"\0" + source + b"\0")
    return digest.hexdigest()


def test_module_source_hashes_match_the_previous_code():
    from cute_aot import kernels
    from cute_aot.aot import build_cache
    from cute_aot.artifacts import fingerprints

    for name in kernels.families():
        if kernels.family(name).builder_version is not None:
            continue  # identified by its version, not files (tests/test_plain_containers.py)
        modules = kernels.binary_modules(name)
        assert kernels.source_hash(name) == _previous_module_hash(modules, ordered=True), name
    # The packer and the compile worker are versions now; at their first versions they keep the
    # identities the previous code hashed from their files, which earlier caches are keyed by.
    assert fingerprints.packer_identity() == (
        "6305a3084e8ffad9e38cba5d8ba5a838f15649b8ddfe97c04d53c616fa7bf124"
    )
    assert build_cache.worker_fingerprint()["modules"] == (
        "fcdbbcf91c63bcbd8c03dc4200ead95d9309a0d8f058064f990221e47ce2ce4b"
    )


@given(call=st.text(), version=st.integers(min_value=-(2**70), max_value=2**70))
@settings(max_examples=300, deadline=None)
def test_a_recorded_call_s_id_written_in_place_is_the_one_digest_s(call, version):
    """A served call's id is hashed over its JSON escaped and written in place (faster than
    the encoder): for any text, non-ASCII, control characters, quotes and backslashes
    included, it is json_digest's."""
    from cute_aot.artifacts.digest import KEY_ID_LENGTH
    from cute_aot.kernels.recorded import (
        FAMILY,
        RecordedCallKey,
        call_id_of_escaped,
        escaped_json,
    )

    expected = json_digest(
        {"family": FAMILY, "call": call, "version": version}, length=KEY_ID_LENGTH
    )
    assert call_id_of_escaped(escaped_json(call), version) == expected
    assert RecordedCallKey(call=call, version=version).call_id == expected
