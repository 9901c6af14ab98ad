import contextlib
import os
import tempfile

import pytest

from cute_aot.artifacts.core import settings


def pytest_configure(config):
    """Nothing a test does lands in the user's real cache folder: every test, and every process
    a test starts, gets a cache dir and a miss log of this session's own (tests that need their
    own set it again)."""
    session_cache = tempfile.mkdtemp(prefix="cute-aot-tests-")
    os.environ["CUTE_AOT_CACHE_DIR"] = os.path.join(session_cache, "cache")
    os.environ["XDG_CACHE_HOME"] = os.path.join(session_cache, "xdg")
    os.environ.pop("CUTE_AOT_MISS_LOG", None)


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A small build shared by the tests that need one: one dot-product key and one split-K key, for
# both architectures.
PROBLEMS = [(2, 256, 4096), (12, 256, 7168)]  # (M, N, K)
ARCHS = ["sm_90a", "sm_100a"]


def _small_plan():
    from cute_aot.kernels.router_gemm import dispatch

    return {arch: sorted({dispatch(*p, arch) for p in PROBLEMS}, key=str) for arch in ARCHS}


@pytest.fixture(scope="session")
def small_bundles(tmp_path_factory):
    """Real kernels, cross-compiled (tens of seconds): for tests about the kernels' code."""
    from cute_aot.aot.build import build

    out = tmp_path_factory.mktemp("bundles")
    plan = _small_plan()
    paths = build(plan, out, name="e2e", jobs=2, show_progress=False)
    return out, paths, plan


@pytest.fixture(scope="session")
def stub_bundles(tmp_path_factory):
    """The same keys as small_bundles, linked and packed by the real build from stub objects
    (tests/stubs.py; about a second): for format, loader, registry and CLI tests."""
    from cute_aot.aot.build import run_build
    from tests.stubs import stub_compile

    out = tmp_path_factory.mktemp("stub-bundles")
    plan = _small_plan()
    outcome = run_build(plan, out, name="e2e", jobs=1, show_progress=False, worker=stub_compile)
    assert not outcome.failed, outcome.failed
    return out, outcome.bundles, plan


@pytest.fixture
def fake_gpu():
    """One fake H200 (sm_90a) for the test: the op's own checks run against it, unpatched
    (tests/fake_gpu.py; put tensors on it with `on_gpu`). Its patches of torch.cuda are its own,
    so a test's `monkeypatch.undo()` leaves the GPU in place."""
    from tests.fake_gpu import fake_gpu_of

    with fake_gpu_of() as gpu:
        yield gpu


@pytest.fixture
def settings_scope():
    """`settings_scope(CUTE_AOT_MODE="aot", ...)`: settings for the rest of the test, in this
    process only (settings.scope; None: unset), all undone when it ends. A child process sees
    only the environment: give it `child_env()`, or set the variable with monkeypatch."""
    with contextlib.ExitStack() as scopes:
        yield lambda **values: scopes.enter_context(settings.scope(**values))


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that must see this test's settings: os.environ with
    every setting as this process reads it (scoped overrides included; unset ones left out),
    then `extra`."""
    names = {setting.name for setting in settings.SETTINGS}
    env = {name: value for name, value in os.environ.items() if name not in names}
    env.update({name: value for name, value in settings.current().items() if value})
    env.update(extra)
    return env


@pytest.fixture
def fresh_runtime(tmp_path, settings_scope):
    """A clean process-wide runtime with its own cache dir and miss log (in this process: a
    child that must share them gets `child_env()`)."""
    from cute_aot.artifacts.core.notices import forget
    from cute_aot.runtime import REGISTRY, jit, policy, set_mode
    from cute_aot.runtime.misses import forget_recorded

    settings_scope(
        CUTE_AOT_CACHE_DIR=str(tmp_path / "cache"),
        CUTE_AOT_BUNDLES=None,
        CUTE_AOT_MISS_LOG=None,
        CUTE_AOT_MODE=None,
    )
    REGISTRY.clear()
    jit.forget_compiled()
    set_mode(None)
    forget()
    forget_recorded()
    policy.reset_counters()
    yield tmp_path / "cache"
    REGISTRY.clear()
    set_mode(None)
    forget()
