from pager.links import page_links
from pager.pages import page_count, page_slice

__all__ = ["page_count", "page_links", "page_slice"]
