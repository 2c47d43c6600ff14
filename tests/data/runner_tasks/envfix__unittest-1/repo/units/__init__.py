"""Durations written like 1h30m."""

from units.convert import to_seconds

__all__ = ["to_seconds"]
