"""Navigation links for a 1-based page."""

from pager.pages import page_count


def page_links(page: int, total: int, per_page: int) -> dict:
    """{'prev': n or None, 'next': n or None, 'last': n}."""
    count = page_count(total, per_page)
    return {
        "prev": page - 1 if page > 1 else None,
        "next": page + 1 if page + 1 < count else None,
        "last": max(count, 1),
    }
