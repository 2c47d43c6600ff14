"""Run parsed commands against a sandbox; keeps the per-episode state (cwd, open file, window).

File commands go through the sandbox protocol (`read_file`, `write_file`, `exec`), which runs
them inside the sandbox on every backend (never on the host); reads are bounded (regular files of
at most the sandbox's read limit), and a path a sandbox call rejects becomes an observation.
Shell commands run with `bash` from the tracked current directory; an EXIT trap prints a
per-episode marker and `$PWD`, so a `cd` carries over to the next command (environment variables
do not). Every observation ends with the status line.
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
from typing import Protocol

from envs.errors import SandboxError
from jaxswe.agent.commands import Command, FormatError, UsageError
from jaxswe.agent.prompts import Prompts, render

# Paths left out of the patch: interpreter and tool caches the agent's test runs leave behind.
PATCH_EXCLUDES = ("**/__pycache__/**", "**/*.pyc", "**/.pytest_cache/**", "**/*.egg-info/**")


class ExecResultLike(Protocol):
    output: str
    exit_code: int
    timed_out: bool


class SandboxLike(Protocol):
    """The part of `envs` Sandbox the scaffold uses."""

    workdir: str

    def exec(self, command: str, timeout: float) -> ExecResultLike: ...

    def read_file(self, path: str) -> str: ...

    def write_file(self, path: str, content: str) -> None: ...


def truncate_middle(text: str, limit: int, marker: str) -> str:
    """Keep the head and tail of `text` within about `limit` characters; `marker` takes {num_chars}."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return text[:head] + "\n" + render(marker, num_chars=len(text) - limit) + "\n" + text[-tail:]


def _split_lines(content: str) -> tuple[list[str], bool]:
    """File text -> (lines without newlines, whether it ended with a newline)."""
    if not content:
        return [], True
    ends = content.endswith("\n")
    return content[:-1].split("\n") if ends else content.split("\n"), ends


def _join_lines(lines: list[str], trailing_newline: bool) -> str:
    if not lines:
        return ""
    return "\n".join(lines) + ("\n" if trailing_newline else "")


class Scaffold:
    """The agent's view of one sandbox: commands in, observation text (with status line) out."""

    def __init__(
        self,
        sandbox: SandboxLike,
        prompts: Prompts,
        *,
        window_lines: int = 100,
        command_timeout_s: float = 60.0,
        output_limit_chars: int = 8000,
    ) -> None:
        self.sandbox = sandbox
        self.prompts = prompts
        self.window_lines = window_lines
        self.command_timeout_s = command_timeout_s
        self.output_limit_chars = output_limit_chars
        self.workdir = sandbox.workdir
        self.cwd = sandbox.workdir
        self.current_file: str | None = None
        self.window_top = 1
        self._marker = f"__JAXSWE_CWD_{secrets.token_hex(8)}__"

    # ----------------------------------------------------------------- observations
    def status_line(self) -> str:
        return render(self.prompts.observations["status"], cwd=self.cwd, file=self.current_file or "n/a")

    def format_error(self, error: FormatError) -> str:
        text = render(self.prompts.format_errors[error.kind], num_blocks=error.num_blocks)
        return f"{text}\n{self.status_line()}"

    def run(self, action: Command | UsageError) -> str:
        """Execute a non-submit command; return the observation ending with the status line."""
        if isinstance(action, UsageError):
            body = self._usage(action.message)
        elif action.name == "submit":
            raise ValueError("submit is handled by the environment, not run()")
        elif action.name == "shell":
            body = self._shell(action.raw)
        else:
            try:
                body = getattr(self, f"_cmd_{action.name}")(action)
            except SandboxError as err:  # a file the sandbox will not read or write: the policy's
                body = self._usage(str(err))
        return f"{body}\n{self.status_line()}" if body else self.status_line()

    def _usage(self, message: str) -> str:
        return render(self.prompts.observations["usage_error"], message=message)

    # ----------------------------------------------------------------- shell
    def _shell(self, command: str) -> str:
        script = (
            f"cd {shlex.quote(self.cwd)} 2>/dev/null || cd {shlex.quote(self.workdir)}\n"
            f'trap \'printf "\\n%s%s\\n" {self._marker} "$PWD"\' EXIT\n'
            f"{command}\n"
        )
        result = self.sandbox.exec(script, self.command_timeout_s)
        output = result.output
        cut = output.rfind("\n" + self._marker)
        if cut >= 0:
            cwd = output[cut + 1 + len(self._marker) :].split("\n", 1)[0]
            if cwd.startswith("/"):
                self.cwd = cwd
            output = output[:cut]
        output = truncate_middle(output, self.output_limit_chars, self.prompts.observations["truncated"])
        notes = []
        if result.timed_out:
            notes.append(render(self.prompts.observations["timeout"], timeout=self.command_timeout_s))
        elif result.exit_code != 0:
            notes.append(render(self.prompts.observations["exit_code"], exit_code=result.exit_code))
        if not output.strip() and not notes:
            return self.prompts.observations["no_output"]
        return "\n".join([output.rstrip("\n"), *notes]) if output.strip() else "\n".join(notes)

    # ----------------------------------------------------------------- file helpers
    def resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def shown(self, path: str) -> str:
        """A path as observations show it: relative to the repository root when inside it, so no
        sandbox directory (random per episode with the local backend) reaches the model."""
        rel = posixpath.relpath(path, self.workdir)
        return path if rel == ".." or rel.startswith("../") else rel

    def _kind(self, path: str) -> str:
        """'file', 'dir' or 'missing' for an absolute path in the sandbox."""
        q = shlex.quote(path)
        result = self.sandbox.exec(
            f"if [ -d {q} ]; then echo dir; elif [ -f {q} ]; then echo file; else echo missing; fi",
            self.command_timeout_s,
        )
        kind = result.output.strip().splitlines()[-1:] or ["missing"]
        return kind[0] if kind[0] in ("file", "dir") else "missing"

    def _target(self, path: str | None) -> str:
        """Absolute path of an existing file (from `path` or the open file), or raise _Fail."""
        if path is None:
            if self.current_file is None:
                raise _Fail("no file is open; use `open FILE` or pass --file PATH")
            return self.current_file
        target = self.resolve(path)
        kind = self._kind(target)
        if kind == "dir":
            raise _Fail(f"{self.shown(target)} is a directory")
        if kind == "missing":
            raise _Fail(f"file {self.shown(target)} not found")
        return target

    def _window(self, path: str, lines: list[str]) -> str:
        n = len(lines)
        top = max(1, min(self.window_top, max(1, n - self.window_lines + 1)))
        self.window_top = top
        bottom = min(n, top + self.window_lines - 1)
        out = [f"[File: {self.shown(path)} ({n} lines total)]"]
        if top > 1:
            out.append(f"({top - 1} more lines above)")
        out.extend(f"{i}:{lines[i - 1]}" for i in range(top, bottom + 1))
        if bottom < n:
            out.append(f"({n - bottom} more lines below)")
        return "\n".join(out)

    def _center(self, line: int) -> None:
        self.window_top = max(1, line - self.window_lines // 2)

    def _show_current(self) -> str:
        assert self.current_file is not None
        lines, _ = _split_lines(self.sandbox.read_file(self.current_file))
        return self._window(self.current_file, lines)

    # ----------------------------------------------------------------- file commands
    def _cmd_open(self, cmd: Command) -> str:
        try:
            target = self._target(cmd.path)
        except _Fail as err:
            return self._usage(str(err))
        lines, _ = _split_lines(self.sandbox.read_file(target))
        if cmd.line is not None and cmd.line > max(len(lines), 1):
            return self._usage(
                f"line {cmd.line} is past the end of {self.shown(target)} ({len(lines)} lines)"
            )
        if target != self.current_file or cmd.line is not None:
            self.window_top = 1
            if cmd.line is not None:
                self._center(cmd.line)
        self.current_file = target
        return self._window(target, lines)

    def _cmd_goto(self, cmd: Command) -> str:
        if self.current_file is None:
            return self._usage("no file is open; use `open FILE` first")
        lines, _ = _split_lines(self.sandbox.read_file(self.current_file))
        if cmd.line > max(len(lines), 1):
            return self._usage(f"line {cmd.line} is past the end of the file ({len(lines)} lines)")
        self._center(cmd.line)
        return self._window(self.current_file, lines)

    def _cmd_scroll_down(self, cmd: Command) -> str:
        if self.current_file is None:
            return self._usage("no file is open; use `open FILE` first")
        self.window_top += self.window_lines
        return self._show_current()

    def _cmd_scroll_up(self, cmd: Command) -> str:
        if self.current_file is None:
            return self._usage("no file is open; use `open FILE` first")
        self.window_top = max(1, self.window_top - self.window_lines)
        return self._show_current()

    def _cmd_create(self, cmd: Command) -> str:
        target = self.resolve(cmd.path)
        if self._kind(target) != "missing":
            return self._usage(f"{self.shown(target)} already exists; use `open` and `edit` to change it")
        parent = posixpath.dirname(target)
        mk = self.sandbox.exec(f"mkdir -p {shlex.quote(parent)}", self.command_timeout_s)
        if mk.exit_code != 0:
            return self._usage(f"cannot create directory {parent}: {mk.output.strip()}")
        self.sandbox.write_file(target, _join_lines(list(cmd.lines), True))
        self.current_file, self.window_top = target, 1
        return self._show_current()

    def _cmd_edit(self, cmd: Command) -> str:
        try:
            target = self._target(cmd.path)
        except _Fail as err:
            return self._usage(str(err))
        lines, trailing = _split_lines(self.sandbox.read_file(target))
        if cmd.start > len(lines) + 1 or cmd.end > len(lines):
            return self._usage(
                f"range {cmd.start}:{cmd.end} is outside {self.shown(target)} ({len(lines)} lines; "
                f"use {len(lines) + 1}:{len(lines)} to append)"
            )
        lines[cmd.start - 1 : cmd.end] = list(cmd.lines)
        self.sandbox.write_file(target, _join_lines(lines, trailing))
        self.current_file = target
        self._center(cmd.start)
        return self._window(target, lines)

    def _cmd_replace(self, cmd: Command) -> str:
        try:
            target = self._target(cmd.path)
        except _Fail as err:
            return self._usage(str(err))
        lines, trailing = _split_lines(self.sandbox.read_file(target))
        first_changed = None
        for n, (search, new) in enumerate(cmd.pairs, 1):
            k = len(search)
            hits = [i for i in range(len(lines) - k + 1) if tuple(lines[i : i + k]) == search]
            label = f"SEARCH block {n}" if len(cmd.pairs) > 1 else "the SEARCH text"
            if not hits:
                return self._usage(
                    f"{label} was not found in {self.shown(target)} (whitespace must match exactly)"
                )
            if len(hits) > 1 and not cmd.replace_all:
                where = ", ".join(str(i + 1) for i in hits[:10])
                return self._usage(
                    f"{label} matches {len(hits)} places in {self.shown(target)} (lines {where}); "
                    "add context lines to make it unique, or use --replace-all"
                )
            for i in reversed(hits):  # bottom-up so earlier indices stay valid
                lines[i : i + k] = list(new)
            first_changed = hits[0] if first_changed is None else min(first_changed, hits[0])
        self.sandbox.write_file(target, _join_lines(lines, trailing))
        self.current_file = target
        self._center(first_changed + 1)
        return self._window(target, lines)

    def _cmd_search_file(self, cmd: Command) -> str:
        try:
            target = self._target(cmd.path)
        except _Fail as err:
            return self._usage(str(err))
        lines, _ = _split_lines(self.sandbox.read_file(target))
        hits = [f"{i}:{line}" for i, line in enumerate(lines, 1) if cmd.term in line]
        if not hits:
            return f'No matches found for "{cmd.term}" in {self.shown(target)}'
        body = "\n".join(hits)
        body = truncate_middle(body, self.output_limit_chars, self.prompts.observations["truncated"])
        return f'Found {len(hits)} matches for "{cmd.term}" in {self.shown(target)}:\n{body}'

    # ----------------------------------------------------------------- patch
    def start_tree(self) -> str:
        """The checkout's state at episode start as a git tree (a task image's own uncommitted setup
        edits included, e.g. SWE-bench's `-rA` in tox.ini): patches are taken against it."""
        excludes = " ".join(shlex.quote(f":(exclude,glob){p}") for p in PATCH_EXCLUDES)
        q = shlex.quote(self.workdir)
        result = self.sandbox.exec(
            f"git -C {q} add -A -- . {excludes} >/dev/null 2>&1; git -C {q} write-tree",
            self.command_timeout_s,
        )
        tree = result.output.strip().splitlines()[-1:] if result.exit_code == 0 else []
        if not tree:
            raise RuntimeError(
                f"cannot read the start state of {self.workdir}: {result.output.strip()[:200]}"
            )
        return tree[0]

    def diff_patch(self, start: str) -> str:
        """Everything the agent changed since `start` (a tree or commit), new files included, caches excluded.

        The diff goes to a file under .git (outside the work tree) and is read back whole, so the
        sandbox's output limit never cuts it.
        """
        excludes = " ".join(shlex.quote(f":(exclude,glob){p}") for p in PATCH_EXCLUDES)
        q = shlex.quote(self.workdir)
        out = posixpath.join(self.workdir, ".git", f"jaxswe-{secrets.token_hex(4)}.patch")
        result = self.sandbox.exec(
            f"git -C {q} add -A -- . {excludes} >/dev/null 2>&1; "
            f"git -C {q} -c core.quotepath=false diff --cached --no-color --no-ext-diff --binary "
            f"{shlex.quote(start)} > {shlex.quote(out)}",
            self.command_timeout_s,
        )
        if result.exit_code != 0 or result.timed_out:
            raise RuntimeError(f"git diff failed in {self.workdir}: {result.output.strip()[:300]}")
        return self.sandbox.read_file(out)


class _Fail(Exception):
    """A file command that cannot run; its message becomes a usage observation."""
