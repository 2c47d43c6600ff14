"""The event loops jaxswe runs its episodes in, marked so that Ctrl-C (jaxswe.cli) can tell them
from a library's own loop (orbax runs one to write a checkpoint): in one of these the interrupt is
raised between the loop's callbacks, so every episode is cancelled and closed; anywhere else it is
raised where the main thread is."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
_OURS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def mark(loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """Mark `loop` as one of jaxswe's episode loops (e.g. an `asyncio.Runner`'s)."""
    _OURS.add(loop)
    return loop


def run(coro: Awaitable[T]) -> T:
    """`asyncio.run(coro)` in a loop marked as jaxswe's own."""

    async def marked() -> T:
        mark(asyncio.get_running_loop())
        return await coro

    return asyncio.run(marked())


def is_ours(loop: asyncio.AbstractEventLoop) -> bool:
    return loop in _OURS
