"""Word statistics over plain text."""

import re
from collections import Counter

_WORD = re.compile(r"[A-Za-z']+")


def word_counts(text):
    """How often each word occurs, case-insensitively."""
    return Counter(w for w in _WORD.findall(text))


def top_words(text, n=3):
    """The n most common words, most common first; ties in alphabetical order."""
    counts = word_counts(text)
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]
