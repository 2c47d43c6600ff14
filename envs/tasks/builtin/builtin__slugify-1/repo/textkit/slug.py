"""URL slugs from free text."""

import re
import unicodedata

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(text: str, max_length: int = 50) -> str:
    """Lower-case ASCII slug of `text`: words joined by '-', at most `max_length` chars."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = _NON_ALNUM.sub("-", ascii_text.lower())
    return slug[:max_length]
