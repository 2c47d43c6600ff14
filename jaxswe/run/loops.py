"""The event loops jaxswe runs its episodes in, marked so that Ctrl-C (jaxswe.cli) can tell them
from a library's own loop (orbax runs one to write a checkpoint). In one of these, Ctrl-C cancels
the loop's tasks (each episode closes its environment on the way out) and the loop's runner then
raises KeyboardInterrupt; anywhere else it is raised where the main thread is."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_OURS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_INTERRUPTED: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def mark(loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """Mark `loop` as one of jaxswe's episode loops."""
    _OURS.add(loop)
    return loop


def is_ours(loop: asyncio.AbstractEventLoop) -> bool:
    return loop in _OURS


def interrupt(loop: asyncio.AbstractEventLoop) -> None:
    """Ctrl-C in `loop` (run by the loop itself): cancel every task; `run_in` then raises
    KeyboardInterrupt."""
    _INTERRUPTED.add(loop)
    for task in asyncio.all_tasks(loop):
        task.cancel()


def run_in(runner: asyncio.Runner, coro: Coroutine[Any, Any, T]) -> T:
    """`runner.run(coro)` in a marked loop, KeyboardInterrupt once the loop was interrupted."""
    loop = mark(runner.get_loop())
    try:
        result = runner.run(coro)
    except asyncio.CancelledError:
        if loop not in _INTERRUPTED:
            raise
        raise KeyboardInterrupt from None
    if loop in _INTERRUPTED:  # a task that swallowed its cancellation still ends the stage
        raise KeyboardInterrupt
    return result


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` in a marked loop (see `run_in`)."""
    with asyncio.Runner() as runner:
        return run_in(runner, coro)
