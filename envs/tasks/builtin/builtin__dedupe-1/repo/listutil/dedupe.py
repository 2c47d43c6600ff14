"""Removing repeated items."""


def dedupe(items, key=None) -> list:
    """Items without repeats, keeping each first occurrence in the original order."""
    if key is None:
        return list(set(items))
    seen = set()
    result = []
    for item in items:
        marker = key(item)
        if marker not in seen:
            seen.add(marker)
            result.append(item)
    return result
