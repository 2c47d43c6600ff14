"""Persistent shells: one long-lived runner process per sandbox that runs each command.

Spawning an isolated process per command (bwrap + setpriv locally, `docker exec` in Docker) costs
tens to hundreds of milliseconds; the runner (envs/sandbox/shell_runner.py, stdlib Python started once
inside the same isolation) forks each command in a new session with stdin closed and answers
with its exit code and output. The host side here frames requests and answers over the runner's
stdin and stdout: length-prefixed, every answer opened by a random per-shell token, command output
only ever as counted bytes, so nothing a command prints can forge an answer; the command cannot
reach the channel (its descriptors are closed in the child and the runner is non-dumpable).
When the runner dies or its answer does not come, `ShellDied` is raised: the backend kills what
is left, reports the command's fate and starts a fresh runner next time (or falls back to one
process per command when a runner cannot start).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import struct
import time
from pathlib import Path

from envs.sandbox.protocol import ARG_LIMIT, TIMEOUT_EXIT_CODE, ExecResult, OutputBuffer

RUNNER_SOURCE = Path(__file__).with_name("shell_runner.py").read_text()
_SOURCE = RUNNER_SOURCE.encode()
# What the runner's command line holds (`python3 -I -S -c BOOT N MODE`): it reads its N bytes of
# source from stdin first, so `ps` inside a sandbox shows a short line, not the whole program.
BOOT = (
    "import os,sys\nn=int(sys.argv[1])\nb=b''\nwhile len(b)<n:\n b+=os.read(0,n-len(b)) or sys.exit(1)\n"
    "exec(compile(b,'jaxswe-shell','exec'))"
)


def runner_argv(python: str, mode: str) -> list[str]:
    """The command line that starts a runner (`mode`: "ns" or "marker", see envs/sandbox/shell_runner.py)."""
    return [python, "-I", "-S", "-c", BOOT, str(len(_SOURCE)), mode]


def command_request(command: str, script_path: str) -> tuple[list[str], dict[str, str] | None]:
    """(argv, files) that run `command` with `bash -c`; a command longer than ARG_LIMIT goes
    through a file at `script_path` (written by the runner before it runs argv)."""
    if len(command.encode()) <= ARG_LIMIT:
        return ["bash", "-c", command], None
    return ["bash", "-c", 'script=$1; shift; . "$script"', "bash", script_path], {script_path: command}


def exec_result(reply: Reply | None, died: ShellDied | None, output_limit: int, died_code: int) -> ExecResult:
    """The ExecResult of a shell request: the reply's, or, when the shell died under the command,
    a note saying so (exit `died_code`, or the timeout code when it was killed at its timeout)."""
    if died is not None:
        why = "timed out and was killed" if died.timed_out else "died"
        return ExecResult(
            f"[the sandbox's shell {why} during this command ({died}); its output is lost; "
            "what it started was killed and a new shell runs the next command]\n",
            TIMEOUT_EXIT_CODE if died.timed_out else died_code, died.timed_out,
        )  # fmt: skip
    code = TIMEOUT_EXIT_CODE if reply.timed_out else reply.code
    return ExecResult(reply.buffer(output_limit).text(), code, reply.timed_out)


START_TIMEOUT_S = 20.0
ANSWER_GRACE_S = 5.0  # past a command's own timeout, how long the host waits for its answer


class ShellDied(Exception):
    """The runner is gone or stopped answering (the command's result is unknown)."""

    def __init__(self, why: str, *, timed_out: bool = False, started: bool = True):
        super().__init__(why)
        self.timed_out = timed_out
        self.started = started  # False: the runner never accepted the request (safe to run again)


class ShellRefused(Exception):
    """The runner lives but could not run this request (the caller runs it another way)."""


class Reply:
    def __init__(self, header: dict, head: bytes, tail: bytes, err: bytes):
        self.code = int(header["code"])
        self.timed_out = bool(header["timed_out"])
        self.total = int(header["total"])
        self.left = int(header.get("left", 0))
        self.head, self.tail, self.err = head, tail, err

    def buffer(self, limit: int) -> OutputBuffer:
        buf = OutputBuffer(limit)
        buf.head, buf.tail, buf.total = bytearray(self.head), bytearray(self.tail), self.total
        return buf


class Shell:
    """Host side of one runner, over a transport with `send(bytes)`, `recv(n, deadline) -> bytes`
    (b"" at end of stream) and `close()`."""

    def __init__(self, transport):
        self.transport = transport
        self.token = secrets.token_bytes(16)
        self.alive = True
        self.pid = 0  # the runner's pid as the sandbox sees it
        self.transport.send(_SOURCE + self.token)
        hello = self._exact(20, time.monotonic() + START_TIMEOUT_S)
        if hello[:16] != self.token:
            self.close()
            raise ShellDied("the runner did not start (bad greeting)")
        self.pid = struct.unpack(">I", hello[16:])[0]

    def _exact(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                data = self.transport.recv(n - len(out), deadline)
            except (OSError, ValueError) as err:  # closed under us (the sandbox is closing)
                self.alive = False
                raise ShellDied(f"the runner's channel failed: {err}") from None
            if not data:
                self.alive = False
                raise ShellDied("the runner's channel closed")
            out += data
        return bytes(out)

    def run(self, argv: list[str], env: dict[str, str], *, cwd: str | None, timeout: float, head: int,
            tail: int, cap: int | None = None, merge: bool = True, stdin: bytes | None = None,
            files: dict[str, str] | None = None, marker: str = "", inherit_env: bool = False,
            ) -> Reply:  # fmt: skip
        if not self.alive:
            raise ShellDied("the runner is gone")
        header = {
            "argv": argv, "env": env, "cwd": cwd, "timeout": timeout, "head": head, "tail": tail,
            "cap": cap, "merge": merge, "files": files or {}, "marker": marker, "inherit_env": inherit_env,
            "stdin": -1 if stdin is None else len(stdin), "ack": self.transport.ack,
        }  # fmt: skip
        body = json.dumps(header).encode()
        try:
            self.transport.send(b"Q" + struct.pack(">I", len(body)) + body + (stdin or b""))
        except (OSError, ValueError) as err:
            self.alive = False
            raise ShellDied(f"cannot write to the runner: {err}", started=False) from None
        if self.transport.ack:  # a transport that cannot tell whether the request was read
            try:
                accepted = self._exact(20, time.monotonic() + START_TIMEOUT_S)
            except ShellDied as err:
                raise ShellDied(str(err), started=False) from None
            if accepted != self.token + b"\xff\xff\xff\xff":
                self.alive = False
                raise ShellDied("the runner's acceptance is not framed by its token")
        deadline = time.monotonic() + timeout + ANSWER_GRACE_S
        try:
            first = self._exact(20, deadline)
        except ShellDied as err:
            if not self.transport.ack and self.transport.unread():  # it died before reading it
                raise ShellDied(str(err), started=False) from None
            raise
        if first[:16] != self.token:
            self.alive = False
            raise ShellDied("the runner's answer is not framed by its token")
        size = struct.unpack(">I", first[16:])[0]
        if size > 1 << 20:
            self.alive = False
            raise ShellDied("the runner's answer header is implausibly large")
        answer = json.loads(self._exact(size, deadline))
        if "error" in answer:  # the runner lives; the request failed in it
            if answer.get("started"):  # after the command started: not to be run again
                raise ShellDied(answer["error"])
            raise ShellRefused(answer["error"])
        lengths = [int(answer[k]) for k in ("nhead", "ntail", "nerr")]
        if sum(lengths) > head + tail + 4096:
            self.alive = False
            raise ShellDied("the runner's answer is larger than asked for")
        data = self._exact(sum(lengths), deadline) if sum(lengths) else b""
        a, b = lengths[0], lengths[0] + lengths[1]
        return Reply(answer, data[:a], data[a:b], data[b:])

    def close(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):
            self.transport.close()


class PipeTransport:
    """A runner's stdin and stdout as the pipes of a local process. Whether a request was read is
    told by the bytes left in the stdin pipe (no acknowledgement, which would cost a wake-up)."""

    ack = False

    def __init__(self, proc):
        self.proc = proc
        self.out = proc.stdout.fileno()

    def unread(self) -> int:
        """Bytes written to the runner's stdin and not read yet."""
        import fcntl
        import termios

        try:
            got = fcntl.ioctl(self.proc.stdin.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):
            return 0
        return struct.unpack("i", got)[0]

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, n: int, deadline: float) -> bytes:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([self.out], [], [], wait)[0]:
            raise ShellDied("the runner did not answer in time", timed_out=True)
        return os.read(self.out, min(n, 1 << 20))

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class DockerTransport:
    """A runner's stdin and stdout as an attached `docker exec` socket (stdout and stderr arrive
    multiplexed: 8-byte frame headers, stream 1 is the runner's stdout, anything else is dropped).
    The runner acknowledges each request once read (the engine's buffers hide what it read)."""

    ack = True

    def __init__(self, sock):
        self.sock = getattr(sock, "_sock", sock)
        # an ssh:// engine's socket is the docker SDK's stand-in over an `ssh ... dial-stdio` process:
        # its bytes come from that process's stdout, a buffered pipe that may already hold some
        self.pipe = getattr(getattr(self.sock, "proc", None), "stdout", None)
        if self.pipe is not None:
            os.set_blocking(self.pipe.fileno(), False)
        else:
            self.sock.setblocking(True)
        self.pending = bytearray()  # stdout bytes received but not yet returned
        self.frame_left, self.frame_stream = 0, 1
        self.header = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, deadline: float) -> bytes | None:
        """The bytes that arrived (b"" at the end of the stream), or None if none by `deadline`."""
        if self.pipe is not None and (data := self.pipe.read1(1 << 16)):
            return data  # buffered, or ready in the pipe
        wait = deadline - time.monotonic()
        source = self.pipe.fileno() if self.pipe is not None else self.sock
        if wait <= 0 or not select.select([source], [], [], wait)[0]:
            return None
        return (self.pipe.read1(1 << 16) or b"") if self.pipe is not None else self.sock.recv(1 << 16)

    def recv(self, n: int, deadline: float) -> bytes:
        while not self.pending:
            data = self._read(deadline)
            if data is None:
                raise ShellDied("the runner did not answer in time", timed_out=True)
            if not data:
                return b""
            self._demux(data)
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    def _demux(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.frame_left == 0:
                need = 8 - len(self.header)
                self.header += view[:need]
                view = view[need:]
                if len(self.header) == 8:
                    self.frame_stream = self.header[0]
                    self.frame_left = struct.unpack(">I", bytes(self.header[4:]))[0]
                    self.header.clear()
                continue
            chunk = view[: self.frame_left]
            view = view[len(chunk) :]
            self.frame_left -= len(chunk)
            if self.frame_stream == 1:
                self.pending += chunk

    def close(self) -> None:
        self.sock.close()
