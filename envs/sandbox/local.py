"""LocalSandbox: a task's clean repository copied into a temporary directory on this machine.

Each command is `bash -c` in a new session, stdin closed, with rlimits on processes, address
space, file size and open files. Under bubblewrap (isolation "bwrap", the default when `bwrap` is
installed) it runs in its own pid, mount, network, ipc, uts and cgroup namespaces with
`--die-with-parent`, every capability dropped, no_new_privs and a seccomp filter refusing the kernel
keyring (add_key, request_key, keyctl: EPERM, as in Docker's default profile; keyrings belong to no
namespace, so a key one sandbox stored would reach the next, envs.sandbox.seccomp): a trainer running as
root drops the command to a uid of the sandbox's own with `setpriv` (claimed from UID_RANGE for the sandbox's
lifetime: a real unprivileged uid, so the process rlimit counts per sandbox, and one sandbox at
its process limit does not stop another's commands; as root, the sandbox is also one memory
and pids cgroup and its directory a size-limited tmpfs: `memory` and `disk` cap the sandbox as
a whole, envs.sandbox.caps); any other user gets a user namespace of its own as well. It sees the system
read-only (/usr, /etc), the base interpreter and any `ro_binds` (a per-task virtualenv) read-only
(a task's sandbox: `host_python=False`, the trainer's own virtualenv is not there and the base
interpreter's site-packages are empty; else the running virtualenv is bound too), and of writable
places only its own checkout, home and /tmp: no task files, upstream clones, template cache or
other sandboxes. Commands run through the sandbox's persistent shell (envs.sandbox.shell): one runner,
started once under that same bwrap, setpriv, rlimits and cgroups as pid 1 of the sandbox's pid
namespace (signals from commands do not reach it), forks each command; when a command returns or
times out the runner kills everything else in the namespace (kill(-1)), so everything it started
(setsid, cleared environment) ends with it: on this backend background processes do not outlive
their command. If the runner dies it is restarted (a command it was running reports exit 137 and
says so in its output); without it (`persistent_shell = False`, a runner that cannot start, or a
second thread's concurrent call) each command is its own bwrap whose pid namespace ends with it.
File reads and writes (`read_file`, `write_file`) run inside the sandbox too (through the shell
as well), so a path or symlink cannot reach the host.

Without bwrap (isolation "none") commands run on the host as this user: processes carrying the
sandbox's environment markers are killed at timeout and close, but a process that leaves the
group and clears its environment escapes. RL and RFT refuse that unless told otherwise.
Each sandbox directory records its owner (host, pid, start time); `reap_sandboxes()` removes
those whose owner is gone, with their processes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path

from envs.errors import SandboxError
from envs.sandbox import caps
from envs.sandbox.protocol import (
    ARG_LIMIT,
    COMMAND_ENV,
    COMMAND_MARKER,
    DEFAULT_OUTPUT_LIMIT,
    DEFAULT_READ_LIMIT,
    DEFAULT_TIMEOUT_S,
    READ_SCRIPT,
    READ_TIMEOUT_S,
    SANDBOX_MARKER,
    TIMEOUT_EXIT_CODE,
    ExecResult,
    OutputBuffer,
    owner_alive,
    owner_labels,
    read_error,
    resolve_timeout,
    unrunnable,
)
from envs.sandbox.seccomp import keyring_filter
from envs.sandbox.shell import (
    PipeTransport,
    Shell,
    ShellDied,
    ShellRefused,
    command_request,
    exec_result,
    runner_argv,
)

_DRAIN_S = 0.05  # after the shell exits, how long to keep reading output its children still write
UID_RANGE = range(200_000, 260_000)  # each bwrap sandbox's own unprivileged uid (and gid), as root
DEFAULT_LIMITS = {  # rlimits of every command: processes, address space, file size, open files
    "nproc": 512,
    "as": 8 << 30,
    "fsize": 2 << 30,
    "nofile": 4096,
}
DEFAULT_CAPS = {"memory": 4 << 30, "disk": 4 << 30}  # the whole sandbox's (envs.sandbox.caps; bwrap as root)
_RLIMITS = {"nproc": resource.RLIMIT_NPROC, "as": resource.RLIMIT_AS, "fsize": resource.RLIMIT_FSIZE,
            "nofile": resource.RLIMIT_NOFILE}  # fmt: skip
SHELL_MARKER = "JAXSWE_SHELL"  # env var of a sandbox's persistent shell (not a command: no SANDBOX_MARKER)
_OWNER_FILE = "owner.json"
_UNOWNED_AGE_S = 24 * 3600.0  # a sandbox directory without an owner file is reaped once this old
_SHELL_MAX_STARTS = 20  # persistent shells one sandbox starts at most; then one process per command


def sandboxes_dir() -> Path:
    """Where local sandboxes live: `$JAXSWE_SANDBOX_DIR`, default /var/tmp/jaxswe-sandboxes."""
    return Path(os.environ.get("JAXSWE_SANDBOX_DIR", "/var/tmp/jaxswe-sandboxes"))


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


_KTHREAD = 0x00200000  # PF_KTHREAD in /proc/PID/stat's flags: a kernel thread has no environment
_MID_EXEC_TRIES = 20  # re-reads of the empty environments of one scan, 5 ms apart


def _state_and_flags(pid: int) -> tuple[bytes, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[6])


def _environ(pid: int) -> bytes | None:
    """`pid`'s environment block; None once it is gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def _live_user_process(pid: int) -> bool:
    """Neither gone, a zombie nor a kernel thread (those have no environment)."""
    stat = _state_and_flags(pid)
    return stat is not None and stat[0] != b"Z" and not stat[1] & _KTHREAD


def _marked(needle: bytes, skip: int | None = None) -> list[int]:
    """Live, non-zombie processes whose environment holds `needle` (NAME=value). A live process caught
    inside execve reads empty for a moment (its new image has no environment yet): the scan's empty
    reads are read again together, 5 ms apart: a scan waits 100 ms at most, however many processes
    have no environment at all."""
    blocks = {int(p): _environ(int(p)) for p in os.listdir("/proc") if p.isdigit() and int(p) != skip}
    empty = [pid for pid, block in blocks.items() if block == b"" and _live_user_process(pid)]
    for _ in range(_MID_EXEC_TRIES):
        if not empty:
            break
        time.sleep(0.005)
        blocks.update((pid, _environ(pid)) for pid in empty)
        empty = [pid for pid in empty if blocks[pid] == b"" and _live_user_process(pid)]
    return [
        pid
        for pid, block in blocks.items()
        if block and needle in block.split(b"\0") and _live_user_process(pid)
    ]


def kill_marked(entry: str, *, rounds: int = 20) -> int:
    """SIGKILL every process whose environment holds `entry` (NAME=value); returns how many."""
    killed = 0
    for _ in range(rounds):
        found = _marked(entry.encode(), skip=os.getpid())
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    return killed


def marked_pids(entry: str) -> list[int]:
    """Live processes whose environment holds `entry` (zombies excluded)."""
    return _marked(entry.encode())


def _system_binds() -> list[str]:
    """bwrap arguments showing the system read-only: /usr, /etc, the top-level links or dirs into /usr."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _python_prefixes(host_python: bool) -> list[str]:
    """Interpreter trees bound read-only: the base interpreter (task venvs run it), and with
    `host_python` the running virtualenv too (its python and pytest, for sandboxes without a venv)."""
    prefixes = [sys.base_prefix, sys.prefix] if host_python else [sys.base_prefix]
    return [p for p in dict.fromkeys(prefixes) if not p.startswith("/usr/")]


def _site_dirs() -> list[str]:
    """The base interpreter's site-packages and the system's dist-packages: hidden (an empty tmpfs)
    in sandboxes with a task venv, so a package installed there (jaxswe itself, with the built-in
    tasks' gold patches, after a non-editable install) is not readable from inside."""
    base = {"base": sys.base_prefix, "platbase": sys.base_prefix}
    paths = {sysconfig.get_path(k, vars=base) for k in ("purelib", "platlib")}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    paths |= {"/usr/lib/python3/dist-packages", f"/usr/local/lib/{version}/dist-packages",
              f"/usr/local/lib/{version}/site-packages"}  # fmt: skip
    return sorted(p for p in paths if os.path.isdir(p))


def _parents(paths: list[str]) -> list[str]:
    """bwrap arguments creating every parent of `paths` traversable (0755), not with the host's modes."""
    args, seen = [], set()
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts)):
            parent = str(Path(*parts[:i]))
            if parent not in seen:
                seen.add(parent)
                args += ["--perms", "0755", "--dir", parent]
    return args


def _filter_fd() -> int:
    """A pipe's read end holding the keyring seccomp filter (envs.sandbox.seccomp), for one bwrap to read."""
    read, write = os.pipe()
    try:
        os.write(write, keyring_filter())
    finally:
        os.close(write)
    return read


def _uid_file(uid: int) -> Path:
    return sandboxes_dir() / ".uids" / str(uid)


def _claim_uid(root: Path) -> int:
    """A uid from UID_RANGE no live sandbox holds, claimed by a file naming `root` (O_EXCL)."""
    _uid_file(0).parent.mkdir(parents=True, exist_ok=True)
    for _ in range(1000):
        uid = UID_RANGE[secrets.randbelow(len(UID_RANGE))]
        try:
            fd = os.open(_uid_file(uid), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            f.write(root.name)
        return uid
    raise SandboxError(f"no free sandbox uid in {UID_RANGE}")


def _set_limits(limits: dict[str, int], sandbox_caps: caps.Caps):
    def apply() -> None:
        sandbox_caps.join()
        for name, value in limits.items():
            resource.setrlimit(_RLIMITS[name], (value, value))

    return apply


class LocalSandbox:
    """A clean copy of a git repository (`source`) with commands run in it (see the module doc)."""

    persistent_shell = True  # under bwrap, commands run through one long-lived shell (envs.sandbox.shell)

    def __init__(
        self,
        source: str | Path,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        isolation: str = "auto",
        env: dict[str, str] | None = None,
        ro_binds: tuple[str, ...] = (),
        limits: dict[str, int] | None = None,
        host_python: bool = True,
    ):
        if isolation not in ("auto", "bwrap", "none"):
            raise SandboxError(f"isolation must be auto, bwrap or none, got {isolation!r}")
        if isolation == "bwrap" and not bwrap_available():
            raise SandboxError("isolation='bwrap' but bubblewrap (bwrap) is not installed")
        if isolation != "none" and bwrap_available():
            keyring_filter()  # a host it has no filter for: one clear error here, before any command
        unknown = set(limits or {}) - set(_RLIMITS) - set(DEFAULT_CAPS)
        if unknown:
            known = sorted([*_RLIMITS, *DEFAULT_CAPS])
            raise SandboxError(f"unknown sandbox limits {sorted(unknown)} (choose from {known})")
        self.isolation = (
            "bwrap" if isolation == "bwrap" or (isolation == "auto" and bwrap_available()) else "none"
        )
        self.timeout = resolve_timeout(timeout, DEFAULT_TIMEOUT_S)
        self.output_limit = output_limit
        self.limits = {**DEFAULT_LIMITS, **DEFAULT_CAPS, **(limits or {})}
        self.ro_binds = tuple(str(Path(p).resolve()) for p in ro_binds)
        self.host_python = host_python
        self.id = uuid.uuid4().hex
        self._counter = itertools.count()
        self._closed = False
        self._lock = threading.Lock()
        self._shell: Shell | None = None
        self._shell_proc: subprocess.Popen | None = None
        self._shell_lock = threading.Lock()
        self._shell_starts = 0
        self.shell_note = ""
        sandboxes_dir().mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="sbx-", dir=sandboxes_dir()))
        self.uid: int | None = None
        self.caps = caps.Caps(note="no whole-sandbox caps: no bwrap isolation")
        try:
            if self.isolation == "bwrap":
                self.caps = caps.create(self.root.name, self.root, memory=self.limits["memory"],
                                        pids=self.limits["nproc"], disk=self.limits["disk"])  # fmt: skip
            (self.root / _OWNER_FILE).write_text(json.dumps({**owner_labels(), "id": self.id}))
            for sub in ("tmp", "home"):
                (self.root / sub).mkdir()
            self.workdir = str(self.root / "repo")
            copied = subprocess.run(["cp", "-a", str(source), self.workdir], capture_output=True, text=True)
            if copied.returncode != 0:
                raise SandboxError(f"cannot copy {source} into a sandbox: {copied.stderr.strip()}")
            self.uid = _claim_uid(self.root) if self.isolation == "bwrap" and os.geteuid() == 0 else None
            if self.uid is not None:
                for sub in ("tmp", "home", "repo"):
                    subprocess.run(["chown", "-R", f"{self.uid}:{self.uid}", str(self.root / sub)],
                                   check=True, capture_output=True)  # fmt: skip
        except BaseException:
            self.caps.release()
            shutil.rmtree(self.root, ignore_errors=True)
            if self.uid is not None:
                _uid_file(self.uid).unlink(missing_ok=True)
            raise
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        if host_python:  # the running Python's tools (python, pytest) come first
            path = f"{Path(sys.executable).parent}:{path}"
        self._env = {
            **COMMAND_ENV,
            "PATH": path,
            "HOME": str(self.root / "home"),
            "TMPDIR": "/tmp" if self.isolation == "bwrap" else str(self.root / "tmp"),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the host's pytest plugins are not the task's
            SANDBOX_MARKER: self.id,
            **{
                k: v.replace("{workdir}", self.workdir) for k, v in (env or {}).items()
            },  # task venv: envs.provision.venvs
        }

    # -- commands -------------------------------------------------------------------------------
    def _argv(self, argv: list[str], *, seccomp_fd: int | None, as_pid_1: bool = False) -> list[str]:
        if self.isolation == "none":
            return argv
        writable = [str(self.root / sub) for sub in ("home", "repo")]
        readonly = [*_python_prefixes(self.host_python), *self.ro_binds]
        binds = [*_system_binds(), "--proc", "/proc", "--dev", "/dev"]
        # POSIX semaphores (multiprocessing's locks) need a writable /dev/shm: 64 MiB, as Docker's
        binds += ["--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/dev/shm"]
        binds += ["--bind", str(self.root / "tmp"), "/tmp"]
        binds += _parents([*readonly, *writable])  # after /tmp: a venv under /tmp gets traversable parents
        for path in writable:
            binds += ["--bind", path, path]
        for path in readonly:
            binds += ["--ro-bind", path, path]
        if not self.host_python:
            for path in _site_dirs():
                binds += ["--tmpfs", path]
        flags = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--die-with-parent", "--new-session", "--seccomp", str(seccomp_fd)]  # fmt: skip
        if as_pid_1:  # the persistent shell: no reaper; commands' signals cannot reach it
            flags.append("--as-pid-1")
        if os.geteuid() == 0:  # drop to the sandbox uid for real: no capability, rlimits that count
            drop = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
        else:  # an unprivileged user: a user namespace of its own
            flags += ["--unshare-user", "--cap-drop", "ALL"]
            drop = []
        return ["bwrap", *binds, *flags, "--chdir", self.workdir, "--", *drop, *argv]

    def _spawn(self, argv: list[str], env: dict[str, str], stdin: bool, merge: bool,
               as_pid_1: bool = False) -> subprocess.Popen:  # fmt: skip
        fds = (_filter_fd(),) if self.isolation == "bwrap" else ()  # bwrap reads the seccomp filter from it
        stderr = subprocess.DEVNULL if merge is None else subprocess.STDOUT if merge else subprocess.PIPE
        try:
            with self._lock:  # no process starts once close() began: close kills every one before
                if self._closed:
                    raise SandboxError("the sandbox was closed")
                return subprocess.Popen(
                    self._argv(argv, as_pid_1=as_pid_1, seccomp_fd=fds[0] if fds else None),
                    cwd=self.workdir if self.isolation == "none" else "/",
                    env=env,
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    start_new_session=True,
                    preexec_fn=_set_limits(
                        {k: v for k, v in self.limits.items() if k in _RLIMITS}, self.caps
                    ),
                    pass_fds=fds,
                )
        finally:
            for fd in fds:
                os.close(fd)

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run `command` with `bash -c` in the repository; see the module docstring for processes."""
        if self._closed:
            raise SandboxError("exec on a closed sandbox")
        if (refused := unrunnable(command)) is not None:
            return refused
        limit = resolve_timeout(timeout, self.timeout)
        n = next(self._counter)
        if (result := self._shell_exec(command, limit, n)) is not None:
            return result
        argv = ["bash", "-c", command]
        script = None
        if len(command.encode()) > ARG_LIMIT:  # too long for one argument: through a file
            script = f"{'/tmp' if self.isolation == 'bwrap' else self.root / 'tmp'}/.jaxswe-command-{n}.sh"
            self.write_file(script, command)
            argv = ["bash", "-c", 'script=$1; shift; . "$script"', "bash", script]
        marker = f"{COMMAND_MARKER}={self.id}.{n}"
        env = {**self._env, COMMAND_MARKER: marker.split("=", 1)[1]}
        buf = OutputBuffer(self.output_limit)
        proc = self._spawn(argv, env, stdin=False, merge=True)
        code, timed_out = self._pump(proc, marker, limit, buf.add)
        if script is not None:
            with contextlib.suppress(SandboxError):
                self._run_quiet(["rm", "-f", script])
        return ExecResult(output=buf.text(), exit_code=code, timed_out=timed_out)

    def _pump(self, proc: subprocess.Popen, marker: str, limit: float, sink, cap: int | None = None):
        """Feed `proc`'s stdout to `sink` until it exits, `limit` s pass or `cap` bytes came.

        Returns (exit code, timed out)."""
        timed_out, total = False, 0
        deadline = time.monotonic() + limit
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            exited_at = None
            while True:
                now = time.monotonic()
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > _DRAIN_S:
                    break  # children still hold the pipe; their later output is dropped
                if exited_at is None and (now >= deadline or (cap is not None and total > cap)):
                    timed_out = now >= deadline
                    self._kill_command(proc.pid, marker)
                    proc.wait()
                    exited_at = time.monotonic()
                    continue
                wait = _DRAIN_S if exited_at is not None else min(deadline - now, 0.5)
                if sel.select(timeout=max(wait, 0.0)):
                    try:
                        data = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not data:
                        break
                    total += len(data)
                    sink(data)
        proc.stdout.close()
        code = proc.wait()
        if timed_out:
            code = TIMEOUT_EXIT_CODE
        elif code < 0:
            code = 128 - code
        return code, timed_out

    def _run_quiet(self, argv: list[str], stdin: bytes | None = None, *, cap: int | None = None,
                   timeout: float = READ_TIMEOUT_S) -> tuple[int, bytes, str, bool]:  # fmt: skip
        """Run `argv` inside the sandbox with separate stdout (at most `cap` + 1 bytes kept) and stderr."""
        if self._closed:
            raise SandboxError("file access on a closed sandbox")
        n = next(self._counter)
        half = max(cap + 1, 4096) if cap is not None else 1 << 20
        got = self._through_shell(argv, n, timeout, head=half, tail=0, cap=cap, merge=False, stdin=stdin)
        if got is not None and got[0] is not None:  # (a shell that died under it: spawn it again)
            reply = got[0]
            return reply.code, reply.head, reply.err.decode("utf-8", "replace"), reply.timed_out
        marker = f"{COMMAND_MARKER}={self.id}.{n}"
        proc = self._spawn(
            argv, {**self._env, COMMAND_MARKER: marker.split("=", 1)[1]}, stdin is not None, False
        )
        err = bytearray()

        def read_err() -> None:
            while chunk := proc.stderr.read(4096):
                if len(err) < 4096:
                    err.extend(chunk)

        def feed() -> None:
            with contextlib.suppress(OSError):
                proc.stdin.write(stdin)
            with contextlib.suppress(OSError):
                proc.stdin.close()

        threads = [threading.Thread(target=read_err, daemon=True)]
        if stdin is not None:
            threads.append(threading.Thread(target=feed, daemon=True))
        for t in threads:
            t.start()
        out = bytearray()

        def keep(data: bytes) -> None:
            if cap is None or len(out) <= cap:
                out.extend(data)

        code, timed_out = self._pump(proc, marker, timeout, keep, cap)
        for t in threads:
            t.join(timeout=1)
        return code, bytes(out), err.decode("utf-8", "replace"), timed_out

    # -- the persistent shell (envs.sandbox.shell) ---------------------------------------------------------
    def _shell_exec(self, command: str, limit: float, n: int) -> ExecResult | None:
        """Run `command` through the persistent shell; None when it cannot (the caller spawns)."""
        argv, files = command_request(command, f"/tmp/.jaxswe-command-{n}.sh")
        half = self.output_limit // 2
        got = self._through_shell(argv, n, limit, head=half, tail=half, files=files)
        return None if got is None else exec_result(*got, self.output_limit, 137)

    def _through_shell(self, argv: list[str], n: int, limit: float, **kw):
        """(reply, None) from the shell, (None, ShellDied) when it died under the request, or None
        when no shell can take it (no bwrap, switched off, busy with another thread's command, or
        it could not start or run this request): the caller spawns a process for it."""
        if self.isolation != "bwrap" or not self.persistent_shell or self._closed:
            return None
        if not self._shell_lock.acquire(blocking=False):
            return None  # a concurrent call: its own process, as before
        try:
            marker_value = f"{self.id}.{n}"
            env = {**self._env, COMMAND_MARKER: marker_value}
            for attempt in range(2):  # a shell found dead before it took the request: a new one
                if (shell := self._ensure_shell()) is None:
                    return None
                try:
                    reply = shell.run(argv, env, cwd=self.workdir, timeout=limit,
                                      marker=f"{COMMAND_MARKER}={marker_value}", **kw)  # fmt: skip
                    break
                except ShellRefused:
                    return None
                except ShellDied as err:
                    self.shell_note = f"shell restarted after: {err}"
                    self._stop_shell()
                    if not err.started and attempt == 0:
                        continue
                    kill_marked(f"{COMMAND_MARKER}={marker_value}")
                    return (None, err) if err.started else None
            if reply.timed_out:  # the shell killed its namespace's processes; and the marked ones
                kill_marked(f"{COMMAND_MARKER}={marker_value}")
            if reply.left:
                self.shell_note = f"shell restarted: {reply.left} processes survived kill(-1)"
                self._stop_shell()
            return reply, None
        finally:
            self._shell_lock.release()

    def _ensure_shell(self) -> Shell | None:
        if self._shell is not None and self._shell.alive and self._shell_proc.poll() is None:
            return self._shell
        if self._shell is not None:
            self._stop_shell()
        if self._shell_starts >= _SHELL_MAX_STARTS or self._closed:
            return None
        self._shell_starts += 1
        python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
        env = {"PATH": self._env["PATH"], "LANG": "C.UTF-8", SHELL_MARKER: self.id}
        try:
            proc = self._spawn(runner_argv(python, "ns"), env, True, None, as_pid_1=True)
        except OSError as err:
            self.shell_note = f"no persistent shell ({err}): one process per command"
            return None
        try:
            self._shell = Shell(PipeTransport(proc))
        except (ShellDied, OSError) as err:
            self.shell_note = f"no persistent shell ({err}): one process per command"
            self._shell_proc = proc
            self._stop_shell()
            return None
        self._shell_proc = proc
        if self._closed:  # closed while it started: close() may have missed it
            self._stop_shell()
        return self._shell

    def _stop_shell(self) -> None:
        shell, proc = self._shell, self._shell_proc
        self._shell = self._shell_proc = None
        if shell is not None:
            shell.close()
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            kill_marked(f"{SHELL_MARKER}={self.id}")  # pid 1 of its namespace: all in it die
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def _kill_command(self, pgid: int, marker: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        kill_marked(marker)

    # -- files (inside the sandbox, like any command) ---------------------------------------------
    def read_file(self, path: str, max_bytes: int = DEFAULT_READ_LIMIT) -> str:
        """Text of a regular file of at most `max_bytes` (relative paths: under the repository)."""
        if "\0" in path:
            raise SandboxError(f"cannot read {path!r}: the name holds a NUL byte")
        code, out, err, timed_out = self._run_quiet(
            ["sh", "-c", READ_SCRIPT, "read", path, str(max_bytes)], cap=max_bytes
        )
        if len(out) > max_bytes and not timed_out and code != 0:
            code, err = 92, str(len(out))
        if (error := read_error(path, code, err, max_bytes, timed_out)) is not None:
            raise error
        return out.decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str) -> None:
        """Write a text file, creating parent directories (relative paths: under the repository)."""
        if "\0" in path:
            raise SandboxError(f"cannot write {path!r}: the name holds a NUL byte")
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        code, _, err, timed_out = self._run_quiet(["sh", "-c", script, "write", path], content.encode())
        if code != 0 or timed_out:
            raise SandboxError(
                f"cannot write {path}: {err.strip()[-200:] or 'timed out' if timed_out else err}"
            )

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process the sandbox started and delete its directory (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_shell()
        kill_marked(f"{SANDBOX_MARKER}={self.id}")
        self.caps.release()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.uid is not None:
            _uid_file(self.uid).unlink(missing_ok=True)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


def reap_sandboxes(root: Path | None = None) -> list[str]:
    """Remove local sandbox directories (and kill their processes) whose owner process is gone."""
    removed = []
    root = root or sandboxes_dir()
    if not root.is_dir():
        return removed
    for entry in root.glob("sbx-*"):
        try:
            owner = json.loads((entry / _OWNER_FILE).read_text())
        except (OSError, ValueError):  # being created now, or made by a version that recorded no owner
            owner = None
            with contextlib.suppress(OSError):
                if time.time() - entry.stat().st_mtime < _UNOWNED_AGE_S:
                    continue
        if owner is not None and owner_alive(owner):
            continue
        if owner is not None and owner.get("id"):
            kill_marked(f"{SHELL_MARKER}={owner['id']}")
            kill_marked(f"{SANDBOX_MARKER}={owner['id']}")
        caps.release_stale(entry.name, entry)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    for claim in (root / ".uids").glob("*"):  # uids whose sandbox directory is gone
        with contextlib.suppress(OSError):
            if not (root / claim.read_text().strip()).is_dir():
                claim.unlink()
    return removed
