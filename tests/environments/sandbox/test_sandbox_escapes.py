"""Escapes tried from inside a local bwrap sandbox, and reads the policy sizes that must stay bounded.

From inside: the task's files, its upstream/source clone, the template cache and another sandbox
are invisible; no scaffold file command writes or reads a host path; remounting fails, there is no
capability, no host process is visible; a detached, env-cleared process dies at timeout; the
kernel keyring refuses every call (EPERM, both backends) and a secret one sandbox leaves in every
writable place (and offers the keyring) is nowhere in the next.
"""

import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ROOT, TESTS

from envs import open_sandbox
from envs.sandbox.local import bwrap_available
from envs.tasks.records import load_builtin
from envs.tasks.repos import clean_template
from jaxswe.agent.commands import parse_action
from jaxswe.agent.prompts import load_prompts
from jaxswe.agent.scaffold import Scaffold

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not installed")
TASK = next(t for t in load_builtin() if t.instance_id == "builtin__billsplit-1")
TASK_DIR = ROOT / "envs" / "tasks" / "builtin" / TASK.instance_id


def test_nothing_outside_the_checkout_is_visible():
    with open_sandbox(TASK, "local") as sb, open_sandbox(TASK, "local") as other:
        assert sb.isolation == "bwrap"
        for path in (
            TASK_DIR / "task.json",
            TASK.source_dir,
            clean_template(TASK),
            other.workdir,
            clean_template(TASK).parent,  # every task's template (the venv cache is bound read-only)
            Path(TASK.source_dir).parent,
        ):
            result = sb.exec(f"ls {path} || cat {path}")
            assert result.exit_code != 0 and TASK.patch[:40] not in result.output, (path, result.output)
        assert sb.exec(f"ls {sb.root.parent}").output.split() == [sb.root.name]  # no other sandbox
        assert sb.exec("grep CapEff /proc/self/status").output.split() == ["CapEff:", "0000000000000000"]
        assert sb.exec("id -u").output.strip() != "0"
        assert sb.exec("mount -o remount,rw / && touch /usr/escaped").exit_code != 0
        assert sb.exec(f"kill -0 {__import__('os').getpid()}").exit_code != 0  # no host pid is visible
        assert int(sb.exec("ls /proc | grep -c '^[0-9]'").output) < 10
        # the trainer's interpreter: its virtualenv is not there, the base's site-packages are empty
        # (a non-editable `pip install .` puts every built-in task's gold patch there)
        assert sb.exec(f"ls {sys.prefix}").exit_code != 0 or sys.prefix == sys.base_prefix
        site = sysconfig.get_path("purelib", vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
        assert sb.exec(f"ls -A {site}").output.strip() == "", site
        assert sb.exec("python -c 'import pytest, sys; print(sys.prefix)'").exit_code == 0  # the task venv


def test_scaffold_file_commands_cannot_touch_the_host(tmp_path):
    host = tmp_path / "host.txt"
    host.write_text("host secret\n")
    with open_sandbox(TASK, "local") as sb:
        scaffold = Scaffold(sb, load_prompts("default"))
        for block in (
            f"create {tmp_path}/created.txt\nescaped",
            f"create /var/tmp/jaxswe-escape-{time.time_ns()}.txt\nescaped",
            f"edit --file {host} 1:1\nescaped",
            f"replace --file {host}\n<<<<<<< SEARCH\nhost secret\n=======\nescaped\n>>>>>>> REPLACE",
            f"open {host}",
            f"search_file secret {host}",
        ):
            observation = scaffold.run(parse_action(f"```\n{block}\n```"))
            assert "host secret" not in observation, (block, observation)
    assert host.read_text() == "host secret\n"
    assert not (tmp_path / "created.txt").exists() and not list(Path("/var/tmp").glob("jaxswe-escape-*"))


def test_detached_env_cleared_process_dies_at_timeout():
    with open_sandbox(TASK, "local") as sb:
        marker = f"{300 + time.time_ns() % 1000}.5"
        result = sb.exec(f"env -i setsid sleep {marker} >/dev/null 2>&1 < /dev/null & sleep 100", timeout=1)
        assert result.timed_out
        time.sleep(0.3)
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert f"sleep {marker}" not in ps


CHILD = """
import os, resource, sys, time
from envs import open_sandbox
from envs.tasks.records import load_builtin
from envs.grading.grader import REPORT_LIMIT
from envs.errors import SandboxError
from jaxswe.agent.commands import parse_action
from jaxswe.agent.prompts import load_prompts
from jaxswe.agent.scaffold import Scaffold

task = next(t for t in load_builtin() if t.instance_id == "builtin__billsplit-1")
with open_sandbox(task, sys.argv[1]) as sb:
    made = sb.exec("truncate -s 2G big.txt && truncate -s 1G /tmp/report.jsonl && mkfifo /tmp/fifo")
    assert made.exit_code == 0, made
    print("baseline_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    start = time.monotonic()
    obs = Scaffold(sb, load_prompts("default")).run(parse_action("```\\nopen big.txt\\n```"))
    assert "bytes read at most" in obs, obs
    obs = Scaffold(sb, load_prompts("default")).run(parse_action("```\\nsearch_file x big.txt\\n```"))
    assert "bytes read at most" in obs, obs
    for path in ("/tmp/report.jsonl", "/tmp/fifo"):
        try:
            sb.read_file(path, max_bytes=REPORT_LIMIT)
            raise AssertionError(path)
        except SandboxError as err:
            print(err)
    print("seconds", time.monotonic() - start)
print("maxrss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_sparse_file_and_fifo_report_stay_small_and_fast(backend):
    if backend == "docker":
        from envs.sandbox.docker_sandbox import engine_available

        if not engine_available():
            pytest.skip("no Docker engine reachable")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), backend], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = dict(
        line.split(" ", 1)
        for line in done.stdout.splitlines()
        if line.startswith(("maxrss", "seconds", "baseline"))
    )
    assert float(out["maxrss_mb"]) - float(out["baseline_mb"]) < 200, done.stdout  # peak growth
    assert float(out["seconds"]) < 20, done.stdout
    assert "not a regular file" in done.stdout and "bytes read at most" in done.stdout


def _processes_of(uid: int) -> int:
    done = subprocess.run(["pgrep", "-c", "-u", str(uid)], capture_output=True, text=True)
    return int(done.stdout.strip() or 0)


def test_a_sandbox_at_its_process_limit_does_not_stop_another_grading():
    """Each bwrap sandbox has a uid of its own (as root), so RLIMIT_NPROC (512) counts per sandbox: a
    fork flood filling one sandbox's process limit leaves another's grading alone."""
    import os
    import threading

    from envs import grade

    if os.geteuid() != 0:
        pytest.skip("per-sandbox uids need root (otherwise each sandbox is its own user namespace)")
    with open_sandbox(TASK, "local") as hog:
        flood = "for i in $(seq 2000); do sleep 30 & done 2>/dev/null; wait"
        threading.Thread(target=hog.exec, args=(flood, 40), daemon=True).start()
        deadline = time.monotonic() + 20
        while _processes_of(hog.uid) < 500 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_of(hog.uid) >= 500  # the hog is at its limit
        result = grade(TASK, TASK.patch)
        assert result.resolved, (result.reason, result.log[-1500:])


def test_memory_and_disk_are_capped_for_the_whole_sandbox():
    """As root, a sandbox is one memory cgroup and one size-limited tmpfs (envs.sandbox.caps): two processes
    each well under the per-process address-space rlimit together pass the sandbox's memory cap and
    are killed; files in /tmp and the checkout together fill its disk; close() leaves neither."""
    import os

    if os.geteuid() != 0:
        pytest.skip("whole-sandbox caps need root")
    with open_sandbox(TASK, "local", limits={"memory": 256 << 20, "disk": 48 << 20}) as sb:
        if sb.caps.note:  # e.g. cgroup v2 without delegation, no CAP_SYS_ADMIN: said, not faked
            pytest.skip(f"this machine cannot cap a whole sandbox: {sb.caps.note}")
        assert sb.caps.cgroups and sb.caps.mount is not None
        hog = "python3 -c 'import os,time; os.fork(); b=bytearray(180<<20); time.sleep(1); print(\"alive\")'"
        out = sb.exec(f"{hog}; echo rc=$?", timeout=60).output
        assert out.count("alive") < 2, out  # 360 MB in all under a 256 MB cap: at least one killed
        fill = "head -c 30000000 /dev/zero > /tmp/a; head -c 30000000 /dev/zero > b; echo rc=$?"
        out = sb.exec(fill).output
        assert "No space left on device" in out and "rc=1" in out, out
        groups, root = sb.caps.cgroups, str(sb.root)
    assert not any(g.exists() for g in groups)
    assert root not in Path("/proc/self/mounts").read_text()


KEYRING_PROBE = r"""python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
add_key, request_key, keyctl = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[os.uname().machine]
secret = b"SECRET"  # as the key's description (listed in /proc/keys) and its payload
calls = {
    "add_key session": (add_key, b"user", secret, secret, len(secret), -3),
    "add_key user": (add_key, b"user", secret, secret, len(secret), -4),
    "request_key": (request_key, b"user", secret, None, 0),
    "keyctl join": (keyctl, 1, None),  # KEYCTL_JOIN_SESSION_KEYRING
    "keyctl read": (keyctl, 11, -3, None, 0),  # KEYCTL_READ of the session keyring
}
for name, args in calls.items():
    print(name, libc.syscall(*args), ctypes.get_errno())
PY"""


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_kernel_keyring_is_refused(backend):
    """Keyrings belong to no namespace: every keyring system call fails with EPERM in a sandbox."""
    if backend == "docker":
        from envs.sandbox.docker_sandbox import engine_available

        if not engine_available():
            pytest.skip("no Docker engine reachable")
    with open_sandbox(TASK, backend) as sb:
        out = sb.exec(KEYRING_PROBE).output
    assert [ln.split()[-2:] for ln in out.splitlines()] == [["-1", "1"]] * 5, out  # -1, errno EPERM


# Every directory a command can write to: each read-write mount (not proc, devices), walked on its
# own filesystem (-xdev) for writable directories.
WRITABLE_DIRS = (
    "awk '$6 ~ /^rw/ && $9 !~ /^(proc|devtmpfs|devpts|sysfs)$/ {print $5}' /proc/self/mountinfo | "
    'while read -r m; do find "$m" -xdev -type d -writable 2>/dev/null; done | sort -u'
)


def secret_carries() -> None:
    """Write a secret to every writable directory of one sandbox and offer it to the keyring; then
    look for it in a later sandbox of the same task, and in the task venv and template it reads."""
    secret = f"jaxswe-secret-{time.time_ns()}"
    with open_sandbox(TASK, "local") as first:
        write = f'{WRITABLE_DIRS} | while read -r d; do echo {secret} > "$d/.{secret}" && echo "$d"; done'
        written = first.exec(write).output.split()
        assert {"/tmp", first.workdir, str(first.root / "home")} <= set(written), written
        first.exec(KEYRING_PROBE.replace("SECRET", secret))
        venv, template = first.ro_binds, clean_template(TASK)
    with open_sandbox(TASK, "local") as later:
        paths = " ".join(f"{d}/.{secret}" for d in written)
        search = (
            f"cat {paths} 2>/dev/null; {WRITABLE_DIRS} | xargs -I{{}} grep -rl {secret} {{}}; cat /proc/keys"
        )
        found = later.exec(search, timeout=60)
    assert secret not in found.output, found.output
    host = subprocess.run(["grep", "-rl", secret, *venv, str(template)], capture_output=True, text=True)
    assert host.returncode == 1, host.stdout + host.stderr  # 1: no match


CARRY_CHILD = """
import ctypes, os
from test_sandbox_escapes import secret_carries
keyctl = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
assert ctypes.CDLL(None).syscall(keyctl, 1, b"jaxswe-test") > 0  # KEYCTL_JOIN_SESSION_KEYRING
secret_carries()
"""


def test_nothing_carries_to_the_next_sandbox():
    """Run from a process with a session keyring of its own (as a login shell's trainer has: the
    sandboxes inherit it), a secret one sandbox leaves anywhere is nowhere in the next."""
    path = f"{ROOT}:{TESTS}:{Path(__file__).parent}"  # jaxswe, helpers, this module
    done = subprocess.run(
        [sys.executable, "-c", CARRY_CHILD], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
