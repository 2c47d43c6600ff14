"""Unified diffs: which files a patch touches, and keeping an agent's patch off the test files.

What counts as a test path (changes there are dropped from the agent's patch before grading):
the files test_patch touches, anything under a `tests/`, `test/` or `testing/` directory,
`test_*.py`, `*_test.py`, `conftest.py` and `pytest.ini` anywhere. New files count the same way.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import PurePosixPath

_HEADER_RE = re.compile(r"^diff --git (?:\"?a/(.+?)\"?) (?:\"?b/(.+?)\"?)$")
_TEST_DIRS = {"tests", "test", "testing"}
_TEST_NAMES = ("test_*.py", "*_test.py", "conftest.py", "pytest.ini")


def _sections(diff: str) -> list[tuple[list[str], str]]:
    """Split a git diff into (paths, text) per file; text before the first header is dropped."""
    sections: list[tuple[list[str], str]] = []
    lines = diff.splitlines(keepends=True)
    start, paths = None, []
    for i, line in enumerate(lines):
        m = _HEADER_RE.match(line.rstrip("\n"))
        if m:
            if start is not None:
                sections.append((paths, "".join(lines[start:i])))
            start, paths = i, [m.group(1), m.group(2)]
    if start is not None:
        sections.append((paths, "".join(lines[start:])))
    return sections


def _plain_sections(diff: str) -> list[tuple[list[str], str]]:
    """Split a plain `---/+++` unified diff (no git headers) per file."""
    sections: list[tuple[list[str], str]] = []
    lines = diff.splitlines(keepends=True)
    starts = [
        i for i in range(len(lines) - 1) if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")
    ]
    for n, i in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        paths = [_strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])]
        sections.append(([p for p in paths if p != "/dev/null"], "".join(lines[i:end])))
    return sections


def _strip_prefix(name: str) -> str:
    name = name.rstrip("\n").split("\t")[0].strip()
    return name if name == "/dev/null" else name.split("/", 1)[-1]


def file_sections(diff: str) -> list[tuple[list[str], str]]:
    return _sections(diff) if "diff --git " in diff else _plain_sections(diff)


def patch_files(diff: str) -> list[str]:
    """Paths a diff touches (old and new names), in order, without duplicates."""
    seen: dict[str, None] = {}
    for paths, _ in file_sections(diff):
        for p in paths:
            seen.setdefault(p, None)
    return list(seen)


def is_test_path(path: str, test_files: Iterable[str] = ()) -> bool:
    """Whether an agent's change to `path` is dropped before grading (see the module docstring)."""
    pure = PurePosixPath(path)
    if path in set(test_files):
        return True
    if any(part in _TEST_DIRS for part in pure.parts[:-1]):
        return True
    return any(fnmatch.fnmatch(pure.name, pat) for pat in _TEST_NAMES)


def split_patch(diff: str, test_files: Iterable[str] = ()) -> tuple[str, list[str]]:
    """(the patch without sections touching test paths, the dropped paths)."""
    test_files = set(test_files)
    kept, dropped = [], []
    for paths, text in file_sections(diff):
        if any(is_test_path(p, test_files) for p in paths):
            dropped.extend(p for p in paths if p not in dropped)
        else:
            kept.append(text if text.endswith("\n") else text + "\n")
    return "".join(kept), dropped


def changed_lines(diff: str) -> int:
    """Added plus removed lines of a diff (the paper's `< 500 lines` filter)."""
    return sum(
        1
        for line in diff.splitlines()
        if (line.startswith("+") and not line.startswith("+++ "))
        or (line.startswith("-") and not line.startswith("--- "))
    )
