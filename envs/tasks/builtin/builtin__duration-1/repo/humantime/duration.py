"""Durations written like '1h 2m 5s'."""

import re

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_PART = re.compile(r"(\d+)\s*([dhms])")


def format_duration(seconds: int) -> str:
    """3725 -> '1h 2m 5s'; 0 -> '0s'."""
    if seconds == 0:
        return "0s"
    parts = []
    for suffix, size in _UNITS:
        if seconds > size:
            count, seconds = divmod(seconds, size)
            parts.append(f"{count}{suffix}")
    return " ".join(parts)


def parse_duration(text: str) -> int:
    sizes = dict(_UNITS)
    return sum(int(number) * sizes[unit] for number, unit in _PART.findall(text))
