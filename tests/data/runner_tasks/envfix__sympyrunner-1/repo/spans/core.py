"""Merging closed integer intervals."""


def merge(spans):
    """The union of closed intervals (a, b) as sorted, disjoint intervals."""
    out = []
    for a, b in sorted(spans):
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
