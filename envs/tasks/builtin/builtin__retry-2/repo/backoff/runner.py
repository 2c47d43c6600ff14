"""Calling a function again when it fails."""

import time

from backoff.policy import delays


def retry(fn, attempts: int = 3, exceptions=(Exception,), sleep=time.sleep, **delay_options):
    """Call `fn()` up to `attempts` times; when every attempt fails, re-raise the last error."""
    waits = delays(attempts, **delay_options)
    for attempt in range(attempts):
        try:
            return fn()
        except exceptions:
            if attempt < attempts - 1:
                sleep(waits[attempt])
