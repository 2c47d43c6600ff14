from retrier.core import retry, retry_async

__all__ = ["retry", "retry_async"]
