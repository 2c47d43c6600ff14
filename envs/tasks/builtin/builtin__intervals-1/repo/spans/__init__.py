from spans.merge import merge, total_length

__all__ = ["merge", "total_length"]
