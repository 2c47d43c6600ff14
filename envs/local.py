"""LocalSandbox: a task's clean repository copied into a temporary directory on this machine.

Each command is `bash -c` in a new session (its own process group), stdin closed, under
bubblewrap when `bwrap` is installed (no network, read-only system, writable sandbox directory
and /tmp) and plain otherwise. Every process a command starts carries the sandbox's markers in its
environment; on timeout the command's process group is killed and then any process still carrying
the command's marker (background children, `nohup`, `setsid`); `close()` does the same for the
whole sandbox. A process that both leaves the group and clears its environment can escape the
plain backend; use the Docker backend where that matters.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from envs.errors import SandboxError
from envs.sandbox import (
    COMMAND_ENV,
    COMMAND_MARKER,
    DEFAULT_OUTPUT_LIMIT,
    DEFAULT_TIMEOUT_S,
    SANDBOX_MARKER,
    TIMEOUT_EXIT_CODE,
    ExecResult,
    OutputBuffer,
    resolve_timeout,
    unrunnable,
)

_DRAIN_S = 0.05  # after the shell exits, how long to keep reading output its children still write


def sandboxes_dir() -> Path:
    """Where local sandboxes live: `$JAXSWE_SANDBOX_DIR`, default /var/tmp/jaxswe-sandboxes."""
    return Path(os.environ.get("JAXSWE_SANDBOX_DIR", "/var/tmp/jaxswe-sandboxes"))


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def kill_marked(entry: str, *, rounds: int = 20) -> int:
    """SIGKILL every process whose environment holds `entry` (NAME=value); returns how many."""
    needle, me, killed = entry.encode(), os.getpid(), 0
    for _ in range(rounds):
        found = [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and int(p) != me and _environ_has(int(p), needle)
        ]
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
    needle, pids = entry.encode(), []
    for p in os.listdir("/proc"):
        if p.isdigit() and _environ_has(int(p), needle):
            try:
                with open(f"/proc/{p}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if state != b"Z":
                pids.append(int(p))
    return pids


class LocalSandbox:
    """A clean copy of a git repository (`source`) with commands run in it (see the module doc)."""

    def __init__(
        self,
        source: str | Path,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        isolation: str = "auto",
        env: dict[str, str] | None = None,
        ro_paths: tuple[str, ...] = (),
    ):
        if isolation not in ("auto", "bwrap", "none"):
            raise SandboxError(f"isolation must be auto, bwrap or none, got {isolation!r}")
        if isolation == "bwrap" and not bwrap_available():
            raise SandboxError("isolation='bwrap' but bubblewrap (bwrap) is not installed")
        self.isolation = (
            "bwrap" if isolation == "bwrap" or (isolation == "auto" and bwrap_available()) else "none"
        )
        self.timeout = resolve_timeout(timeout, DEFAULT_TIMEOUT_S)
        self.output_limit = output_limit
        self.ro_paths = tuple(str(p) for p in ro_paths)  # read-only in the sandbox (the task venv)
        self.id = uuid.uuid4().hex
        self._counter = itertools.count()
        self._closed = False
        self._lock = threading.Lock()
        sandboxes_dir().mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="sbx-", dir=sandboxes_dir()))
        try:
            for sub in ("tmp", "home"):
                (self.root / sub).mkdir()
            self.workdir = str(self.root / "repo")
            copied = subprocess.run(["cp", "-a", str(source), self.workdir], capture_output=True, text=True)
            if copied.returncode != 0:
                raise SandboxError(f"cannot copy {source} into a sandbox: {copied.stderr.strip()}")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        bindir = str(Path(sys.executable).parent)  # the running Python's tools (python, pytest) come first
        self._env = {
            **COMMAND_ENV,
            "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the host's pytest plugins are not the task's
            SANDBOX_MARKER: self.id,
            **{
                k: v.replace("{workdir}", self.workdir) for k, v in (env or {}).items()
            },  # task venv: envs.venvs
        }

    # -- commands -------------------------------------------------------------------------------
    def _argv(self, command: str) -> list[str]:
        if self.isolation == "none":
            return ["bash", "-c", command]
        binds = ["--ro-bind", "/", "/", "--dev", "/dev"]
        if not self.root.is_relative_to("/tmp"):
            binds += ["--bind", str(self.root / "tmp"), "/tmp"]
        binds += ["--bind", str(self.root), str(self.root)]
        for path in self.ro_paths:
            binds += ["--ro-bind", path, path]
        flags = ["--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
        return ["bwrap", *binds, *flags, "--chdir", self.workdir, "--", "bash", "-c", command]

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run `command` with `bash -c` in the repository; see the module docstring for processes."""
        if self._closed:
            raise SandboxError("exec on a closed sandbox")
        if (refused := unrunnable(command)) is not None:
            return refused
        limit = resolve_timeout(timeout, self.timeout)
        marker = f"{COMMAND_MARKER}={self.id}.{next(self._counter)}"
        env = {**self._env, COMMAND_MARKER: marker.split("=", 1)[1]}
        buf = OutputBuffer(self.output_limit)
        deadline = time.monotonic() + limit
        proc = subprocess.Popen(
            self._argv(command),
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timed_out = False
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
                if exited_at is None and now >= deadline:
                    timed_out = True
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
                    buf.add(data)
        proc.stdout.close()
        code = proc.wait()
        if timed_out:
            code = TIMEOUT_EXIT_CODE
        elif code < 0:
            code = 128 - code
        return ExecResult(output=buf.text(), exit_code=code, timed_out=timed_out)

    def _kill_command(self, pgid: int, marker: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        kill_marked(marker)

    # -- files ----------------------------------------------------------------------------------
    def _host_path(self, path: str) -> Path:
        p = Path(path)
        if not p.is_absolute():
            return Path(self.workdir) / p
        if self.isolation == "bwrap" and p.is_relative_to("/tmp") and not self.root.is_relative_to("/tmp"):
            return self.root / "tmp" / p.relative_to("/tmp")  # the sandbox's own /tmp
        return p

    def read_file(self, path: str) -> str:
        """Text of a file (relative paths are under the repository root)."""
        try:
            return self._host_path(path).read_bytes().decode("utf-8", errors="replace")
        except OSError as err:
            raise SandboxError(f"cannot read {path}: {err.strerror}") from None

    def write_file(self, path: str, content: str) -> None:
        """Write a text file, creating parent directories (relative paths: under the repository)."""
        target = self._host_path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        except OSError as err:
            raise SandboxError(f"cannot write {path}: {err.strerror}") from None

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process the sandbox started and delete its directory (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        kill_marked(f"{SANDBOX_MARKER}={self.id}")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
