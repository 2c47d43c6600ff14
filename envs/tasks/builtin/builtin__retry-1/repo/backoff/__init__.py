from backoff.policy import delays
from backoff.runner import retry

__all__ = ["delays", "retry"]
