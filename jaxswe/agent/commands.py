"""Parse one assistant reply into exactly one scaffold command, or a format error.

A reply is free-form reasoning plus exactly ONE fenced block (three or more backticks, an
optional language tag; a block opened with N backticks closes at a line of >= N backticks, so
four backticks can wrap text that itself holds ```). The block's first word picks the command:

    open [FILE] [LINE]      goto LINE      scroll_up      scroll_down
    create FILE             (optional content: inline lines or a << 'EOF' heredoc)
    edit [--file PATH] START:END            (replacement: inline lines or a heredoc; exact text)
    replace [--file PATH] [--replace-all]   (one or more SEARCH/REPLACE blocks, see below)
    search_file TERM [FILE]
    submit
    anything else: a shell command (the whole block, run by bash)

`edit S:E` replaces lines S..E (1-based, inclusive); `edit S:S-1` inserts before line S; an
empty replacement deletes. A replace block is

    <<<<<<< SEARCH
    old lines
    =======
    new lines
    >>>>>>> REPLACE

Parsing never raises: the result is a `Command`, a `UsageError` (a known command with bad
arguments; the episode goes on and the model sees the usage) or a `FormatError` (no block, more
than one, unclosed or empty; the turn is flagged and RFT masks it).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

FILE_COMMANDS = ("open", "goto", "scroll_up", "scroll_down", "create", "edit", "replace", "search_file")
SPECIAL_COMMANDS = (*FILE_COMMANDS, "submit")

USAGE = {
    "open": "open [FILE] [LINE]",
    "goto": "goto LINE",
    "scroll_up": "scroll_up",
    "scroll_down": "scroll_down",
    "create": "create FILE  (content on the following lines or as a << 'EOF' heredoc)",
    "edit": "edit [--file PATH] START:END  (replacement on the following lines or as a << 'EOF' heredoc)",
    "replace": "replace [--file PATH] [--replace-all]  (then <<<<<<< SEARCH / ======= / >>>>>>> REPLACE)",
    "search_file": "search_file TERM [FILE]",
    "submit": "submit",
}

FormatErrorKind = Literal["no_command", "multiple_commands", "unclosed_block", "empty_command"]

_OPEN_FENCE = re.compile(r"^[ \t]*(`{3,})[ \t]*([A-Za-z0-9_+.#-]*)[ \t\r]*$")
_HEREDOC = re.compile(r"<<-?[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1[ \t]*$")
_RANGE = re.compile(r"^(\d+):(\d+)$")
_SEARCH, _DIVIDER, _REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"


@dataclass(frozen=True)
class FormatError:
    """The reply does not hold exactly one usable fenced block."""

    kind: FormatErrorKind
    num_blocks: int = 0


@dataclass(frozen=True)
class UsageError:
    """A known command used with bad arguments; `message` says what is wrong."""

    name: str
    message: str


@dataclass(frozen=True)
class Command:
    """One parsed command. `lines` holds the content of create/edit (None when not given)."""

    name: str  # "shell" or one of SPECIAL_COMMANDS
    raw: str  # the block's text as written
    path: str | None = None  # FILE / --file argument
    line: int | None = None  # open/goto line
    start: int | None = None  # edit range, 1-based inclusive
    end: int | None = None
    lines: tuple[str, ...] | None = None  # create/edit content, one entry per line
    pairs: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()  # replace: (search, replace)
    replace_all: bool = False
    term: str | None = None  # search_file


ParsedAction = Command | UsageError | FormatError


def extract_blocks(text: str) -> tuple[list[str], bool]:
    """Return the bodies of all fenced blocks in `text` (CRLF read as LF) and whether the last is unclosed."""
    blocks: list[str] = []
    body: list[str] | None = None
    fence_len = 0
    for line in text.replace("\r\n", "\n").split("\n"):
        if body is None:
            m = _OPEN_FENCE.match(line)
            if m:
                body, fence_len = [], len(m.group(1))
        elif re.fullmatch(rf"[ \t]*`{{{fence_len},}}[ \t\r]*", line):
            blocks.append("\n".join(body))
            body = None
        else:
            body.append(line)
    if body is not None:
        blocks.append("\n".join(body))
    return blocks, body is not None


def parse_action(text: str) -> ParsedAction:
    """Parse a whole assistant reply (reasoning + one fenced block)."""
    blocks, unclosed = extract_blocks(text)
    if not blocks:
        return FormatError("no_command")
    if len(blocks) > 1:
        return FormatError("multiple_commands", num_blocks=len(blocks))
    if unclosed:
        return FormatError("unclosed_block", num_blocks=1)
    if not blocks[0].strip():
        return FormatError("empty_command", num_blocks=1)
    return parse_command(blocks[0])


def parse_command(block: str) -> Command | UsageError:
    """Parse the text of one block into a command."""
    lines = block.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return UsageError("", "empty command")
    first, rest = lines[0].strip(), lines[1:]
    name = first.split(maxsplit=1)[0]
    if name not in SPECIAL_COMMANDS:
        return Command("shell", raw=block)
    try:
        return _PARSERS[name](block, first, rest)
    except _Usage as err:
        return UsageError(name, f"{err} (usage: {USAGE[name]})")


class _Usage(Exception):
    pass


def _split_args(first: str) -> tuple[list[str], str | None]:
    """shlex-split the command line; a trailing heredoc opener is cut off and its delimiter returned."""
    delimiter = None
    m = _HEREDOC.search(first)
    if m:
        delimiter = m.group(2)
        first = first[: m.start()]
    try:
        words = shlex.split(first)
    except ValueError as err:
        raise _Usage(f"cannot split arguments: {err}") from None
    return words[1:], delimiter


def _content(rest: list[str], delimiter: str | None) -> tuple[str, ...]:
    """The content lines after the command line: inline, or between heredoc markers (exact)."""
    if delimiter is None:
        while rest and not rest[-1].strip():  # the block's trailing blank lines are layout
            rest = rest[:-1]
        return tuple(rest)
    for i, line in enumerate(rest):
        if line.strip() == delimiter:
            if any(extra.strip() for extra in rest[i + 1 :]):
                raise _Usage(f"text after the heredoc end marker {delimiter!r}")
            return tuple(rest[:i])
    raise _Usage(f"heredoc end marker {delimiter!r} not found")


def _int(word: str, what: str) -> int:
    if not re.fullmatch(r"\d+", word) or int(word) < 1:
        raise _Usage(f"{what} must be a positive integer, got {word!r}")
    return int(word)


def _no_body(name: str, rest: list[str]) -> None:
    if any(line.strip() for line in rest):
        raise _Usage(f"{name} takes a single line")


def _take_flag(args: list[str], flag: str, *, value: bool) -> tuple[list[str], str | bool | None]:
    out, found = [], None
    i = 0
    while i < len(args):
        if args[i] == flag:
            if not value:
                found = True
            elif i + 1 < len(args):
                found = args[i + 1]
                i += 1
            else:
                raise _Usage(f"{flag} needs a value")
        else:
            out.append(args[i])
        i += 1
    return out, found


def _parse_open(block: str, first: str, rest: list[str]) -> Command:
    args, _ = _split_args(first)
    _no_body("open", rest)
    if len(args) > 2:
        raise _Usage("too many arguments")
    path = args[0] if args else None
    line = _int(args[1], "LINE") if len(args) == 2 else None
    return Command("open", raw=block, path=path, line=line)


def _parse_goto(block: str, first: str, rest: list[str]) -> Command:
    args, _ = _split_args(first)
    _no_body("goto", rest)
    if len(args) != 1:
        raise _Usage("expected exactly one LINE")
    return Command("goto", raw=block, line=_int(args[0], "LINE"))


def _parse_scroll(block: str, first: str, rest: list[str]) -> Command:
    args, _ = _split_args(first)
    name = first.split()[0]
    _no_body(name, rest)
    if args:
        raise _Usage(f"{name} takes no arguments")
    return Command(name, raw=block)


def _parse_create(block: str, first: str, rest: list[str]) -> Command:
    args, delimiter = _split_args(first)
    if len(args) != 1:
        raise _Usage("expected exactly one FILE")
    return Command("create", raw=block, path=args[0], lines=_content(rest, delimiter))


def _parse_edit(block: str, first: str, rest: list[str]) -> Command:
    args, delimiter = _split_args(first)
    args, path = _take_flag(args, "--file", value=True)
    if len(args) != 1 or not _RANGE.match(args[0]):
        raise _Usage("expected one START:END range")
    start, end = (int(x) for x in _RANGE.match(args[0]).groups())
    if start < 1 or end < start - 1:
        raise _Usage(f"bad range {start}:{end}: need 1 <= START and START-1 <= END")
    return Command("edit", raw=block, path=path, start=start, end=end, lines=_content(rest, delimiter))


def _parse_replace(block: str, first: str, rest: list[str]) -> Command:
    args, _ = _split_args(first)
    args, path = _take_flag(args, "--file", value=True)
    args, replace_all = _take_flag(args, "--replace-all", value=False)
    if args:
        raise _Usage(f"unexpected arguments {args}")
    pairs, state, search, new = [], "out", [], []
    for line in rest:
        tag = line.strip()
        if state == "out":
            if tag == _SEARCH:
                state, search, new = "search", [], []
            elif tag:
                raise _Usage(f"expected {_SEARCH!r}, got {line!r}")
        elif state == "search" and tag == _DIVIDER:
            state = "replace"
        elif state == "search":
            search.append(line)
        elif tag == _REPLACE:
            if not search:
                raise _Usage("empty SEARCH text")
            pairs.append((tuple(search), tuple(new)))
            state = "out"
        else:
            new.append(line)
    if state != "out":
        raise _Usage(f"unterminated SEARCH/REPLACE block (missing {_REPLACE!r})")
    if not pairs:
        raise _Usage("no SEARCH/REPLACE block")
    return Command("replace", raw=block, path=path, pairs=tuple(pairs), replace_all=bool(replace_all))


def _parse_search_file(block: str, first: str, rest: list[str]) -> Command:
    args, _ = _split_args(first)
    _no_body("search_file", rest)
    if len(args) not in (1, 2) or not args[0]:
        raise _Usage("expected TERM and an optional FILE")
    return Command("search_file", raw=block, term=args[0], path=args[1] if len(args) == 2 else None)


def _parse_submit(block: str, first: str, rest: list[str]) -> Command:
    args, _ = _split_args(first)
    _no_body("submit", rest)
    if args:
        raise _Usage("submit takes no arguments")
    return Command("submit", raw=block)


_PARSERS = {
    "open": _parse_open,
    "goto": _parse_goto,
    "scroll_up": _parse_scroll,
    "scroll_down": _parse_scroll,
    "create": _parse_create,
    "edit": _parse_edit,
    "replace": _parse_replace,
    "search_file": _parse_search_file,
    "submit": _parse_submit,
}
