"""Docker task images layered as SWE-bench layers them: base -> environment -> instance."""

from __future__ import annotations

import subprocess

import pytest
from helpers import REPOS

from envs.provision.backends import open_sandbox
from envs.provision.images import BASE_IMAGE, build_task_image, clean_image_name, env_image
from envs.tasks.records import task_from_record

pytestmark = pytest.mark.docker
BUNDLE = REPOS / "cachetools.bundle"


@pytest.fixture
def client():
    docker = pytest.importorskip("docker")
    from envs.sandbox.docker_sandbox import engine_available

    if not engine_available():
        pytest.skip("no Docker engine")
    client = docker.from_env()
    if not any(BASE_IMAGE in i.tags for i in client.images.list()):
        pytest.skip(f"{BASE_IMAGE} not built")
    return client


def test_environment_and_instance_layers(client, tmp_path, monkeypatch):
    if not BUNDLE.is_file():
        pytest.skip("shared repositories missing")
    monkeypatch.setenv("JAXSWE_CACHE_DIR", str(tmp_path / "cache"))
    if "bridge" not in [n.name for n in client.networks.list()]:
        monkeypatch.setenv("JAXSWE_BUILD_NETWORK", "host")  # an engine run with --bridge=none (CI)
    repo = tmp_path / "cachetools"
    subprocess.run(["git", "clone", "-q", "--bare", str(BUNDLE), str(repo)], check=True)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    recipe = {
        "pre_install": [f"{{ pwd; ls /sys/class/net; }} > /opt/build-net-{tmp_path.name}"],  # in the repo
        "install": "test -f pyproject.toml && echo installed > /opt/instance-layer",
        "test_cmd": "pytest -rA",
    }
    record = {
        "instance_id": "tkem__cachetools-1", "repo": "tkem/cachetools", "base_commit": head.strip(),
        "patch": "", "test_patch": "", "FAIL_TO_PASS": ["tests/test_cache.py::CacheTest::test_defaults"],
        "PASS_TO_PASS": [], "install_config": recipe, "source_dir": str(repo),
    }  # fmt: skip
    task = task_from_record(record)
    built = []
    try:
        env_tag, env = env_image(task, client=client)  # shared with every recipe like it: kept
        assert env_tag.startswith("jaxswe/env:") and env["VIRTUAL_ENV"] == "/opt/jaxswe-venv"
        tag = build_task_image(task, client=client)
        built.append(tag)
        layers = lambda name: client.images.get(name).attrs["RootFS"]["Layers"]  # noqa: E731
        base, envl, inst = layers(BASE_IMAGE), layers(env_tag), layers(tag)
        assert inst[: len(envl)] == envl and envl[: len(base)] == base and len(inst) > len(envl) > len(base)
        # a second task with the same recipe reuses the environment image
        other = task_from_record({**record, "instance_id": "tkem__cachetools-2"})
        assert env_image(other, client=client)[0] == env_tag
        with open_sandbox(task, "docker", timeout=60) as sb:
            assert sb.workdir == "/testbed"
            where, *build_net = sb.exec(f"cat /opt/build-net-{tmp_path.name}").output.split()
            assert where == "/testbed"  # pre_install runs in the repository, as SWE-bench's repo script
            assert any(n != "lo" for n in build_net), build_net  # built with network
            assert sb.exec("ls /sys/class/net").output.split() == ["lo"]  # run with network none
            assert sb.exec("cat /opt/instance-layer").output.strip() == "installed"
            assert sb.exec("command -v python").output.strip() == "/opt/jaxswe-venv/bin/python"
            assert (
                sb.exec("PYTHONPATH=src python -m pytest -q tests/test_cache.py 2>&1 | tail -1").output.count(
                    "passed"
                )
                == 1
            )
    finally:
        for name in reversed(built):
            client.images.remove(name, force=True)


def test_an_images_own_setup_edits_survive_the_episode_and_grading(client):
    """SWE-bench images edit tracked files at setup (Sphinx: `-rA` in tox.ini) and leave the edit
    uncommitted. The agent's patch is taken against the image's start state and grading resets
    protected paths to that state, so the edit stays: here it adds `-rA` to the pytest table of
    pyproject.toml, which the task's log-parsed command needs to see its passing tests."""
    import dataclasses

    from envs import grade
    from envs.tasks.records import load_builtin
    from jaxswe.agent.prompts import load_prompts
    from jaxswe.agent.scaffold import Scaffold

    task = next(t for t in load_builtin() if t.instance_id == "builtin__billsplit-1")
    task = dataclasses.replace(
        task, test_cmd="python -m pytest -p no:cacheprovider | cat", reference_statuses={}
    )
    edited = "jaxswe/test:setup-edits"
    setup = 's/^testpaths = \\["tests"\\]/testpaths = ["tests"]\\naddopts = "-rA"/'
    image = build_task_image(task, client=client)
    container = client.containers.create(image, command=["sed", "-i", setup, "/testbed/pyproject.toml"])
    try:
        container.start()
        assert container.wait(timeout=60)["StatusCode"] == 0
        container.commit(repository=edited.split(":")[0], tag=edited.split(":")[1])
    finally:
        container.remove(force=True)
    task = dataclasses.replace(task, image=edited)
    try:
        with open_sandbox(task, "docker") as sandbox:
            assert 'addopts = "-rA"' in sandbox.read_file("pyproject.toml")
            scaffold = Scaffold(sandbox, load_prompts("default"))
            start = scaffold.start_tree()
            sandbox.write_file("/tmp/gold.diff", task.patch)
            assert sandbox.exec("git apply /tmp/gold.diff").exit_code == 0
            patch = scaffold.diff_patch(start)
        assert "pyproject.toml" not in patch and "billsplit/" in patch
        result = grade(task, patch, "docker")
        assert result.resolved and not result.dropped_paths, (result.reason, result.log[-1500:])
        assert not grade(task, "", "docker").resolved
    finally:
        for tag in (edited, clean_image_name(task)):
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


_VERSION = "python -c 'from importlib.metadata import version; print(version(\"strs\"))'"


def test_a_task_on_another_python_gets_that_python_in_its_image(client, tmp_path, monkeypatch):
    """A recipe naming Python 3.9 (the base has 3.11): the host's 3.9 install is copied into a layer
    at its own path and the task's venv runs it; requirements as swebench cleans them, the editable
    install of the official harness; gold resolves in a Docker sandbox, empty fails."""
    import dataclasses

    from test_task_pythons import _task

    from envs import grade
    from envs.provision.images import image_python

    monkeypatch.setenv("JAXSWE_CACHE_DIR", str(tmp_path / "cache"))
    if "bridge" not in [n.name for n in client.networks.list()]:
        monkeypatch.setenv("JAXSWE_BUILD_NETWORK", "host")  # an engine run with --bridge=none (CI)
    task = _task(tmp_path, packages="requirements.txt", install="python -m pip install -e .")
    # the editable install leaves the egg-info in the checkout, which is on sys.path twice under
    # pytest: Python 3.9 lists its entry points twice, as in an official image (a local venv keeps
    # the metadata in site-packages once); its version reads as published
    task = dataclasses.replace(task, pass_to_pass=tuple(t for t in task.pass_to_pass if "metadata" not in t))
    prefix = image_python(task).prefix
    tag = build_task_image(task, client=client)
    try:
        with open_sandbox(task, "docker", timeout=60) as sb:
            ran = sb.exec("id -u; python -c 'import sys; print(sys.version_info[:2], sys.base_prefix)'")
            assert ran.output.split("\n", 1) == ["1000", f"(3, 9) {prefix}\n"], ran.output
            assert sb.exec(_VERSION).output.strip() == "1.2.3"
        resolved = grade(task, task.patch, "docker", twins=False)
        assert resolved.resolved and not resolved.error, resolved.reason
        empty = grade(task, "", "docker", twins=False)
        assert not empty.resolved and not empty.error and empty.tests["test_strs.py::test_keep"] == "FAILED"
    finally:
        client.images.remove(tag, force=True)
