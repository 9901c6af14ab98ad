"""A DSL variable that changes generated code (cutlass-dsl 4.9's extension-compiler switch, the
optimization level, line info...) is part of the toolchain fingerprint: the build cache and the
overlay key on it, so code made under one setting is never served for the other, and the
manifest records it. Servers do not compile: a bundle built under either setting loads."""

from __future__ import annotations

import pytest

from cute_aot.aot.build import run_build
from cute_aot.aot.build_cache import BuildCache
from cute_aot.artifacts import toolchain
from cute_aot.artifacts.bundle import read_manifest
from cute_aot.kernels.router_gemm import dispatch
from cute_aot.runtime import overlay
from cute_aot.runtime.loader import open_bundle
from tests.stubs import stub_compile, stub_value

ARCH = "sm_90a"
SWITCH = "CUTE_DSL_USE_EXTENSION_COMPILER"


@pytest.fixture
def no_codegen_env(monkeypatch):
    for name in toolchain.CODEGEN_ENV:
        monkeypatch.delenv(name, raising=False)


def test_with_no_variable_set_the_fingerprint_is_what_it_always_was(no_codegen_env):
    assert set(toolchain.fingerprint()) == {"cutlass_dsl", "tvm_ffi", "cuda_runtime_major"}


def test_the_compiler_switch_separates_the_caches(no_codegen_env, monkeypatch, tmp_path):
    key = dispatch(1, 128, 2880, ARCH)
    default_object = BuildCache(tmp_path).object_digest(key, ARCH)
    default_overlay = overlay.fingerprint(key.FAMILY)
    monkeypatch.setenv(SWITCH, "0")
    assert toolchain.fingerprint()["codegen_env"] == {SWITCH: "0"}
    switched_object = BuildCache(tmp_path).object_digest(key, ARCH)
    assert switched_object != default_object
    assert overlay.fingerprint(key.FAMILY) != default_overlay
    monkeypatch.setenv(SWITCH, "1")  # either value is its own code
    assert BuildCache(tmp_path).object_digest(key, ARCH) not in (default_object, switched_object)


def test_a_bundle_records_the_switch_and_loads_without_it(
    no_codegen_env, monkeypatch, tmp_path, fresh_runtime
):
    key = dispatch(1, 128, 2880, ARCH)
    monkeypatch.setenv(SWITCH, "0")
    outcome = run_build(
        {ARCH: [key]}, tmp_path / "out", jobs=1, show_progress=False, worker=stub_compile
    )
    (path,) = outcome.bundles
    assert read_manifest(path).toolchain["codegen_env"] == {SWITCH: "0"}
    monkeypatch.delenv(SWITCH)  # a server's environment: nothing set
    bundle = open_bundle(path, ARCH)
    assert bundle.function(key.id)() == stub_value(key.id)
