"""The sandbox pool over many Docker engines (envs.provision.engines): placement by load and capacity, waiting
when full, dead engines skipped and rejoining; against two real engines, an engine killed under an
episode makes it an infrastructure failure and later sandboxes land on the survivor.

The second engine is this test's own: `.ci/docker.sh start` with a private directory and no base image
(the pool copies it over from the first engine). The docker tests are skipped where no engine is
reachable (outside CI) or where dockerd is not installed, with the reason."""

import asyncio
import threading
import time
from pathlib import Path

import pytest
from helpers import DATA, free_port
from second_engine import docker_sh, second_engine

from envs import load_tasks, open_sandbox
from envs.errors import EngineError, SandboxError
from envs.provision import engines as engines_module
from envs.provision.engines import Engine, EnginePool, EngineSpec, parse_specs

BUILTIN = DATA / "builtin_tasks"


# -- placement, no engine needed ---------------------------------------------------------------
@pytest.fixture
def fake_pings(monkeypatch):
    """Engines answer pings unless their name is in the returned set."""
    down: set[str] = set()
    monkeypatch.setattr(Engine, "ping", lambda self, timeout=1.0: "refused" if self.name in down else None)
    return down


def _pool(*capacities, **kw):
    specs = [EngineSpec(f"unix:///e{i}.sock", capacity=c, name=f"e{i}") for i, c in enumerate(capacities)]
    return EnginePool(specs, health_interval_s=0, **kw)


def test_placement_by_load_and_capacity_waits_when_full(fake_pings):
    pool = _pool(2, 1)
    # load = open / capacity: e0 (0/2) -> e1 (0/1 beats 1/2) -> e0 (e1 full); then every slot is taken
    got = [pool.acquire().name for _ in range(3)]
    assert got == ["e0", "e1", "e0"]
    waiter: list[str] = []
    thread = threading.Thread(target=lambda: waiter.append(pool.acquire(timeout=10).name))
    thread.start()
    time.sleep(0.3)
    assert not waiter  # waits while every engine is full
    pool.release(pool.engines[1])
    thread.join(5)
    assert waiter == ["e1"]
    with pytest.raises(EngineError, match="no free sandbox slot"):
        pool.acquire(timeout=0.2)
    stop, gave_up = threading.Event(), []  # a waiter whose episode was closed stops waiting
    thread = threading.Thread(
        target=lambda: gave_up.append(pytest.raises(EngineError, pool.acquire, stop=stop))
    )
    thread.start()
    time.sleep(0.3)
    stop.set()
    thread.join(5)
    assert gave_up and "stopped waiting" in str(gave_up[0].value)


def test_dead_engine_is_skipped_and_rejoins(fake_pings):
    pool = _pool(4, 4, dead_timeout_s=0.5)
    fake_pings.add("e0")
    assert [e.name for e in pool.check()] == ["e1"]
    assert [pool.acquire().name for _ in range(2)] == ["e1", "e1"]
    fake_pings.clear()
    pool.engines[0]._reaped = True  # nothing to reap on a fake engine
    assert len(pool.check()) == 2  # answers again: rejoined
    assert pool.acquire().name == "e0"
    assert [ev[1:] for ev in pool.events] == [("e0", "dead: refused"), ("e0", "rejoined")]
    fake_pings.update({"e0", "e1"})
    assert pool.check() == []
    with pytest.raises(EngineError, match="no Docker engine answers"):
        pool.acquire()


class _FakeSandbox:
    """Dies (the container stops) at its first command, as a policy's OOM or an engine's shutdown."""

    dead = False
    workdir = "/testbed"

    def exec(self, command, timeout=None):
        from envs import ExecResult

        self.dead = True
        return ExecResult("the sandbox is gone\n", 137)

    def close(self):
        pass


@pytest.mark.parametrize("engine_up", [True, False])
def test_a_dead_container_is_the_policys_only_while_its_engine_answers(fake_pings, monkeypatch, engine_up):
    from envs.provision import engines
    from envs.provision.engines import PooledSandbox

    monkeypatch.setattr(engines, "DEATH_CONFIRM_S", 0.0)
    pool = _pool(1)
    engine = pool.acquire()
    box = PooledSandbox(pool, engine, engine.generation, _FakeSandbox())
    if not engine_up:
        fake_pings.add("e0")
        with pytest.raises(EngineError, match="Docker engine e0 failed"):
            box.exec("true")
    else:
        assert box.exec("true").exit_code == 137 and box.dead  # the policy's: SWEEnv scores it 0
    box.close()
    assert pool.load()["e0"] == (0, 1, engine_up)


def test_grading_on_a_dead_pool_is_an_infrastructure_failure():
    from envs import grade

    class DeadPool:
        def open(self, task, **limits):
            raise EngineError("no Docker engine answers")

    task = load_tasks(BUILTIN)[0]
    result = grade(task, task.patch, "docker", pool=DeadPool())
    assert result.error and not result.resolved and "no Docker engine answers" in result.reason


def test_specs_and_config():
    from jaxswe.config import ConfigError, config_from_dict

    cfg = config_from_dict(
        {"env": {"backend": "docker", "docker_hosts": [
            "unix:///a.sock", {"url": "tcp://b:2376", "capacity": 3, "tls_ca": "/ca.pem"}]}}
    )  # fmt: skip
    specs = parse_specs(h.model_dump() for h in cfg.env.docker_hosts)
    assert [(s.url, s.capacity) for s in specs] == [("unix:///a.sock", 8), ("tcp://b:2376", 3)]
    assert config_from_dict({}).env.docker_hosts == []  # default: DOCKER_HOST alone, no pool
    with pytest.raises(ConfigError, match="docker_hosts"):
        config_from_dict({"env": {"docker_hosts": ["http://x"]}})
    with pytest.raises(SandboxError, match="twice"):
        parse_specs(["unix:///a.sock", "unix:///a.sock"])


def test_a_run_refuses_a_pool_where_no_engine_answers(tmp_path, capsys):
    from envs.provision.engines import configure, default_pool
    from jaxswe.config import config_from_dict
    from jaxswe.errors import UserError
    from jaxswe.stages.context import start_engine_pool

    hosts = [f"unix://{tmp_path}/a.sock", {"url": f"unix://{tmp_path}/b.sock", "capacity": 2}]
    cfg = config_from_dict({"env": {"backend": "docker", "docker_hosts": hosts}})
    try:
        with pytest.raises(UserError, match="no Docker engine of env.docker_hosts answers"):
            start_engine_pool(cfg)
        assert [e.spec.capacity for e in default_pool().engines] == [8, 2]
        assert "b.sock (capacity 2) does NOT answer" in capsys.readouterr().err
    finally:
        configure(None)


# -- two real engines ----------------------------------------------------------------------------
engines = second_engine  # the module's fixture: (CI engine URL, a second engine's URL, its directory)


class _Killer:
    """The model's double: replays `replies`, stopping the second engine before reply `kill_at`."""

    def __init__(self, tok, replies, kill_at, directory):
        self.tok, self.replies, self.kill_at, self.directory = tok, replies, kill_at, directory
        self.turn = 0
        self.eot = tok.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, input_ids, params):
        from jaxswe.rollout.types import Generation

        if self.turn == self.kill_at:
            assert docker_sh("stop", self.directory).returncode == 0
        reply = self.replies[self.turn]
        self.turn += 1
        ids = self.tok.encode(reply, add_special_tokens=False) + [self.eot]
        return Generation(ids, [-0.5] * len(ids), "stop")


@pytest.mark.docker
def test_two_engines_spread_failover_and_rejoin(engines, monkeypatch):
    from jaxswe.agent.demos import command_reply
    from jaxswe.agent.loop import run_episode
    from jaxswe.agent.swe_env import SWEEnv
    from jaxswe.rollout.types import SamplingParams
    from jaxswe.tokenizer import build_tokenizer

    first, second, directory = engines
    task = load_tasks(BUILTIN)[0]
    pool = EnginePool(
        [EngineSpec(first, capacity=2, name="ci"), EngineSpec(second, capacity=1, name="second")],
        health_interval_s=0.5, dead_timeout_s=5,
    )  # fmt: skip
    try:
        # spread by load and capacity: ci (0/2), second (0/1 < 1/2; its image copied and built there), ci
        boxes = [open_sandbox(task, "docker", pool=pool, timeout=7) for _ in range(3)]
        assert [b.engine.name for b in boxes] == ["ci", "second", "ci"]
        assert {b.timeout for b in boxes} == {7}  # the sandbox's limits reach DockerSandbox
        assert all(b.exec("echo ok").output == "ok\n" for b in boxes)
        for b in boxes:
            b.close()
        assert pool.load() == {"ci": (0, 2, True), "second": (0, 1, True)}

        # an episode on the second engine (ci's slots held) whose engine is stopped between two commands
        held = [pool.acquire() for _ in range(3)]
        assert [e.name for e in held] == ["ci", "second", "ci"]
        pool.release(held.pop(1))
        tok = build_tokenizer([task.problem_statement, "ls echo submit done"], 400)
        env = SWEEnv(task, sandbox_factory=lambda t: pool.open(t, wait_s=30), grader=lambda t, p: True)
        replies = [
            command_reply("ls", "Look."),
            command_reply("echo after", "Again."),
            command_reply("submit", ""),
        ]
        model = _Killer(tok, replies, kill_at=1, directory=directory)
        traj = asyncio.run(
            run_episode(env, model, tok, sampling=SamplingParams(max_new_tokens=256), max_turns=5,
                        max_context_tokens=8192)
        )  # fmt: skip
        assert traj.ended_by == "error" and traj.reward is None, (traj.ended_by, traj.reward)
        assert "Docker engine second failed" in traj.infra_error, traj.infra_error
        assert pool.load()["second"] == (0, 1, False)  # dead; its slot given back
        for e in held:
            pool.release(e)
        # later sandboxes land on the survivor
        later = [pool.open(task, wait_s=30) for _ in range(2)]
        assert [b.engine.name for b in later] == ["ci", "ci"]
        assert later[0].exec("echo still").output == "still\n"

        # the engine comes back: it rejoins at the next health check and takes the next sandbox
        assert docker_sh("start", directory).returncode == 0
        deadline = time.monotonic() + 20
        while not pool.load()["second"][2] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pool.load()["second"][2], pool.events
        monkeypatch.setattr(engines_module, "_DEFAULT", pool)  # what env.docker_hosts configures
        back = open_sandbox(task, "docker")
        assert back.engine.name == "second" and back.exec("echo back").output == "back\n"
        for b in (*later, back):
            b.close()
        assert [e[1:] for e in pool.events][-2:] == [("second", pool.events[-2][2]), ("second", "rejoined")]
    finally:
        pool.close()


@pytest.fixture
def ssh_engine(tmp_path, monkeypatch):
    """The CI engine over ssh://: an sshd of this test's own on a local port whose key may only run
    `docker system dial-stdio` against that engine, and an `ssh` on PATH that uses this test's key
    and config (the docker SDK runs the system's ssh, as for a real remote host)."""
    import os
    import shutil
    import subprocess

    from envs.sandbox.docker_sandbox import engine_available

    missing = None if engine_available() else "no Docker engine reachable"
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if missing is None and not (Path(sshd).is_file() and shutil.which("ssh") and os.geteuid() == 0):
        missing = "an ssh:// engine needs openssh-server, the ssh client and root (.ci/run installs them)"
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    for key in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / key)], check=True)
    engine = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    (tmp_path / "authorized_keys").write_text(
        f'command="docker -H {engine} system dial-stdio",restrict {(tmp_path / "user.pub").read_text()}'
    )
    port = free_port()
    (tmp_path / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path / 'host'}\n"
        f"PidFile {tmp_path / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}\nPasswordAuthentication no\nUsePAM no\n"
        "StrictModes no\nPermitRootLogin prohibit-password\n"
    )
    (tmp_path / "ssh_config").write_text(
        f"Host 127.0.0.1\n  IdentityFile {tmp_path / 'user'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    (tmp_path / "bin").mkdir()
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {tmp_path / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    server = subprocess.Popen([sshd, "-D", "-e", "-f", str(tmp_path / "sshd_config")],
                              stderr=(tmp_path / "sshd.log").open("w"))  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(
            ["ssh", "-p", str(port), "root@127.0.0.1", "true"], capture_output=True
        ).returncode:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "sshd.log").read_text()
            time.sleep(0.2)
        yield f"ssh://root@127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


@pytest.mark.docker
def test_an_ssh_engine_holds_sandboxes_and_persistent_shells(ssh_engine):
    """`env.docker_hosts` with an ssh:// URL: the pool pings the engine through ssh, places a
    sandbox there, runs commands in its persistent shell (a long-lived exec over the ssh pipe) and
    removes it."""
    task = load_tasks(BUILTIN)[0]
    pool = EnginePool(
        [EngineSpec(ssh_engine, capacity=2, name="over-ssh")], health_interval_s=60, dead_timeout_s=2
    )
    try:
        with pool.open(task, timeout=30) as box:
            assert box.engine.name == "over-ssh"
            assert box.exec("echo over ssh").output == "over ssh\n"
            assert box.exec("cd /tmp && pwd; exit 3").exit_code == 3
            assert box.exec("pwd").output.strip() != "/tmp"  # each command starts afresh
        assert pool.load() == {"over-ssh": (0, 2, True)}
    finally:
        pool.close()


def test_reap_command_covers_every_engine_of_a_config(tmp_path, capsys):
    from jaxswe.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(
        f"env:\n  backend: docker\n  docker_hosts: [unix://{tmp_path}/a.sock, unix://{tmp_path}/b.sock]\n"
    )
    try:
        main(["sandboxes", "reap", "--config", str(config)])
    except SystemExit as done:
        assert not done.code
    out = capsys.readouterr()
    assert "removed 0 sandboxes" in out.out
    assert out.err.count("does not answer: not reaped") == 2
