"""Merging closed intervals [start, end]."""


def merge(intervals):
    """Merge overlapping intervals; returns a new sorted list of [start, end] lists."""
    result = []
    for start, end in sorted(intervals):
        if result and start < result[-1][1]:
            result[-1][1] = max(result[-1][1], end)
        else:
            result.append([start, end])
    return result


def total_length(intervals):
    """Length covered by the union of the intervals."""
    return sum(end - start for start, end in merge(intervals))
