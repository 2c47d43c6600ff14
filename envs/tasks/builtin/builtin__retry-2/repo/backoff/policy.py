"""Exponential backoff delays."""


def delays(attempts: int, base: float = 0.5, factor: float = 2.0, cap: float = 30.0) -> list:
    """Seconds to sleep before each retry: base, base*factor, ... never above `cap`."""
    return [min(base * factor**i, cap) for i in range(attempts - 1)]
