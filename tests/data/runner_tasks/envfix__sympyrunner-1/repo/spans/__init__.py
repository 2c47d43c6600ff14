"""Closed integer intervals."""

from spans.core import merge

__all__ = ["merge"]
