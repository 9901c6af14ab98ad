import pytest


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


# A real, small build shared by the tests that need one: one dot-product key and one split-K key,
# for both architectures.
PROBLEMS = [(2, 4096, 256), (12, 7168, 256)]
ARCHS = ["sm_90a", "sm_100a"]


@pytest.fixture(scope="session")
def small_bundles(tmp_path_factory):
    from cute_aot.aot.build import build
    from cute_aot.kernels.router_gemm import dispatch

    out = tmp_path_factory.mktemp("bundles")
    plan = {arch: sorted({dispatch(*p, arch) for p in PROBLEMS}, key=str) for arch in ARCHS}
    paths = build(plan, out, name="e2e", jobs=2, show_progress=False)
    return out, paths, plan


@pytest.fixture
def fresh_runtime(tmp_path, monkeypatch):
    """A clean process-wide runtime with its own cache dir and miss log."""
    from cute_aot.runtime import REGISTRY, set_mode
    from cute_aot.runtime.notices import forget

    monkeypatch.setenv("CUTE_AOT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUTE_AOT_BUNDLES", raising=False)
    monkeypatch.delenv("CUTE_AOT_MISS_LOG", raising=False)
    monkeypatch.delenv("CUTE_AOT_MODE", raising=False)
    REGISTRY.clear()
    set_mode(None)
    forget()
    yield tmp_path / "cache"
    REGISTRY.clear()
    set_mode(None)
    forget()
