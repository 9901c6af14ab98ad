"""The release pipeline example (docs/release/): its GitHub Actions matrix and Kubernetes Indexed
Job run docs/release/release.sh; here its steps run as the CI jobs would, as separate processes:
four shards at once (real cross-compiles of a small plan), then the publish step, which merges,
signs, writes wheels and pushes to an S3 server on loopback; a server then loads the URL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cute_aot.runtime import load_bundles
from tests import test_integrity
from tests.test_remote_bundles import _bucket, s3_store  # noqa: F401  (a fixture)

keys = test_integrity.keys  # a fixture
RELEASE = Path(__file__).parents[1] / "docs" / "release"
SHARDS = 4


def test_the_ci_and_kubernetes_examples_run_the_scripts_steps():
    workflow = (RELEASE / "github-actions.yml").read_text()
    k8s = (RELEASE / "k8s-release.yaml").read_text()
    assert (
        "release.sh shard ${{ matrix.shard }} 4" in workflow and "shard: [0, 1, 2, 3]" in workflow
    )
    assert "release.sh shard $JOB_COMPLETION_INDEX 4" in k8s and "completions: 4" in k8s
    assert "release.sh publish" in workflow and '"docs/release/release.sh", "publish"' in k8s
    usage = subprocess.run(["bash", RELEASE / "release.sh"], capture_output=True, text=True)
    assert usage.returncode == 2 and "release.sh shard I N | release.sh publish" in usage.stderr


@pytest.mark.slow
def test_sharded_release_then_wheels_and_an_object_store(
    s3_store,  # noqa: F811
    keys,
    fresh_runtime,
    monkeypatch,
    settings_scope,
    tmp_path,
):
    bucket = _bucket(s3_store, monkeypatch)
    url = bucket.url("cute-aot/v1/")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "ARCHES": "sm_90a",
        "BUILD_ARGS": "--families router_gemm --no-default-shapes --shape 256,4096 -j 1",
        "WORK": str(tmp_path / "release"),
        "CACHE_DIR": str(tmp_path / "build-cache"),
        "SIGN_KEY": str(keys.folder / "release.pem"),
        "RELEASE_URL": url,
    }
    jobs = [
        subprocess.Popen(
            ["bash", RELEASE / "release.sh", "shard", str(i), str(SHARDS)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(SHARDS)
    ]
    for job in jobs:
        output, _ = job.communicate(timeout=900)
        assert job.returncode == 0, output
    shards = sorted(p.name for p in (tmp_path / "release" / "shards").iterdir() if p.is_dir())
    assert shards == [f"default.shard-{i}-of-{SHARDS}" for i in range(SHARDS)]

    published = subprocess.run(
        ["bash", RELEASE / "release.sh", "publish"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert published.returncode == 0, published.stdout + published.stderr
    (wheel,) = (tmp_path / "release" / "dist").glob("*.whl")
    assert re.fullmatch(
        r"cute_aot_bundle_default_sm90a-.+-py3-none-manylinux_2_\d+_x86_64\.whl", wheel.name
    )
    bundle = tmp_path / "release" / "bundles" / "default-sm_90a.cuteaot"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("cute_aot_bundle_default_sm90a/default-sm_90a.cuteaot") == (
            bundle.read_bytes()
        )
    listed = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="cute-aot/v1/")
    assert [o["Key"] for o in listed["Contents"]] == ["cute-aot/v1/default-sm_90a.cuteaot"]

    # the release jobs are done: what follows is this process's own load
    settings_scope(CUTE_AOT_TRUSTED_KEYS=str(keys.release_pub), CUTE_AOT_REQUIRE_SIGNATURE="1")
    (served,) = load_bundles(url, gpu_arch="sm_90a")
    assert served.signer is not None and len(served.entries) == len(served.manifest.entries) > 0
