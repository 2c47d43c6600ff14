"""LocalSandbox: commands, timeouts that leave no process behind, isolation, clean history, 32 at once."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import DATA, ROOT, git

from envs import ExecResult, LocalSandbox, SandboxError, load_tasks, open_sandbox
from envs.sandbox.local import bwrap_available, marked_pids, sandboxes_dir
from envs.tasks.records import task_from_record

BUILTIN = DATA / "builtin_tasks"
SECRET = "FUTURE-SECRET-9d2c1b"
ISOLATIONS = [
    "none",
    pytest.param("bwrap", marks=pytest.mark.skipif(not bwrap_available(), reason="no bwrap")),
]


def future_history_task(tmp_path: Path):
    """A repo whose history goes past base_commit (commit, tag, remote) and a task at base_commit."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    (repo / "mod.py").write_text("def f():\n    return 1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests").mkdir()
    (repo / "tests" / "test_mod.py").write_text(f"def test_f():\n    assert True  # {SECRET}\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", f"future {SECRET}")
    git(repo, "tag", "v9")
    git(repo, "remote", "add", "origin", "https://example.invalid/x.git")
    test_patch = (
        "diff --git a/tests/test_mod.py b/tests/test_mod.py\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/tests/test_mod.py\n@@ -0,0 +1,2 @@\n+def test_f():\n+    assert True  # {SECRET}\n"
    )
    record = {
        "instance_id": f"future-{base[:8]}", "repo": "local/future", "base_commit": base, "patch": "",
        "test_patch": test_patch, "FAIL_TO_PASS": ["tests/test_mod.py::test_f"], "PASS_TO_PASS": [],
    }  # fmt: skip
    return task_from_record(record, source_dir=str(repo)), base


def assert_clean_history(sandbox, base):
    assert sandbox.exec("git log --all --format=%H").output.split() == [base]
    assert sandbox.exec("git tag; git remote; git stash list").output.strip() == ""
    assert sandbox.exec("git reflog --all --format=%H | sort -u").output.split() in ([base], [])
    dump = sandbox.exec(
        f"git cat-file --batch-all-objects --batch | grep -c {SECRET}; grep -rl {SECRET} . | wc -l"
    )
    assert dump.output.split() == ["0", "0"], dump.output


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_exec_basics(isolation):
    task = load_tasks(BUILTIN)[0]
    with open_sandbox(task, "local", isolation=isolation) as sb:
        assert sb.isolation == isolation
        assert sb.exec("pwd").output.strip() == sb.workdir
        assert sb.exec("echo out; echo err >&2; exit 7") == ExecResult("out\nerr\n", 7, False)
        assert sb.exec("cat").exit_code == 0  # stdin is closed: cat does not wait
        nul = sb.exec("echo a\x00b")  # model output can hold a NUL byte: an error, not an exception
        assert nul.exit_code == 126 and "NUL byte" in nul.output
        assert sb.exec("echo $PAGER $GIT_PAGER $TERM").output == "cat cat dumb\n"
        assert sb.exec("git log --oneline | cat").output.endswith(" base\n")
        sb.write_file("pkg/new.txt", "hé\n")
        assert sb.exec("cat pkg/new.txt").output == "hé\n"
        assert sb.read_file("calc.py").startswith("def add")
        big = sb.exec("seq 1 200000")
        assert (
            "bytes of output cut" in big.output
            and big.output.startswith("1\n2\n")
            and big.output.endswith("200000\n")
        )
        assert len(big.output) < sb.output_limit + 200
        with pytest.raises(SandboxError, match="cannot read"):
            sb.read_file("nope.txt")
    assert not Path(sb.workdir).exists()
    with pytest.raises(SandboxError, match="closed"):
        sb.exec("true")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_timeout_kills_everything_it_started(isolation):
    task = load_tasks(BUILTIN)[0]
    with open_sandbox(task, "local", isolation=isolation) as sb:
        start = time.monotonic()
        r = sb.exec(
            "sleep 101 & nohup sleep 102 >/dev/null 2>&1 & setsid sleep 103 & (setsid nohup sleep 104 &) ; "
            "echo started; sleep 100",
            timeout=1,
        )
        elapsed = time.monotonic() - start
        assert r.timed_out and r.exit_code == 124 and r.output == "started\n"
        assert elapsed < 1 + 2, elapsed
        assert marked_pids(f"JAXSWE_SANDBOX={sb.id}") == []
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert not any(f"sleep 10{i}" in ps for i in range(1, 5)), ps
        # without bwrap a background process outlives its command (like a shell) and dies with the
        # sandbox; under bwrap it ends with its command's pid namespace
        assert sb.exec("sleep 105 >/dev/null 2>&1 & echo ok").output == "ok\n"
        if isolation == "none":
            assert len(marked_pids(f"JAXSWE_SANDBOX={sb.id}")) == 1
        else:
            deadline = time.monotonic() + 5
            while marked_pids(f"JAXSWE_SANDBOX={sb.id}") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert marked_pids(f"JAXSWE_SANDBOX={sb.id}") == []
        assert not sb.exec("true", timeout=5).timed_out
    assert marked_pids(f"JAXSWE_SANDBOX={sb.id}") == []


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_command_starts_once_close_began(isolation, monkeypatch):
    """Ctrl-C closes an episode's sandbox while its command thread may be about to start the
    command: the command must not start (else the close returns and the command runs on, its
    thread holding up the run's end until it times out)."""
    import envs.sandbox.local as local

    task = load_tasks(BUILTIN)[0]
    sb = open_sandbox(task, "local", isolation=isolation)
    real = local.resolve_timeout

    def closed_meanwhile(timeout, default):  # exec is past its own closed check
        closer = threading.Thread(target=sb.close)
        closer.start()
        closer.join()
        return real(timeout, default)

    monkeypatch.setattr(local, "resolve_timeout", closed_meanwhile)
    with pytest.raises(SandboxError, match="closed"):
        sb.exec("sleep 60")
    assert marked_pids(f"JAXSWE_SANDBOX={sb.id}") == []


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not installed")
def test_bwrap_isolation():
    task = load_tasks(BUILTIN)[0]
    with open_sandbox(task, "local") as sb:
        assert sb.isolation == "bwrap"
        net = sb.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"")
        assert net.exit_code != 0 and "unreachable" in net.output.lower()
        assert sb.exec("touch /usr/jaxswe-x").exit_code != 0
        assert sb.exec(f"touch {Path.home()}/jaxswe-x").exit_code != 0
        assert sb.exec("echo hi > /tmp/f && cat /tmp/f").output == "hi\n"
        assert sb.read_file("/tmp/f") == "hi\n"  # the sandbox's own /tmp
        # /dev/shm: anyone may write it (multiprocessing's semaphores), 64 MiB at most
        shm = sb.exec("stat -c %a /dev/shm; head -c 70M /dev/zero > /dev/shm/big; echo $?; rm /dev/shm/big")
        assert shm.output.split()[0] == "1777" and shm.output.split()[-1] != "0", shm.output


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_clean_history_and_no_test_patch(tmp_path, isolation):
    task, base = future_history_task(tmp_path)
    with open_sandbox(task, "local", isolation=isolation) as sb:
        assert_clean_history(sb, base)
        assert sb.exec("ls").output.split() == ["mod.py"]


def test_missing_repo_and_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSWE_REPOS_DIR", str(tmp_path / "repos"))
    record = {
        "instance_id": "octo__lib-9", "repo": "octo/lib", "base_commit": "c" * 40, "patch": "", "test_patch": "",  # noqa: E501
        "FAIL_TO_PASS": ["t::x"], "PASS_TO_PASS": [],
    }  # fmt: skip
    with pytest.raises(SandboxError, match=f"looked in {tmp_path / 'repos' / 'octo__lib'}"):
        open_sandbox(task_from_record(record), "local")
    clone = tmp_path / "repos" / "octo__lib"
    clone.mkdir(parents=True)
    git(clone, "init", "-q")
    git(clone, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-q", "--allow-empty", "-m", "x")
    with pytest.raises(SandboxError, match=f"commit {'c' * 40} not found in {clone}"):
        open_sandbox(task_from_record(record), "local")
    record["base_commit"] = git(clone, "rev-parse", "HEAD").strip()
    with open_sandbox(task_from_record(record), "local") as sb:
        assert sb.exec("git rev-parse HEAD").output.strip() == record["base_commit"]
    with pytest.raises(SandboxError, match="unknown sandbox backend"):
        open_sandbox(task_from_record(record), "k8s")


@pytest.mark.slow
def test_32_parallel_sandboxes_leave_nothing():
    task = load_tasks(BUILTIN)[0]
    ids, roots, errors = [], [], []

    def episode(i: int) -> None:
        try:
            with open_sandbox(task, "local") as sb:
                ids.append(sb.id)
                roots.append(sb.root)
                assert sb.exec(f"echo {i} > f.txt; sleep 30 >/dev/null 2>&1 & cat f.txt").output == f"{i}\n"
                assert sb.exec(f"cat f.txt; echo {i}").output == f"{i}\n{i}\n"
                assert sb.exec("sleep 30", timeout=0.5).timed_out
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(ids) == 32
    assert all(marked_pids(f"JAXSWE_SANDBOX={i}") == [] for i in ids)
    assert not any(r.exists() for r in roots)
    assert all(r.parent == sandboxes_dir() for r in roots)


def test_bad_arguments():
    task = load_tasks(BUILTIN)[0]
    with pytest.raises(SandboxError, match="isolation"):
        open_sandbox(task, "local", isolation="vm")
    with LocalSandbox(task.source_dir) as sb, pytest.raises(ValueError, match="timeout"):
        sb.exec("true", timeout=0)


MID_EXEC = """
import os, signal
from envs.sandbox.local import marked_pids
from envs.sandbox.shell_runner import pids_holding
missed = 0
for _ in range(40):
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", "60"])  # outlives the scans, however slow (a loaded machine)
    missed += pid not in marked_pids("JAXSWE_T=1") or pid not in pids_holding(b"JAXSWE_T=1", os.getpid())
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(missed)
"""


@pytest.mark.slow
def test_a_marked_process_inside_execve_is_found():
    """A marked process read while it execs (its environment reads empty for a moment) is still
    found, by the host's scan and by the in-sandbox runner's: a timeout's kill misses nothing."""
    env = {**os.environ, "JAXSWE_T": "1", "PYTHONPATH": str(ROOT)}  # in the child's initial block
    out = subprocess.run(
        [sys.executable, "-c", MID_EXEC], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "0", out.stderr
