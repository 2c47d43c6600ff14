"""DockerSandbox: one container per episode from the task's image, removed on every exit path.

The container's main process is `sleep <lifetime_s>` under the engine's init, and the engine
removes it when it stops (auto-remove): a container ends itself once its lifetime has passed even
when the trainer was SIGKILLed. No network; memory, CPU and pids limits; every capability dropped,
no-new-privileges and the engine's default seccomp profile (never turned off: it refuses the kernel
keyring, which no namespace isolates, as envs.sandbox.seccomp does for local sandboxes); every command
and file write as the unprivileged SANDBOX_USER, who owns the repository in the task images
(envs.provision.images) and nothing else; labelled with its owner (host, pid, process start time) and run.
A command longer than ARG_LIMIT goes through a file.
A container that dies under a command (the command killed its init or ran it out of memory) is
the policy's doing: that exec and every later one return exit code 137 and a message, and
`dead` is set, instead of an exception (an infrastructure failure). Commands run through the
container's persistent shell (envs.sandbox.shell): one long-lived `docker exec` of the image's python3
as SANDBOX_USER that forks each command; on timeout it kills the command's process group, then
every process still carrying the command's environment marker (nohup, setsid). Output stops
being read 50 ms after the command returns, so a background process that still writes to it gets
SIGPIPE (redirect its output). A command that kills the shell gets exit code 137 and a message,
and the next command starts a new one. `read_file` goes through it too. Without it
(`persistent_shell = False`, an image without python3, or a second thread's concurrent call)
each command is `timeout -s KILL <t> bash -c <command>` through its own `docker exec`, with the
same kills.
`reap_containers()` (run once per process before the first container starts) removes labelled
containers whose owner died.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import os
import posixpath
import shlex
import socket
import tarfile
import threading
import time
import uuid
import weakref

from envs.errors import SandboxError
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
    read_error,
    resolve_timeout,
    start_time,
    unrunnable,
)
from envs.sandbox.shell import (
    DockerTransport,
    Shell,
    ShellDied,
    ShellRefused,
    command_request,
    exec_result,
    runner_argv,
)

TESTBED = "/testbed"
SANDBOX_USER = "1000:1000"  # who runs every sandbox command; owns the repository in task images
LABEL = "jaxswe.sandbox"
BUILD_LABEL = "jaxswe.build"
DEFAULT_LIFETIME_S = 6 * 3600.0  # a container's own deadline: longer than any episode plus its grading
DEAD_EXIT_CODE = 137
_WATCHDOG_GRACE_S = 0.1  # the client kills marked processes this long after the deadline
# Kill every process whose environment holds the entry $1 (run inside the container).
_KILL_MARKED = (
    "for r in 1 2 3 4 5; do found=; for d in /proc/[0-9]*; do "
    'if tr "\\0" "\\n" < "$d/environ" 2>/dev/null | grep -qxF "$1"; then kill -9 "${d#/proc/}" 2>/dev/null; found=1; fi; '  # noqa: E501
    'done; [ -z "$found" ] && break; done'
)
_SHELL_MAX_STARTS = 20  # persistent shells one sandbox starts at most; then one exec per command
_LIVE: weakref.WeakSet = weakref.WeakSet()
_reaped = False
_reap_lock = threading.Lock()


def _client(client=None):
    if client is not None:
        return client
    import docker

    try:
        return docker.from_env()
    except docker.errors.DockerException as err:
        host = os.environ.get("DOCKER_HOST", "the default socket")
        raise SandboxError(f"no Docker engine reachable at {host}: {err}") from None


def engine_available() -> bool:
    """Whether a Docker engine answers at DOCKER_HOST (or the default socket)."""
    try:
        _client().ping()
        return True
    except Exception:
        return False


_UNOWNED_BUILD_AGE_S = 2 * 3600.0  # a build container without an owner label is reaped after this


def _age_s(container) -> float:
    from datetime import datetime

    created = container.attrs.get("Created", "")
    try:
        when = datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00")
    except ValueError:
        return 0.0
    return time.time() - when.timestamp()


def _listed(client, label: str) -> list:
    """Containers labelled `label`; listing again when one is removed while the list is inspected."""
    import docker

    for _ in range(5):
        try:
            return client.containers.list(all=True, filters={"label": f"{label}=1"})
        except docker.errors.NotFound:  # auto-removed between the list and its inspection
            time.sleep(0.1)
    return []


def reap_containers(client=None) -> list[str]:
    """Remove this host's labelled sandbox and build containers whose owner process is gone; their names.

    Build containers (envs.provision.images) carry no owner label: those are removed once 2 hours old."""
    client = _client(client)
    removed = []
    for label in (LABEL, BUILD_LABEL):
        for container in _listed(client, label):
            labels = container.labels
            owner = {k: labels.get(f"jaxswe.owner_{k}", "") for k in ("host", "pid", "start")}
            if label == BUILD_LABEL and not owner["host"]:
                if _age_s(container) < _UNOWNED_BUILD_AGE_S:
                    continue  # an unowned build container may be some process's build in progress
            elif owner_alive(owner):
                continue
            try:
                container.remove(force=True)
                removed.append(container.name)
            except Exception:  # already gone (another reaper, or auto-removed)
                pass
    return removed


def _reap_once(client) -> None:
    global _reaped
    with _reap_lock:
        if not _reaped:
            reap_containers(client)
            _reaped = True


class DockerSandbox:
    """A container of `image` with the repository at `workdir` (see the module docstring)."""

    persistent_shell = True  # commands run through one long-lived `docker exec` (envs.sandbox.shell)
    _shell_guard = threading.Lock()

    def __init__(
        self,
        image: str,
        *,
        workdir: str = TESTBED,
        shell_init: str = "",
        timeout: float = DEFAULT_TIMEOUT_S,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        mem_limit: str = "2g",
        cpus: float = 1.0,
        pids_limit: int = 512,
        lifetime_s: float = DEFAULT_LIFETIME_S,
        run: str = "",
        env: dict[str, str] | None = None,
        client=None,
    ):
        import docker

        self.client = _client(client)
        self.api = self.client.api
        self.image = image
        self.workdir = workdir
        self.shell_init = shell_init
        self.timeout = resolve_timeout(timeout, DEFAULT_TIMEOUT_S)
        self.output_limit = output_limit
        self.id = uuid.uuid4().hex
        self._counter = itertools.count()
        self._closed = False
        self.dead = False
        self._lock = threading.Lock()
        self._env = {**COMMAND_ENV, "HOME": "/tmp", SANDBOX_MARKER: self.id, **(env or {})}
        _reap_once(self.client)
        labels = {
            LABEL: "1",
            "jaxswe.owner_host": socket.gethostname(),
            "jaxswe.owner_pid": str(os.getpid()),
            "jaxswe.owner_start": start_time(os.getpid()),
            "jaxswe.deadline": str(int(time.time() + resolve_timeout(lifetime_s, DEFAULT_LIFETIME_S))),
            "jaxswe.run": run,
        }
        try:
            self.container = self.client.containers.create(
                image,
                command=["sleep", str(int(resolve_timeout(lifetime_s, DEFAULT_LIFETIME_S)))],
                auto_remove=True,
                name=f"jaxswe-{self.id[:16]}",
                init=True,
                network_mode="none",
                mem_limit=mem_limit,
                memswap_limit=mem_limit,
                nano_cpus=int(cpus * 1e9),
                pids_limit=pids_limit,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                labels=labels,
                working_dir=workdir,
                environment={SANDBOX_MARKER: self.id},
            )
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {image} is not on the Docker engine") from None
        except docker.errors.APIError as err:
            raise SandboxError(f"cannot create a container of {image}: {err.explanation or err}") from None
        try:
            self.container.start()
        except BaseException:
            self.container.remove(force=True)
            raise
        _LIVE.add(self)

    # -- commands -------------------------------------------------------------------------------
    def _exec_raw(self, argv: list[str], env: dict[str, str] | None = None):
        exec_id = self.api.exec_create(
            self.container.id, argv, stdout=True, stderr=True, stdin=False, tty=False,
            environment=env or self._env, workdir=self.workdir, user=SANDBOX_USER,
        )["Id"]  # fmt: skip
        return exec_id, self.api.exec_start(exec_id, stream=True, demux=False)

    def _kill_marked(self, entry: str) -> None:
        try:
            _, stream = self._exec_raw(["sh", "-c", _KILL_MARKED, "kill", entry])
            for _ in stream:
                pass
        except Exception:  # the container is gone or out of pids; close() removes it anyway
            pass

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run `command` with `bash -c` in the repository inside the container."""
        if self._closed:
            raise SandboxError("exec on a closed sandbox")
        if (refused := unrunnable(command)) is not None:
            return refused
        if self.dead:
            return self._dead_result()
        limit = resolve_timeout(timeout, self.timeout)
        n = next(self._counter)
        marker_value = f"{self.id}.{n}"
        marker = f"{COMMAND_MARKER}={marker_value}"
        script = f"{self.shell_init}\n{command}" if self.shell_init else command
        if (result := self._shell_exec(script, limit, marker_value)) is not None:
            return result
        argv = ["timeout", "-s", "KILL", f"{limit:.3f}s", "bash", "-c", script]
        if len(script.encode()) > ARG_LIMIT:  # too long for one argument: through a file
            path = f"/tmp/.jaxswe-command-{uuid.uuid4().hex}.sh"
            self._put(path, script.encode())
            argv[-1:] = ['script=$1; shift; . "$script"; rc=$?; rm -f "$script"; exit $rc', "bash", path]
        buf = OutputBuffer(self.output_limit)
        fired = threading.Event()

        def watchdog() -> None:  # also kills what left the group (setsid) and holds the output open
            fired.set()
            self._kill_marked(marker)

        start = time.monotonic()
        try:
            exec_id, stream = self._exec_raw(argv, {**self._env, COMMAND_MARKER: marker_value})
        except Exception as err:
            if self._died():
                return self._dead_result()
            raise SandboxError(f"docker exec failed: {err}") from None
        timer = threading.Timer(limit + _WATCHDOG_GRACE_S, watchdog)
        timer.daemon = True
        timer.start()
        try:
            for chunk in stream:
                buf.add(chunk)
        finally:
            timer.cancel()
            timer.join()
        code = self.api.exec_inspect(exec_id).get("ExitCode")
        if code in (None, DEAD_EXIT_CODE, -1) and self._died():
            return ExecResult(buf.text() + self._dead_result().output, DEAD_EXIT_CODE)
        elapsed = time.monotonic() - start
        timed_out = fired.is_set() or (code == 137 and elapsed >= limit - 0.05)
        if timed_out:
            if not fired.is_set():  # `timeout` killed the group; kill what left it (setsid, nohup)
                self._kill_marked(marker)
            code = TIMEOUT_EXIT_CODE
        return ExecResult(output=buf.text(), exit_code=-1 if code is None else code, timed_out=timed_out)

    # -- the persistent shell (envs.sandbox.shell) ----------------------------------------------
    def _shell_exec(self, script: str, limit: float, marker_value: str) -> ExecResult | None:
        """Run `script` through the container's persistent shell; None when it cannot (the caller
        makes one `docker exec` for it: no python3 in the image, switched off, or another thread's
        command is running in it)."""
        argv, files = command_request(script, f"/tmp/.jaxswe-command-{uuid.uuid4().hex}.sh")
        half = self.output_limit // 2
        got = self._through_shell(argv, marker_value, limit, head=half, tail=half, files=files)
        if got is None:
            return None
        if got == (None, None):
            return self._dead_result()
        return exec_result(*got, self.output_limit, DEAD_EXIT_CODE)

    def _through_shell(self, argv: list[str], marker_value: str, limit: float, **kw):
        """(reply, None) from the shell; (None, ShellDied) when it died under the request (what the
        request started is killed); (None, None) when the container is gone (`dead`); None when no
        shell can take it: the caller makes a `docker exec` for it."""
        if not self.persistent_shell or self._closed:
            return None
        with self._shell_guard:
            if "_shell_lock" not in self.__dict__:
                self._shell_lock, self._shell = threading.Lock(), None
                self._shell_starts, self.shell_note = 0, ""
        if not self._shell_lock.acquire(blocking=False):
            return None
        try:
            marker = f"{COMMAND_MARKER}={marker_value}"
            env = {**self._env, COMMAND_MARKER: marker_value}
            for attempt in range(2):  # a shell found dead before it took the request: a new one
                if (shell := self._ensure_shell()) is None:
                    return None
                try:
                    reply = shell.run(argv, env, cwd=self.workdir, timeout=limit, marker=marker,
                                      inherit_env=True, **kw)  # fmt: skip
                    return reply, None
                except ShellRefused:
                    return None
                except ShellDied as err:
                    self._stop_shell(kill=True)
                    self.shell_note = f"shell restarted after: {err}"
                    if self._died():
                        return None, None
                    if err.started:
                        self._kill_marked(marker)
                        return None, err
                    if attempt == 1:
                        return None
            return None
        finally:
            self._shell_lock.release()

    def _ensure_shell(self) -> Shell | None:
        if self._shell is not None and self._shell.alive:
            return self._shell
        if self._shell is not None:
            self._stop_shell(kill=True)
        if self._shell_starts >= _SHELL_MAX_STARTS or self.dead or self._closed:
            return None
        self._shell_starts += 1
        try:
            exec_id = self.api.exec_create(
                self.container.id, runner_argv("python3", "marker"), stdin=True,
                stdout=True, stderr=True, tty=False, environment=self._env, workdir=self.workdir,
                user=SANDBOX_USER,
            )["Id"]  # fmt: skip
            self._shell = Shell(DockerTransport(self.api.exec_start(exec_id, socket=True)))
        except (ShellDied, OSError, Exception) as err:
            self.shell_note = f"no persistent shell ({err}): one docker exec per command"
            self._shell = None
            return None
        return self._shell

    def _stop_shell(self, kill: bool = False) -> None:
        shell, self._shell = getattr(self, "_shell", None), None
        if shell is None:
            return
        shell.close()
        if kill and shell.pid:  # it may be stopped (SIGSTOP) or busy: end it
            with contextlib.suppress(Exception):
                _, stream = self._exec_raw(["kill", "-9", str(shell.pid)])
                for _ in stream:
                    pass

    def _died(self, wait_s: float = 1.0) -> bool:
        """Whether the container stopped under a command (its main process was killed, or it ran out of
        memory); a stopping container can look running for a moment, so this looks for `wait_s`."""
        import docker

        deadline = time.monotonic() + wait_s
        while not self.dead:
            try:
                self.container.reload()
                self.dead = self.container.status != "running"
            except docker.errors.NotFound:
                self.dead = True
            if self.dead or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return self.dead

    def _dead_result(self) -> ExecResult:
        return ExecResult(
            "the sandbox is gone: a command killed it or ran it out of memory\n", DEAD_EXIT_CODE
        )

    # -- files ----------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.workdir, path)

    def read_file(self, path: str, max_bytes: int = DEFAULT_READ_LIMIT) -> str:
        """Text of a regular file of at most `max_bytes` in the container (relative: under the repository)."""
        if "\0" in path:
            raise SandboxError(f"cannot read {path!r}: the name holds a NUL byte")
        if self.dead:
            raise SandboxError(f"cannot read {path}: the sandbox is gone")
        read = ["sh", "-c", READ_SCRIPT, "read", self._abs(path), str(max_bytes)]
        got = self._through_shell(read, f"{self.id}.{next(self._counter)}", READ_TIMEOUT_S,
                                  head=max_bytes + 1, tail=0, cap=max_bytes, merge=False)  # fmt: skip
        if got is not None and got[0] is not None:
            reply = got[0]
            code, err = reply.code, reply.err.decode("utf-8", "replace")
            if len(reply.head) > max_bytes and not reply.timed_out and code != 0:  # grew past the cap
                code, err = 92, str(len(reply.head))
            if (error := read_error(path, code, err, max_bytes, reply.timed_out)) is not None:
                raise error
            return reply.head[:max_bytes].decode("utf-8", errors="replace")
        if self.dead:
            raise SandboxError(f"cannot read {path}: the sandbox is gone")
        argv = ["timeout", "-s", "KILL", f"{READ_TIMEOUT_S:.0f}s", "sh", "-c", READ_SCRIPT, "read",
                self._abs(path), str(max_bytes)]  # fmt: skip
        exec_id = self.api.exec_create(
            self.container.id,
            argv,
            stdout=True,
            stderr=True,
            workdir=self.workdir,
            environment=self._env,
            user=SANDBOX_USER,
        )["Id"]
        out, err = bytearray(), bytearray()
        for chunk_out, chunk_err in self.api.exec_start(exec_id, stream=True, demux=True):
            if chunk_out and len(out) <= max_bytes:
                out += chunk_out
            if chunk_err and len(err) < 4096:
                err += chunk_err
        code = self.api.exec_inspect(exec_id).get("ExitCode")
        error = read_error(path, code, err.decode("utf-8", "replace"), max_bytes, code == DEAD_EXIT_CODE)
        if error is not None:
            raise error
        return bytes(out[:max_bytes]).decode("utf-8", errors="replace")

    def _put(self, target: str, data: bytes) -> None:
        parent, name = posixpath.split(target)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            info.uid, info.gid = (int(n) for n in SANDBOX_USER.split(":"))
            tar.addfile(info, io.BytesIO(data))
        if not self.api.put_archive(self.container.id, parent, buf.getvalue()):
            raise SandboxError(f"cannot write {target}")

    def write_file(self, path: str, content: str) -> None:
        """Write a text file, creating parent directories (relative paths: under the repository).

        The engine extracts archives as root, following symlinks in the path, so the content goes
        to a fresh name in /tmp (root's, sticky) and the sandbox user copies it to `path`: a
        symlink the agent planted resolves with that user's rights only."""
        if "\0" in path:
            raise SandboxError(f"cannot write {path!r}: the name holds a NUL byte")
        target = self._abs(path)
        staged = f"/tmp/.jaxswe-write-{uuid.uuid4().hex}"
        try:
            self._put(staged, content.encode())
        except Exception as err:
            raise SandboxError(f"cannot write {path}: {err}") from None
        t, src = shlex.quote(target), shlex.quote(staged)
        copy = f'mkdir -p -- "$(dirname -- {t})" && cat -- {src} > {t}; rc=$?; rm -f -- {src}; exit $rc'
        copied = self.exec(copy, timeout=30)
        if copied.exit_code != 0:
            raise SandboxError(f"cannot write {path}: {copied.output.strip()[-300:]}")

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Remove the container and everything in it (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_shell()  # its socket; the runner goes with the container
        try:
            self.container.remove(force=True)
        except Exception as err:
            if "No such container" not in str(err) and "already in progress" not in str(err):
                raise SandboxError(f"cannot remove container {self.container.name}: {err}") from None
        _LIVE.discard(self)

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and hasattr(self, "container"):
            self.close()


@atexit.register
def _close_all() -> None:
    for sandbox in list(_LIVE):
        with contextlib.suppress(Exception):
            sandbox.close()
