"""Parsing dates written as 2024-03-05, 05.03.2024 or 2024/03/05."""

import datetime as dt

_FORMATS = ("%Y-%m-%d", "%m.%d.%Y", "%Y/%m/%d")


def parse_date(text: str) -> dt.date:
    for fmt in _FORMATS:
        try:
            return dt.datetime.strptime(text.strip(), fmt).date()
        except ValueError:
            continue
    raise ValueError(f"unrecognized date: {text!r}")
