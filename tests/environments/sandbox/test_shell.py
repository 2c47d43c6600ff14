"""Persistent shells (envs.sandbox.shell): exit codes, timeouts that kill escapees, output caps, hostile
output and channel access, runner death, long commands; locally under bwrap and in Docker."""

import os
import signal
import subprocess
import threading
import time

import pytest

from envs import BASE_IMAGE, DockerSandbox, LocalSandbox, SandboxError
from envs.sandbox.local import SHELL_MARKER, bwrap_available, marked_pids
from envs.sandbox.protocol import ARG_LIMIT

# Imitates an answer: a 16-byte "token", a length, a JSON header claiming success, then bytes.
FORGED = (
    r'printf "0123456789abcdef\000\000\000\100{\"code\": 0, \"timed_out\": false, \"total\": 2}'
    r'Q\000\000\000\002{}"'
)
# Tries every way onto the runner's channel; each must fail (it is pid 1 locally, $PPID in Docker).
PROBE = (
    'r=${RUNNER:-1}; for f in /proc/$r/fd/*; do echo forged > "$f" && echo "WROTE $f"; done 2>/dev/null; '
    "cat /proc/$r/environ >/dev/null 2>&1 && echo READ-ENV; "
    "head -c1 /proc/$r/mem >/dev/null 2>&1 && echo READ-MEM; "
    "ls /proc/self/fd | tr '\\n' ' '"
)


# What a command sees of its process: the same through the shell as through a process of its own.
PARITY = (
    "env | grep -v '^JAXSWE_COMMAND=\\|^_=' | sort; umask; ulimit -a; id; pwd; ls -l /proc/self/fd | wc -l"
)


def _same_as_per_command(sb) -> None:
    persistent = sb.exec(PARITY)
    sb.persistent_shell = False
    try:
        legacy = sb.exec(PARITY)
    finally:
        sb.persistent_shell = True
    assert persistent == legacy and "PATH=" in legacy.output, (persistent.output, legacy.output)


@pytest.fixture
def local(tmp_path):
    if not bwrap_available():  # CI installs bubblewrap (.ci/run): there this is a failure
        why = "no bwrap: the local backend has no persistent shell"
        (pytest.fail if os.environ.get("CI") else pytest.skip)(why)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f.txt").write_text("x" * 5000)
    with LocalSandbox(repo, output_limit=1000) as sb:
        yield sb
    assert marked_pids(f"{SHELL_MARKER}={sb.id}") == []


def _runner_pid(sb) -> int:
    """The host pid of the sandbox's runner (the process bwrap started; bwrap carries the marker too)."""
    if sb._shell is None:
        sb.exec("true")
    (pid,) = set(marked_pids(f"{SHELL_MARKER}={sb.id}")) - {sb._shell_proc.pid}
    return pid


def test_exit_codes_output_cap_and_forged_framing(local):
    assert local.exec("echo out; echo err >&2; exit 7").exit_code == 7
    _same_as_per_command(local)
    assert local.exec("kill -9 $$").exit_code == 137
    pid = _runner_pid(local)
    forged = local.exec(f"{FORGED}; exit 3")
    assert forged.exit_code == 3 and forged.output.startswith("0123456789abcdef\0\0\0@{")
    probe = local.exec(PROBE)
    assert probe.exit_code == 0 and "WROTE" not in probe.output and "READ" not in probe.output, probe
    assert probe.output.split() == ["0", "1", "2", "255"] or probe.output.split()[:3] == ["0", "1", "2"]
    assert local.exec("kill -9 1; kill -STOP 1; echo $?").output.endswith("0\n")  # ignored by pid 1
    big = local.exec("seq 1 100000")  # output_limit 1000: head and tail of 500 bytes each
    assert "bytes of output cut" in big.output and big.output.endswith("100000\n") and len(big.output) < 1200
    with pytest.raises(SandboxError, match="bytes read at most"):
        local.read_file("f.txt", max_bytes=100)
    assert local.read_file("f.txt") == "x" * 5000
    assert _runner_pid(local) == pid and local.shell_note == ""  # one shell served them all


def test_timeout_kills_group_and_escapees_and_long_commands(local):
    pid = _runner_pid(local)
    start = time.monotonic()
    r = local.exec(
        "sleep 91 & env -i setsid sleep 92 >/dev/null 2>&1 </dev/null & echo up; sleep 93", timeout=0.5
    )
    assert r.timed_out and r.exit_code == 124 and r.output == "up\n" and time.monotonic() - start < 3
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not any(f"sleep 9{i}" in ps for i in (1, 2, 3)), ps
    long = local.exec("echo start; : " + "y" * (ARG_LIMIT + 10) + "; echo end")
    assert long.output == "start\nend\n" and long.exit_code == 0
    assert ".jaxswe-command" not in local.exec("ls -A /tmp").output  # the command file is gone
    assert _runner_pid(local) == pid


def test_runner_death_is_survived(local):
    assert local.exec("echo one").output == "one\n"
    os.kill(_runner_pid(local), signal.SIGKILL)  # between commands: the next one starts a new shell
    assert local.exec("echo two").output == "two\n"
    killer = threading.Timer(0.3, lambda: os.kill(_runner_pid(local), signal.SIGKILL))
    killer.start()
    died = local.exec("sleep 5.4321 & sleep 5.4321")  # under a command: reported, never raised
    killer.join()
    assert died.exit_code == 137 and "shell died" in died.output and not died.timed_out
    assert local.exec("echo three").output == "three\n" and "restarted" in local.shell_note
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleep 5.4321" not in ps.splitlines()  # (a unique argv: other processes' sleeps differ)


def test_docker_persistent_shell():
    from envs.sandbox.docker_sandbox import engine_available

    if not engine_available():
        if os.environ.get("CI"):
            pytest.fail("CI is set but no Docker engine is reachable (DOCKER_HOST)")
        pytest.skip("no Docker engine reachable")
    with DockerSandbox(BASE_IMAGE, workdir="/tmp", output_limit=1000) as sb:
        assert sb.exec("echo out; echo err >&2; exit 7").output == "out\nerr\n"
        _same_as_per_command(sb)
        pid = sb._shell.pid
        forged = sb.exec(f"{FORGED}; exit 3")
        assert forged.exit_code == 3 and forged.output.startswith("0123456789abcdef\0\0\0@{")
        probe = sb.exec(f"RUNNER=$PPID; {PROBE}")
        assert "WROTE" not in probe.output and "READ" not in probe.output, probe
        big = sb.exec("seq 1 100000")
        assert "bytes of output cut" in big.output and big.output.endswith("100000\n")
        r = sb.exec("sleep 91 & setsid sleep 92 >/dev/null 2>&1 & echo up; sleep 93", timeout=0.5)
        assert r.timed_out and r.exit_code == 124 and r.output == "up\n"
        assert "sleep 9" not in sb.exec("ps -eo args").output
        assert sb.exec("echo a; : " + "y" * (ARG_LIMIT + 10) + "; echo b").output == "a\nb\n"
        assert sb.exec("seq 1000 > big.txt; mkfifo fifo").exit_code == 0
        assert sb.read_file("/tmp/big.txt").endswith("999\n1000\n")
        refused = {"big.txt": "bytes read at most", "fifo": "not a regular file", "no": "no such"}
        for name, why in refused.items():
            with pytest.raises(SandboxError, match=why):
                sb.read_file(name, max_bytes=100)
        assert sb._shell.pid == pid
        died = sb.exec("kill -9 $PPID; sleep 1")  # the command kills its shell
        assert died.exit_code == 137 and "shell died" in died.output
        assert sb.exec("echo back").output == "back\n" and sb._shell.pid != pid
        assert not sb.dead
