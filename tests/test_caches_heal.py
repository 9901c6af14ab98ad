"""Caches heal: a refused overlay entry is replaced, not served around forever; the overlay's
fingerprint covers everything that changes an entry's bytes; sources hash exactly what shapes a
binary."""

import json
import subprocess
import sys
import textwrap

import pytest

from cute_aot import kernels
from cute_aot.artifacts.core.atomic import publish_once
from cute_aot.kernels import family
from cute_aot.runtime import jit, overlay
from cute_aot.runtime.resolution import key_function

ARCH = "sm_90a"
ROUTER = family("router_gemm")
MISS_KEY = ROUTER.dispatch(ROUTER.parse_problem("1,128,2880"), ARCH).key  # not in any bundle


def test_a_refused_entry_is_set_aside_and_replaced(fresh_runtime):
    path = overlay.overlay_path(MISS_KEY, ARCH)
    assert publish_once(path, b"a damaged or foreign entry")
    assert overlay.publish(MISS_KEY, ARCH, b"the new entry")
    assert path.read_bytes() == b"the new entry"
    (aside,) = path.parent.glob(f"*{overlay.REFUSED_MARK}*")
    assert aside.read_bytes() == b"a damaged or foreign entry"


def _overlay_entry(key, scratch) -> bytes:
    """A real overlay entry of `key`, made as the JIT makes one (runtime/jit.py): its object (a
    stub from the system C compiler, tests/stubs.py) linked, packed and signed with the overlay
    key, so it passes every check of the overlay's verification."""
    from cute_aot.artifacts.pack import pack_bundle
    from cute_aot.kernels import bundle_facts
    from tests.stubs import stub_compile

    row = stub_compile(key.FAMILY, key.fields(), ARCH, str(scratch))
    facts = bundle_facts({key.FAMILY}, ARCH)
    _, data = pack_bundle(f"overlay-{key.id}", ARCH, {key: row}, facts, sign=overlay.sign)
    return data


def test_a_good_entry_still_wins(fresh_runtime, tmp_path):
    from cute_aot.runtime import loader

    path = overlay.overlay_path(MISS_KEY, ARCH)
    first = _overlay_entry(MISS_KEY, tmp_path)
    assert publish_once(path, first)
    loader.verify_bundle(path, ARCH, trust=overlay.check_trust)  # it verifies, as publish asks
    assert not overlay.publish(MISS_KEY, ARCH, b"a later one")
    assert path.read_bytes() == first
    assert not list(path.parent.glob(f"*{overlay.REFUSED_MARK}*"))  # nothing was set aside


def test_set_aside_leaves_a_file_that_replaced_the_refused_one(fresh_runtime):
    path = overlay.overlay_path(MISS_KEY, ARCH)
    publish_once(path, b"refused")
    refused = overlay.identity(path)
    path.unlink()
    publish_once(path, b"someone else's good entry")
    assert not overlay.set_aside(path, refused)
    assert path.read_bytes() == b"someone else's good entry"


def test_overlay_fingerprint_covers_what_changes_the_bytes(fresh_runtime):
    base = overlay.fingerprint("router_gemm")
    assert base == overlay.fingerprint("router_gemm")
    facts = overlay.fingerprint_facts("router_gemm")
    assert base == overlay.fingerprint("router_gemm", facts)  # the folder is the facts' digest
    family = kernels.family_facts("router_gemm")
    assert facts["facts"] == family and facts["packer"] == overlay.packer_identity()
    for changed in ({**family, "abi": []}, {**family, "version": 99}):
        assert overlay.fingerprint("router_gemm", {**facts, "facts": changed}) != base
    other_packer = {**facts, "packer": "other packer or format version"}
    assert overlay.fingerprint("router_gemm", other_packer) != base


def test_the_packer_identity_moves_with_the_format_and_the_packer_version():
    from cute_aot.artifacts.fingerprints import PACKER_VERSION, packer_identity
    from cute_aot.artifacts.manifest import FORMAT_VERSION

    identities = {
        packer_identity(),
        packer_identity(FORMAT_VERSION + 1, PACKER_VERSION),
        packer_identity(FORMAT_VERSION, PACKER_VERSION + 1),
    }
    assert len(identities) == 3
    assert packer_identity() == packer_identity(FORMAT_VERSION, PACKER_VERSION)


def test_source_hash_covers_the_code_that_shapes_binaries_and_nothing_else():
    from cute_aot.artifacts.digest import module_source, source_digest

    base = kernels.source_hash("router_gemm")
    modules = kernels.binary_modules("router_gemm")
    assert modules == [
        "cute_aot.kernels.keys",
        "cute_aot.kernels.router_gemm.build",
        "cute_aot.kernels.router_gemm.dot_product",
        "cute_aot.kernels.router_gemm.split_k",
    ]
    sources = {module: module_source(module) for module in modules}
    assert base == source_digest(sorted(sources.items()))  # exactly these files, as installed
    for module in modules:  # a change to any of them changes the hash
        changed = {**sources, module: sources[module] + b"\n# changed\n"}
        assert source_digest(sorted(changed.items())) != base, module
    # the dispatch rule and its tuned tables choose keys; they never change a key's binary
    assert "cute_aot.kernels.router_gemm" not in modules
    assert kernels.source_hash("router_gemm") == base


def test_source_hash_imports_no_cutlass():
    script = (
        "import sys; from cute_aot.kernels import source_hash; source_hash('router_gemm'); "
        "print(any(m.split('.')[0] == 'cutlass' for m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.slow
def test_a_damaged_overlay_entry_is_replaced_and_used_by_the_next_process(fresh_runtime):
    path = overlay.overlay_path(MISS_KEY, ARCH)
    publish_once(path, b"damaged")
    before = jit.compile_count
    with pytest.warns(RuntimeWarning, match="ignoring overlay entry.*set aside"):
        key_function(MISS_KEY, ARCH, {"m": 1, "k": 2880, "n": 128})
    assert jit.compile_count == before + 1
    assert path.read_bytes() != b"damaged" and path.read_bytes().startswith(b"CUTEAOT")
    script = textwrap.dedent(
        f"""
        import json, sys
        from cute_aot.kernels import family
        from cute_aot.runtime import REGISTRY, jit
        from cute_aot.runtime.resolution import key_function
        router = family("router_gemm")
        key = router.dispatch(router.parse_problem("1,128,2880"), "{ARCH}").key
        function = key_function(key, "{ARCH}")
        print(json.dumps({{"compiles": jit.compile_count, "type": type(function).__name__,
                           "cutlass": any(m.split(".")[0] == "cutlass" for m in sys.modules)}}))
        """
    )
    env = {"CUTE_AOT_CACHE_DIR": str(fresh_runtime), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"compiles": 0, "type": "Function", "cutlass": False}


# -- the overlay's own trust policy ----------------------------------------------------------------
def _entry(fresh_runtime, sign: bool):
    """A one-kernel bundle at its overlay path (manifest only matters: trust is checked first)."""
    import dataclasses

    from cute_aot.artifacts.bundle import read_manifest
    from cute_aot.artifacts.bundle_writer import encode_bundle
    from tests.test_bundle import _manifest

    path = overlay.overlay_path(MISS_KEY, ARCH)
    manifest = dataclasses.replace(_manifest(), name=f"overlay-{MISS_KEY.id}")
    # as the JIT publishes: signed once the hashes are in (pack_bundle(..., sign=overlay.sign))
    _, data = encode_bundle(manifest, b"not a library", sign=overlay.sign if sign else None)
    assert publish_once(path, data)
    return path, read_manifest(path)


def test_overlay_entries_are_signed_with_a_private_per_user_key(fresh_runtime):
    path, manifest = _entry(fresh_runtime, sign=True)
    key_file = overlay.signing_key_path()
    assert key_file.stat().st_mode & 0o777 == 0o600
    signer = overlay.check_trust(path, manifest)
    assert signer.key_id == overlay.signer_key_id()


def test_unsigned_overlay_entries_need_a_private_folder_and_no_signature_policy(
    fresh_runtime, settings_scope
):
    from cute_aot.artifacts.core.errors import SignatureError

    path, manifest = _entry(fresh_runtime, sign=False)
    assert overlay.check_trust(path, manifest) is None  # only this user could have written it
    path.parent.chmod(0o777)  # now anyone could have
    with pytest.raises(SignatureError, match="folder other users can write"):
        overlay.check_trust(path, manifest)
    path.parent.chmod(0o755)
    settings_scope(CUTE_AOT_REQUIRE_SIGNATURE="1")
    with pytest.raises(SignatureError, match="unsigned overlay entry and CUTE_AOT_REQUIRE"):
        overlay.check_trust(path, manifest)


def test_an_overlay_entry_signed_by_another_key_is_refused(fresh_runtime, settings_scope, tmp_path):
    from cute_aot.artifacts.core.errors import SignatureError

    path, manifest = _entry(fresh_runtime, sign=True)
    settings_scope(CUTE_AOT_OVERLAY_KEY=str(tmp_path / "another-hosts-key.pem"))
    overlay._signing_key.cache_clear()
    try:
        with pytest.raises(SignatureError, match="not trusted"):
            overlay.check_trust(path, manifest)
    finally:
        overlay._signing_key.cache_clear()
