"""Counting and slicing 1-based pages."""


def page_count(total: int, per_page: int) -> int:
    """Number of pages needed to show `total` items."""
    if per_page < 1:
        raise ValueError("per_page must be >= 1")
    return total // per_page


def page_slice(items: list, page: int, per_page: int) -> list:
    start = (page - 1) * per_page
    return items[start:start + per_page]
