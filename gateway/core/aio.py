"""asyncio helpers: :func:`keep_cancellation` raises again a cancellation a library call swallowed.

On Python 3.11 ``asyncio.wait_for`` loses a cancellation that arrives in the same loop turn as the
awaited work completes (CPython gh-86296), and redis-py sends every command through it. Our code
uses ``asyncio.timeout`` (ruff bans ``wait_for``); calls into redis-py go through this helper, which
compares :meth:`asyncio.Task.cancelling` before and after the await (``docs/inference.md``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def keep_cancellation(awaitable: Awaitable[T]) -> T:
    """``await awaitable``; raise ``CancelledError`` if the current task was cancelled meanwhile
    and the cancellation was swallowed inside it (module docstring)."""
    task = asyncio.current_task()
    if task is None:
        return await awaitable
    before = task.cancelling()
    result = await awaitable
    if task.cancelling() > before:
        raise asyncio.CancelledError
    return result
