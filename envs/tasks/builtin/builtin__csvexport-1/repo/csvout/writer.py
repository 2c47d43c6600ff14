"""Whole CSV documents."""

from csvout.fields import quote_field


def format_row(values) -> str:
    return ",".join(quote_field(value) for value in values)


def to_csv(header: list, rows: list) -> str:
    lines = [",".join(header)]
    lines.extend(format_row(row) for row in rows)
    return "\r\n".join(lines) + "\r\n"
