"""Quoting single CSV fields (RFC 4180)."""


def quote_field(value) -> str:
    """Quote a field that contains a separator, a double quote or a line break."""
    text = "" if value is None else str(value)
    if any(char in text for char in ",\n"):
        return '"' + text.replace('"', '""') + '"'
    return text
