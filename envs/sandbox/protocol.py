"""The sandbox protocol both backends implement, and what they share.

A sandbox is one task's repository in an isolated place where shell commands run:
`exec(command, timeout) -> ExecResult`, `read_file`, `write_file`, `close`, a context manager,
and `workdir`, the repository root as commands see it. Commands run `bash -c` in a new session,
stdin closed, with pagers off; a command longer than ARG_LIMIT is passed through a file, never
raising. When a command times out everything it started is killed; on the Docker backend
background processes otherwise live until the sandbox closes, on the local backend under bwrap
they end with their command (its pid namespace). Output after a command returned is dropped.
Docker sandboxes and bwrap-isolated local ones run commands through a persistent shell
(envs.sandbox.shell): one runner process per sandbox, started inside the sandbox's isolation, forks each
command; where it cannot run, one process per command (the same contract, slower).
`read_file(path, max_bytes)` reads inside the sandbox: regular files only, at most `max_bytes`
(DEFAULT_READ_LIMIT), within a timeout; anything else is a SandboxError, so a FIFO or a 2 GB
sparse file never hangs or grows the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from envs.errors import SandboxError

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_OUTPUT_LIMIT = 100_000  # bytes of output kept per command (head + tail)
ARG_LIMIT = 64 << 10  # bytes; a longer command goes through a file (Linux caps one argument at 128 KiB)
DEFAULT_READ_LIMIT = 4 << 20  # bytes read_file returns at most
READ_TIMEOUT_S = 30.0
TIMEOUT_EXIT_CODE = 124  # exit code of a timed-out command, as GNU timeout reports it

# Environment of every command (on top of PATH, HOME, TMPDIR and the sandbox markers).
COMMAND_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "",
    "TERM": "dumb",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PIP_PROGRESS_BAR": "off",
    "PIP_NO_INPUT": "1",
    "TQDM_DISABLE": "1",
    "DEBIAN_FRONTEND": "noninteractive",
    "GIT_TERMINAL_PROMPT": "0",
}
SANDBOX_MARKER = "JAXSWE_SANDBOX"  # env var naming the sandbox; every process it starts inherits it
COMMAND_MARKER = "JAXSWE_COMMAND"  # env var naming one command of a sandbox


@dataclass(frozen=True)
class ExecResult:
    """A finished command: its (possibly cut) output, exit code, and whether it timed out."""

    output: str
    exit_code: int
    timed_out: bool = False


@runtime_checkable
class Sandbox(Protocol):
    workdir: str

    def exec(self, command: str, timeout: float | None = None) -> ExecResult: ...

    def read_file(self, path: str, max_bytes: int = DEFAULT_READ_LIMIT) -> str: ...

    def write_file(self, path: str, content: str) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None: ...


class OutputBuffer:
    """Keeps the first and last `limit // 2` bytes of a stream and counts what lies between."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT):
        if limit < 2:
            raise ValueError(f"output limit must be >= 2 bytes, got {limit}")
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = bytes(self.tail).decode("utf-8", errors="replace")
        return f"{head}\n[... {cut} bytes of output cut; {self.total} in total ...]\n{tail}"


def unrunnable(command: str) -> ExecResult | None:
    """The result for a command no shell can receive (a NUL byte cannot cross argv), else None.

    Model output can contain anything; such a command gets an error observation, like bash's
    "command not found", instead of an exception that would end the episode as an infra failure.
    """
    if "\x00" in command:
        return ExecResult("bash: the command contains a NUL byte and was not run", 126, False)
    return None


def resolve_timeout(timeout: float | None, default: float) -> float:
    value = default if timeout is None else timeout
    if not value > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {value}")
    return float(value)


# Exit codes of READ_SCRIPT (run as `sh -c READ_SCRIPT read PATH MAX_BYTES`).
_NOT_FOUND, _NOT_REGULAR, _TOO_LARGE = 90, 91, 92
READ_SCRIPT = (
    '[ -e "$1" ] || [ -L "$1" ] || exit 90; [ -f "$1" ] || exit 91; '
    'size=$(stat -L -c %s -- "$1") || exit 90; [ "$size" -le "$2" ] || { echo "$size" >&2; exit 92; }; '
    'exec head -c "$2" -- "$1"'
)


def read_error(path: str, code: int, stderr: str, max_bytes: int, timed_out: bool) -> SandboxError | None:
    """The SandboxError for a failed READ_SCRIPT run, or None when it succeeded."""
    if timed_out:
        return SandboxError(f"cannot read {path}: timed out (a FIFO or a device?)")
    if code == 0:
        return None
    why = {
        _NOT_FOUND: "no such file",
        _NOT_REGULAR: "not a regular file",
        _TOO_LARGE: f"{stderr.strip()} bytes is more than the {max_bytes} bytes read at most",
    }.get(code, stderr.strip()[-200:] or f"exit code {code}")
    return SandboxError(f"cannot read {path}: {why}")


def start_time(pid: int) -> str:
    """A process's start time in clock ticks since boot ('' if it does not exist)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def owner_labels() -> dict[str, str]:
    """Who owns the sandboxes this process makes (host, pid, process start time)."""
    import os
    import socket

    return {"host": socket.gethostname(), "pid": str(os.getpid()), "start": start_time(os.getpid())}


def owner_alive(owner: dict[str, str]) -> bool:
    """Whether the process in `owner` (owner_labels() of some process) still runs on this host."""
    import socket

    if owner.get("host") != socket.gethostname():
        return True  # another host's: not ours to judge
    pid = int(owner.get("pid", "0") or 0)
    return bool(pid) and start_time(pid) == owner.get("start")
