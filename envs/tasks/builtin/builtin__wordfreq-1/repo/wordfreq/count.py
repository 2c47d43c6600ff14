"""Counting words in text."""

import re
from collections import Counter

_WORD = re.compile(r"[a-z']+")


def words(text: str) -> list:
    return _WORD.findall(text.lower())


def top_words(text: str, n: int = 3) -> list:
    """The `n` most frequent (word, count) pairs: highest count first, ties alphabetical."""
    counts = Counter(words(text))
    return sorted(counts.items(), key=lambda item: item[1], reverse=True)[:n]
