"""Call a function again when it raises, a fixed number of times."""

import asyncio
import time


def retry(fn, attempts=3, delay=0.0, sleep=time.sleep):
    """fn() until it returns, at most `attempts` calls; the last error is raised."""
    for i in range(attempts):
        try:
            return fn()
        except Exception:
            if i == attempts - 1:
                raise
            sleep(delay)


async def retry_async(fn, attempts=3, delay=0.0):
    """await fn() until it returns, at most `attempts` calls; the last error is raised."""
    for i in range(attempts - 1):
        try:
            return await fn()
        except Exception:
            await asyncio.sleep(delay)
    return None
