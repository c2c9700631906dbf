"""Running an :class:`~responses_app.executor.Executor` to its end, whatever the client does.

Every transport (HTTP JSON and SSE, WebSocket, background) drives a response through :func:`drive`:
the server's shutdown (``gateway.lifecycle``) may interrupt it once ``[server] shutdown_grace_s`` has
passed, and then it still ends with a ``response.failed`` terminal event and a stored ``failed``
row. :func:`detached` runs it in a task of its own for a streaming client: a client that disconnects
from a stored response does not stop it; it is finished and stored, as OpenAI does, so the id it
announced in ``response.created`` stays retrievable. An unstored one is cancelled (nobody could
ever read it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.lifecycle import interruptible
from responses_app.events import Event
from responses_app.executor import Executor

log = logging.getLogger("responses.runs")

SHUTDOWN_MESSAGE = (
    "The server shut down before this response finished (shutdown grace period exceeded); "
    "the response was not completed."
)

# Responses finishing after their client left: kept here so they are not garbage-collected.
_detached: set[asyncio.Task[None]] = set()


async def drive(executor: Executor, on_event: Callable[[Event], Awaitable[None]]) -> None:
    """Every event of ``executor``'s run to ``on_event``, in order, ending with exactly one
    terminal or error event, also when the shutdown deadline interrupts it."""
    events = executor.run()
    async with interruptible() as run:
        async for event in events:
            await on_event(event)
    if run.interrupted:
        await events.aclose()  # type: ignore[attr-defined]
        async for event in executor.interrupt(SHUTDOWN_MESSAGE):
            await on_event(event)


def keep_running(task: asyncio.Task[None]) -> None:
    """Hold a strong reference to ``task`` until it ends (asyncio keeps only weak ones)."""
    _detached.add(task)
    task.add_done_callback(_detached.discard)


async def detached(executor: Executor) -> AsyncIterator[Event]:
    """``executor``'s events, produced by a task of their own (see the module docstring)."""
    queue: asyncio.Queue[Event | None] = asyncio.Queue()

    async def produce() -> None:
        try:
            await drive(executor, queue.put)
        finally:
            queue.put_nowait(None)

    task = asyncio.get_running_loop().create_task(produce())
    keep_running(task)
    try:
        while (event := await queue.get()) is not None:
            yield event
        await task  # its exception, if it ended with one
    finally:
        if not task.done() and not executor.p.store:
            task.cancel()
