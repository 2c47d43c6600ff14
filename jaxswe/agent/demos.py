"""Turn a unified diff into scaffold commands (scripted demonstrations, scaffold tests).

Each hunk becomes one `edit --file PATH START:END` with a heredoc holding only the changed span
(the hunk's leading and trailing context is trimmed); a new file becomes one `create` with its
content, a deleted file `rm`, a rename `mv`. Hunks are emitted top to bottom: each one's start is
taken in new-file coordinates, which is where its lines sit once the hunks above it are applied.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from jaxswe.errors import UserError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class DemoError(UserError):
    """A patch that cannot be turned into scaffold commands."""


@dataclass
class _Hunk:
    old_start: int
    new_start: int
    old_count: int
    new_count: int
    body: list[tuple[str, str]] = field(default_factory=list)  # (' ' | '-' | '+', line)

    def is_open(self) -> bool:
        """True while the body has fewer lines than the header announced."""
        old = sum(tag != "+" for tag, _ in self.body)
        new = sum(tag != "-" for tag, _ in self.body)
        return old < self.old_count or new < self.new_count


@dataclass
class _FileDiff:
    old: str | None = None
    new: str | None = None
    new_file: bool = False
    deleted: bool = False
    rename_from: str | None = None
    rename_to: str | None = None
    binary: bool = False
    hunks: list[_Hunk] = field(default_factory=list)


def _strip(name: str) -> str | None:
    name = name.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name


def _parse_unified_diff(patch: str) -> list[_FileDiff]:
    """Split a git-style unified diff into files and hunks."""
    files: list[_FileDiff] = []
    cur: _FileDiff | None = None
    hunk: _Hunk | None = None
    for line in patch.split("\n"):
        if line.startswith("diff --git "):
            cur, hunk = _FileDiff(), None
            files.append(cur)
            parts = line.split(" ")
            if len(parts) == 4:
                cur.old, cur.new = _strip(parts[2]), _strip(parts[3])
        elif cur is None and line.startswith("--- "):
            cur, hunk = _FileDiff(), None
            files.append(cur)
            cur.old = _strip(line[4:])
        elif cur is None:
            continue
        elif hunk is not None and hunk.is_open() and line[:1] in (" ", "-", "+", ""):
            hunk.body.append((line[:1] or " ", line[1:]))  # "" is a context line whose space was stripped
        elif line.startswith("\\"):
            continue  # "\ No newline at end of file"
        elif m := _HUNK.match(line):
            a, b, c, d = m.groups()
            hunk = _Hunk(int(a), int(c), int(b) if b is not None else 1, int(d) if d is not None else 1)
            cur.hunks.append(hunk)
        elif line.startswith("--- "):
            cur.old = _strip(line[4:])
        elif line.startswith("+++ "):
            cur.new = _strip(line[4:])
        elif line.startswith("new file mode"):
            cur.new_file = True
        elif line.startswith("deleted file mode"):
            cur.deleted = True
        elif line.startswith("rename from "):
            cur.rename_from = line[len("rename from ") :]
        elif line.startswith("rename to "):
            cur.rename_to = line[len("rename to ") :]
        elif line.startswith(("Binary files", "GIT binary patch")):
            cur.binary = True
    return files


def _heredoc(header: str, lines: list[str]) -> str:
    delimiter = "EOF"
    stripped = {line.strip() for line in lines}
    n = 0
    while delimiter in stripped:
        n += 1
        delimiter = f"EOF{n}"
    return "\n".join([f"{header} << '{delimiter}'", *lines, delimiter])


def _edit_for_hunk(path: str, hunk: _Hunk, *, write_back: bool = False) -> str | None:
    body = hunk.body
    lead = next((i for i, (tag, _) in enumerate(body) if tag != " "), len(body))
    if lead == len(body):
        return None  # context only
    trail = next(i for i, (tag, _) in enumerate(reversed(body)) if tag != " ")
    core = body[lead : len(body) - trail]
    old_count = sum(tag != "+" for tag, _ in core)
    if write_back:  # the hunks above are no-ops too: old-file coordinates
        new_lines = [text for tag, text in core if tag != "+"]
        first = hunk.old_start if hunk.old_count > 0 else hunk.old_start + 1
    else:
        new_lines = [text for tag, text in core if tag != "-"]
        first = hunk.new_start if hunk.new_count > 0 else hunk.new_start + 1
    start = first + lead
    return _heredoc(f"edit --file {shlex.quote(path)} {start}:{start + old_count - 1}", new_lines)


def gold_patch_to_commands(patch: str, *, write_back: bool = False) -> list[str]:
    """Scaffold commands (block texts, without fences) that turn the base checkout into the patched one.

    `write_back`: every edit writes back the lines it would replace (the same edits, a no-op: a
    near miss of the fix, for the demo's decoy demonstrations); a patch that creates, deletes or
    moves a file has no such commands (DemoError).
    """
    commands: list[str] = []
    files = _parse_unified_diff(patch)
    if not files:
        raise DemoError("the patch holds no file diffs")
    for f in files:
        path = f.rename_to or f.new or f.old
        if f.binary:
            raise DemoError(f"{path}: binary diffs cannot be written with scaffold commands")
        if path is None:
            raise DemoError("a file diff without a path")
        structural = f.deleted or f.new_file or f.new is None or f.old is None
        if write_back and (structural or f.rename_from != f.rename_to):
            raise DemoError(f"{path}: a file created, deleted or moved has no write-back edit")
        if f.deleted or f.new is None and f.old is not None and not f.rename_to:
            commands.append(f"rm {shlex.quote(f.old or path)}")
            continue
        if f.new_file or (f.old is None and f.new is not None):
            content = [text for hunk in f.hunks for tag, text in hunk.body if tag == "+"]
            commands.append(_heredoc(f"create {shlex.quote(path)}", content))
            continue
        if f.rename_from and f.rename_to and f.rename_from != f.rename_to:
            parent = f.rename_to.rsplit("/", 1)[0] if "/" in f.rename_to else "."
            move = f"mv {shlex.quote(f.rename_from)} {shlex.quote(f.rename_to)}"
            commands.append(f"mkdir -p {shlex.quote(parent)} && {move}")
        edits = (_edit_for_hunk(path, hunk, write_back=write_back) for hunk in f.hunks)
        commands.extend(cmd for cmd in edits if cmd is not None)
    return commands


def command_reply(command: str, reasoning: str = "") -> str:
    """An assistant reply holding `command` in one fenced block (fence longer than any inside)."""
    longest = max((len(m) for m in re.findall(r"`{3,}", command)), default=2)
    fence = "`" * max(3, longest + 1)
    head = f"{reasoning.strip()}\n" if reasoning.strip() else ""
    return f"{head}{fence}\n{command}\n{fence}"
