"""asyncio helpers for the upstreams and workers (Redis clients above all).

:func:`keep_cancellation` — a cancellation that an awaited library call swallowed, raised again.

On Python 3.11, :func:`asyncio.wait_for` loses a cancellation of the task awaiting it when the
awaited work completes in the same turn of the event loop as the cancellation arrives: it returns
the work's result, and the ``CancelledError`` is gone (CPython gh-86296; 3.12 rebuilt ``wait_for``
on :func:`asyncio.timeout` and fixed it). redis-py's asyncio client sends every command through
``wait_for`` whenever a socket timeout is set, which is its default (5 s), so a task cancelled while
it sends a Redis command can run on as if nothing had happened. Measured with redis-py 8.1 on
Python 3.11.7 (a task reading a busy stream with ``XREAD``, as the worker stream reader does,
cancelled at a random moment): 253 of 300 cancellations lost. A lost cancellation is a client
disconnect that never stops the engine, a deadline (``asyncio.timeout``: a tool call's, the drain's
interrupt in :mod:`gateway.core.lifecycle`) that never fires, a worker loop that never stops.

Our own code never calls ``asyncio.wait_for`` (ruff's banned-API rule, ``pyproject.toml``): it uses
``async with asyncio.timeout(...)``, which keeps the count right. Calls into redis-py, which does,
go through :func:`keep_cancellation`.

The task still counts the request: :meth:`asyncio.Task.cancelling` (public since 3.11) goes up with
each ``cancel()`` and down only with ``uncancel()``. So a count above the one before the await, with
the await returning normally, is a cancellation that was swallowed, and it is raised here. A
cancellation delivered normally never returns from the await; one that an ``asyncio.timeout``
inside the call took back (``uncancel``) leaves the count where it was.
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
