from pathutil.normalize import normalize

__all__ = ["normalize"]
