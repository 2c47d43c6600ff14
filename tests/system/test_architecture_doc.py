"""docs/architecture.md's `file:line` references point at what they name."""

import re

from helpers import ROOT

# `path:N` (`name`), `Class.method` (`path:N`) or (`name`, `path:N`): the line must hold the name's last part
NAMED = re.compile(
    r"`(jaxswe/[\w/]+\.py):(\d+)`\s+\(`([\w.]+)`"
    r"|`([\w.]+)`(?:\s+\(|,\s+)`(jaxswe/[\w/]+\.py):(\d+)`"
)


def test_each_named_reference_is_on_its_line():
    text = (ROOT / "docs" / "architecture.md").read_text()
    refs = [(m[1], m[2], m[3]) if m[1] else (m[5], m[6], m[4]) for m in NAMED.finditer(text)]
    assert len(refs) >= 10
    wrong = []
    for path, line, name in refs:
        lines = (ROOT / path).read_text().splitlines()
        if name.split(".")[-1] not in lines[int(line) - 1]:
            wrong.append(f"{path}:{line} does not hold {name}")
    assert not wrong, "\n".join(wrong)


def test_every_reference_is_inside_its_file():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for path, line in re.findall(r"`(jaxswe/[\w/]+\.py):(\d+)`", text):
        assert int(line) <= len((ROOT / path).read_text().splitlines()), f"{path}:{line}"
