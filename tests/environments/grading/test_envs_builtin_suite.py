"""Built-in tasks validate (gold resolves, empty does not, its reference statuses are gold's) on the
docker backend: every fourth of the 32 (8 tasks, each its own repository and tests), since the
local backend already grades all of them and Docker's grading path is the same code past the
sandbox (tests/agent/test_agent_swe_env.py plays every gold fix through the agent loop to reward 1,
with a root pdb.py that is reset; tests/environments/provision/test_task_environments.py and the
attack and forgery tests run Docker's sandbox on their own tasks)."""

import os

import pytest

from envs import BASE_IMAGE, load_tasks
from envs.grading.validate import validate_many
from envs.sandbox.docker_sandbox import engine_available
from envs.tasks.builtin_repos import BUILTIN_DIR

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not BUILTIN_DIR.is_dir(), reason="the built-in suite has not landed yet"),
]


def _check(backend: str) -> None:
    tasks = load_tasks("builtin")[::4]
    results = list(validate_many(tasks, backend=backend, workers=4))
    bad = [(r.instance_id, r.reason) for r in results if not r.ok]
    assert not bad, bad
    assert len(results) == len(tasks) > 0


@pytest.mark.docker
def test_builtin_suite_docker():
    if not engine_available():
        if os.environ.get("CI"):
            pytest.fail("CI is set but no Docker engine is reachable")
        pytest.skip("no Docker engine reachable")
    import docker

    try:
        docker.from_env().images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        if os.environ.get("CI"):
            pytest.fail(f"base image {BASE_IMAGE} missing")
        pytest.skip(f"base image {BASE_IMAGE} missing")
    _check("docker")
