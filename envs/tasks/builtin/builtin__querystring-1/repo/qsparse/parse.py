"""Parsing URL query strings."""

from urllib.parse import unquote_plus


def parse_qs(query: str) -> dict:
    """'a=1&b=2&a=3' -> {'a': ['1', '3'], 'b': ['2']}, decoding %XX escapes and '+'."""
    result = {}
    for pair in query.lstrip("?").split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        result.setdefault(unquote_plus(key), []).append(value)
    return result


def get_first(query: str, key: str, default=None):
    values = parse_qs(query).get(key)
    return values[0] if values else default
