"""Running an :class:`~responses_app.executor.Executor` to its end, whatever the client does.

Every transport (HTTP JSON and SSE, WebSocket, background) drives a response through :func:`drive`:
the server's shutdown (``gateway.lifecycle``) may interrupt it once ``[server] shutdown_grace_s`` has
passed, and then it still ends with a ``response.failed`` terminal event and a stored ``failed``
row. :func:`detached` runs it in a task of its own for a streaming client: a client that disconnects
from a stored response does not stop it; it is finished and stored, as OpenAI does, so the id it
announced in ``response.created`` stays retrievable. An unstored one is cancelled (nobody could
ever read it).

A stored response whose id is announced before it ends (an SSE stream, every WebSocket response)
holds a lease like background work (:class:`_StreamLease`): its row is written ``in_progress``
under this process's lease just before ``response.created`` and renewed while it runs, so if the
process dies the sweep stores it ``failed`` instead of the id answering 404. A stored JSON response
announces nothing before it ends and writes only its final row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.db import run_orm
from gateway.lifecycle import Interruptible, drain, interruptible, keep_running
from responses_app import leases, services
from responses_app.events import Event
from responses_app.executor import Executor

log = logging.getLogger("responses.runs")

SHUTDOWN_MESSAGE = (
    "The server shut down before this response finished (shutdown grace period exceeded); "
    "the response was not completed."
)

LEASE_LOST_MESSAGE = (
    "This response's lease could not be renewed and it was stored failed meanwhile "
    "(docs/operations.md); the response was not completed."
)
UNSTORED_MESSAGE = "The response stopped before it could be stored; the response was not completed."


async def drive(executor: Executor, on_event: Callable[[Event], Awaitable[None]]) -> None:
    """Every event of ``executor``'s run to ``on_event``, in order, ending with exactly one
    terminal or error event, also when the shutdown deadline interrupts it."""
    with drain.held():  # the shutdown waits for an interrupted run's failure to be stored
        await _drive(executor, on_event)


async def _drive(executor: Executor, on_event: Callable[[Event], Awaitable[None]]) -> None:
    events = executor.run()
    p = executor.p
    lease = _StreamLease(executor) if p.store and p.request.stream and not p.background else None
    try:
        async with interruptible() as run:
            if lease is not None:
                lease.run = run
            async for event in events:
                await on_event(event)
        if run.interrupted:
            await events.aclose()  # type: ignore[attr-defined]
            message = LEASE_LOST_MESSAGE if lease is not None and lease.lost else SHUTDOWN_MESSAGE
            async for event in executor.interrupt(message):
                await on_event(event)
    finally:
        if lease is not None:
            await lease.release()


class _StreamLease:
    """The lease of a stored stream (module docstring): taken by the executor just before
    ``response.created``, renewed by :func:`leases.start_heartbeat` until the final store begins. A
    lost lease (the sweep failed the row) interrupts the run: it ends ``failed``. A run that ends
    without storing (a commit-time refusal, a cancelled task, the database down) fails its row."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.run: Interruptible | None = None
        self.heartbeat: leases.Heartbeat | None = None
        self.lost = False
        executor.before_start = self.take
        executor.before_store = self.stop

    async def take(self) -> None:
        executor = self.executor
        config = executor.config
        await services.store_in_progress(
            executor.p, executor.snapshot("in_progress"), leases.runner_id(), config.responses.lease_s
        )
        self.heartbeat = leases.start_heartbeat(executor.p.response_id, config, self._lose)

    def _lose(self) -> None:
        log.warning("response %s: lease lost, ending it failed", self.executor.p.response_id)
        self.lost = True
        if self.run is not None:
            self.run.interrupt()

    async def stop(self) -> None:
        """The final store begins: it ends the lease (a renewal racing it must not interrupt it)."""
        if self.heartbeat is not None:
            self.heartbeat.cancel()

    async def release(self) -> None:
        executor = self.executor
        # The lease is over: unhook it from the executor. The hooks (bound methods of this lease,
        # which holds the executor) are a reference cycle; left in place, each stored stream's whole
        # run (executor, emitter, tool loop, task: ~100 objects) outlived it until a full garbage
        # collection, which the serving process's thresholds make rare (``gateway/asgi.py``): the
        # server's memory grew ~1 KB a stored stream under sustained load.
        executor.before_start = executor.before_store = None
        await self.stop()
        if self.heartbeat is None or executor.stored:
            return  # never taken, or finished by the final store
        refusal = executor.store_refusal
        try:
            await run_orm(
                services.response_fail_unfinished,
                id=executor.p.response_id,
                message=refusal.message if refusal is not None else UNSTORED_MESSAGE,
                code=(refusal.code or "server_error") if refusal is not None else "server_error",
            )
        except Exception:  # the lease expires and the sweep fails it
            log.exception("response %s: storing its failure failed", executor.p.response_id)


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
