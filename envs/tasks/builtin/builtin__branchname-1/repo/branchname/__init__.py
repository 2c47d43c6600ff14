from branchname.title import strip_prefix, title

__all__ = ["strip_prefix", "title"]
