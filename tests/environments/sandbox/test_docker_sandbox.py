"""DockerSandbox against a real engine (`.ci/docker.sh start`): limits, timeouts, history, reaping.

Skipped only when no engine is reachable and CI is not set; with CI=true a missing engine fails.
"""

import os
import subprocess
import sys
import threading
import time

import pytest
from helpers import DATA
from test_sandbox_local import assert_clean_history, future_history_task

from envs import BASE_IMAGE, DockerSandbox, grade, load_tasks, open_sandbox, reap_containers
from envs.errors import SandboxError
from envs.sandbox.docker_sandbox import LABEL, engine_available

pytestmark = pytest.mark.docker
BUILTIN = DATA / "builtin_tasks"


@pytest.fixture(scope="module")
def client():
    if not engine_available():
        if os.environ.get("CI"):
            pytest.fail("CI is set but no Docker engine is reachable (DOCKER_HOST)")
        pytest.skip("no Docker engine reachable")
    import docker

    c = docker.from_env()
    try:
        c.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        if os.environ.get("CI"):
            pytest.fail(
                f"CI is set but the base image {BASE_IMAGE} is missing (.ci/docker.sh start builds it)"
            )
        pytest.skip(f"base image {BASE_IMAGE} missing; run `python -m envs base`")
    return c


@pytest.fixture(scope="module")
def task(client):
    return load_tasks(BUILTIN)[0]


def _sandbox_containers(client, sandbox_id=None):
    """Names of the sandbox containers (sparse: one listing call, no inspect of each, which would
    race with other tests removing theirs)."""
    found = client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}=1"})
    names = [c.attrs["Names"][0].lstrip("/") for c in found]
    return [n for n in names if sandbox_id is None or n == f"jaxswe-{sandbox_id[:16]}"]


def test_exec_files_and_removal(client, task):
    with open_sandbox(task, "docker", client=client) as sb:
        assert sb.workdir == "/testbed"
        assert sb.exec("pwd").output == "/testbed\n"
        assert sb.exec("echo out; echo err >&2; exit 7").exit_code == 7
        assert sb.exec("cat").exit_code == 0
        assert sb.exec("echo a\x00b").exit_code == 126  # a NUL byte: an error result, no exception
        assert sb.exec("echo $PAGER $GIT_PAGER $TERM").output == "cat cat dumb\n"
        sb.write_file("pkg/new.txt", "hé\n")
        assert sb.exec("cat pkg/new.txt").output == "hé\n" and sb.read_file("/testbed/pkg/new.txt") == "hé\n"
        assert sb.exec("ln -s /etc etc-link").exit_code == 0  # writes resolve with the sandbox user's rights
        with pytest.raises(SandboxError, match="Permission denied"):
            sb.write_file("etc-link/planted.conf", "x\n")
        assert sb.exec("test -e /etc/planted.conf").exit_code == 1
        big = sb.exec("seq 1 200000")
        assert "bytes of output cut" in big.output and big.output.endswith("200000\n")
        name = sb.container.name
        assert client.containers.get(name).attrs["HostConfig"]["NetworkMode"] == "none"
    assert not _sandbox_containers(client, sb.id), name


def test_timeout_kills_every_process_in_the_container(client, task):
    with open_sandbox(task, "docker", client=client) as sb:
        start = time.monotonic()
        r = sb.exec(
            "sleep 101 & nohup sleep 102 >/dev/null 2>&1 & setsid sleep 103 & (setsid nohup sleep 104 >/dev/null 2>&1 &);"  # noqa: E501
            " echo started; sleep 100",
            timeout=1,
        )
        assert r.timed_out and r.exit_code == 124 and r.output == "started\n"
        assert time.monotonic() - start < 1 + 2
        ps = sb.exec("ps -eo args").output
        assert not any(f"sleep 10{i}" in ps for i in range(5)), ps
        assert sb.exec("sleep 105 >/dev/null 2>&1 & echo ok").output == "ok\n"  # outlives its command
        assert "sleep 105" in sb.exec("ps -eo args").output


def test_network_none_and_fork_bomb(client, task):
    with open_sandbox(task, "docker", client=client, pids_limit=64) as sb:
        net = sb.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"")
        assert net.exit_code != 0 and "unreachable" in net.output.lower()
        start = time.monotonic()
        bomb = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 20", timeout=5)
        assert bomb.timed_out and time.monotonic() - start < 5 + 10
        pids = int(
            client.containers.get(sb.container.name).stats(stream=False)["pids_stats"].get("current", 0)
        )
        assert pids <= 64
        assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    assert not _sandbox_containers(client, sb.id)


def test_clean_history_in_the_task_image(client, tmp_path):
    task, base = future_history_task(tmp_path)
    with open_sandbox(task, "docker", client=client) as sb:
        assert_clean_history(sb, base)


def test_grading_on_docker(client, task):
    assert grade(task, task.patch, "docker", client=client).resolved
    assert not grade(task, "", "docker", client=client).resolved
    calc = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
    fake = "print('PASSED tests/test_calc.py::test_add')\n" + calc
    patch = (
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,6 @@\n"
        + "".join("-" + ln for ln in calc.splitlines(keepends=True))
        + "".join("+" + ln for ln in fake.splitlines(keepends=True))
    )
    assert not grade(task, patch, "docker", client=client).resolved


_OWNER = """
import sys, time
from envs import DockerSandbox
sb = DockerSandbox(sys.argv[1], run="sigkill-test")
print(sb.container.name, flush=True)
time.sleep(600)
"""


def test_reap_after_sigkill(client, task):
    from envs.provision.images import task_image

    image, _ = task_image(task, client=client)
    proc = subprocess.Popen([sys.executable, "-c", _OWNER, image], stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert name.startswith("jaxswe-")
    assert reap_containers(client) == [] or name not in reap_containers(client)  # its owner lives
    proc.kill()
    proc.wait()
    assert client.containers.get(name).labels["jaxswe.run"] == "sigkill-test"  # left behind
    assert name in reap_containers(client)
    assert name not in _sandbox_containers(client)


@pytest.mark.parametrize("count", [32])
def test_parallel_sandboxes(client, task, count):
    from envs.provision.images import task_image

    image, _ = task_image(task, client=client)
    errors, names = [], []

    def episode(i):
        try:
            with DockerSandbox(image, client=client, mem_limit="256m", cpus=0.5) as sb:
                names.append(sb.container.name)
                assert sb.exec(f"echo {i} > f && cat f").output == f"{i}\n"
                assert sb.exec("sleep 30", timeout=0.5).timed_out
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(names) == count
    alive = set(_sandbox_containers(client))
    assert not alive & set(names)
