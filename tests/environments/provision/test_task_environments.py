"""The task environment is the grading environment: a src-layout package with no pytest `pythonpath`
setting, and tests that need pytest-mock's `mocker` and pytest-asyncio's auto mode (set in
pyproject.toml), graded as published on both backends: gold resolves, empty does not, with canaries
and no tamper flag (tests/data/env_tasks; the grader once replaced PYTHONPATH and switched plugins
off, so both gold patches scored 0)."""

import os

import pytest
from helpers import DATA

from envs import grade
from envs.sandbox.docker_sandbox import engine_available
from envs.tasks.records import load_builtin

TASKS = load_builtin(DATA / "env_tasks")


def _check(backend: str) -> None:
    assert [t.instance_id for t in TASKS] == ["envfix__plugins-1", "envfix__srclayout-1"]
    for task in TASKS:
        gold, empty = grade(task, task.patch, backend), grade(task, "", backend)
        assert gold.resolved and not gold.tamper and gold.canaries == 2, (task.instance_id, gold.reason)
        assert not empty.resolved and not empty.error and not empty.tamper, (task.instance_id, empty.reason)
        assert all(empty.tests[t] == "FAILED" for t in task.fail_to_pass), empty.tests  # ran, and failed
        assert all(empty.tests[t] == "PASSED" for t in task.pass_to_pass), empty.tests


@pytest.mark.slow
def test_task_environments_local():
    _check("local")


@pytest.mark.docker
def test_task_environments_docker(monkeypatch):
    if not engine_available():
        pytest.skip("no Docker engine reachable")  # a failure in CI (tests/conftest.py)
    if os.environ.get("CI"):
        monkeypatch.setenv("JAXSWE_BUILD_NETWORK", "host")  # an engine run with --bridge=none (CI)
    _check("docker")
