"""Selecting lines such as '2024-05-01 12:00:00 ERROR disk full'."""

import re

from logsift.levels import level_value

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \S+) ([A-Z]+) (.*)$")


def parse_line(line: str):
    """(timestamp, level, message), or None for lines that do not match."""
    match = _LINE.match(line.rstrip("\n"))
    return match.groups() if match else None


def filter_lines(lines, min_level: str) -> list:
    """The lines whose level is `min_level` or more severe."""
    threshold = level_value(min_level)
    kept = []
    for line in lines:
        parsed = parse_line(line)
        if parsed and level_value(parsed[1]) > threshold:
            kept.append(line)
    return kept
