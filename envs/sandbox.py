"""The sandbox protocol both backends implement, and what they share.

A sandbox is one task's repository in an isolated place where shell commands run:
`exec(command, timeout) -> ExecResult`, `read_file`, `write_file`, `close`, a context manager,
and `workdir`, the repository root as commands see it. Commands run `bash -c` in a new session,
stdin closed, with pagers off; background processes a command starts live on until the sandbox
closes, except when the command times out: then everything it started is killed. Their output
after the command returned is dropped, so redirect a server's output to a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_OUTPUT_LIMIT = 100_000  # bytes of output kept per command (head + tail)
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

    def read_file(self, path: str) -> str: ...

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
