"""A second, private Docker engine for the engine-pool and cluster tests (`.ci/docker.sh start`
with its own directory and no base image: a pool copies it over from the first engine)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest
from helpers import ROOT

from envs import BASE_IMAGE


def docker_sh(action: str, directory: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAXSWE_CI_DOCKER_DIR": directory, "JAXSWE_CI_DOCKER_BASE": "0"}
    return subprocess.run(
        ["bash", str(ROOT / ".ci/docker.sh"), action], env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def second_engine():
    """(URL of the CI engine, URL of a second engine this fixture starts, its directory)."""
    from envs.sandbox.docker_sandbox import engine_available

    if not engine_available():
        if os.environ.get("CI"):
            pytest.fail("CI is set but no Docker engine is reachable (DOCKER_HOST)")
        pytest.skip("no Docker engine reachable")
    import docker

    try:
        docker.from_env().images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        missing = f"base image {BASE_IMAGE} not built; run `python -m envs base`"
    else:
        missing = None
    if missing is None and (shutil.which("dockerd") is None or os.geteuid() != 0):
        missing = "a second Docker engine needs dockerd installed and root (.ci/docker.sh start)"
    if missing:  # CI has both (.ci/run): there a missing one is a failure, not a skip
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    directory = tempfile.mkdtemp(prefix="jaxswe-engine2-", dir="/tmp")
    started = docker_sh("start", directory)
    if started.returncode != 0:
        pytest.fail(f"cannot start a second dockerd: {started.stderr[-1000:]}")
    try:
        yield os.environ.get("DOCKER_HOST", "default"), f"unix://{directory}/docker.sock", directory
    finally:
        docker_sh("stop", directory)
        # its data (the base image, task images: ~10^4 files) goes in the background, not in test time
        subprocess.Popen(["nice", "rm", "-rf", directory], start_new_session=True)
