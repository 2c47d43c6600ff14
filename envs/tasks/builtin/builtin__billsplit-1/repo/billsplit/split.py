"""Splitting an amount of money (in cents) into shares."""


def split_evenly(total_cents: int, people: int) -> list:
    """Shares that add up to `total_cents`, differing by at most one cent, larger first."""
    if people < 1:
        raise ValueError("people must be >= 1")
    share = total_cents // people
    return [share] * people
