"""Durations written like 1h30m, 45s or 2h."""

import re

_PART = re.compile(r"(\d+)([hms])")
_FACTOR = {"h": 3600, "m": 60, "s": 1}


def to_seconds(text):
    """Seconds in a duration such as '1h30m', '90s' or '2h'; ValueError for anything else."""
    parts = _PART.findall(text)
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * _FACTOR[unit] for n, unit in parts)
