"""Parsing strings such as '12 cm' or '3m'."""

import re

from lengths.units import UnitError, to_meters

_QUANTITY = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")


def parse_length(text: str) -> float:
    """The length in meters."""
    match = _QUANTITY.match(text.lower())
    if not match:
        raise UnitError(f"not a length: {text!r}")
    number, unit = match.groups()
    return to_meters(int(number), unit)
