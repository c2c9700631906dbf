"""Running an :class:`~responses_app.engine.executor.Executor` to its end, whatever the client does.

Every transport drives a response through :func:`drive`, which the shutdown may interrupt (the
response still ends ``failed`` and is stored). :func:`detached` runs a stream in its own task: a
stored response outlives its client, as on OpenAI, so its announced id stays retrievable; an
unstored one is cancelled. A stored stream holds a lease (:class:`_StreamLease`): its ``in_progress``
row is committed before ``response.created`` is sent, so a dead process leaves a ``failed`` row,
not a 404 (``docs/operations.md``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from gateway.core.db import run_orm
from gateway.core.lifecycle import Interruptible, drain, interruptible, keep_running
from gateway.core.sse import Event, error_frame
from responses_app.engine.executor import Executor
from responses_app.engine.lifecycle import unstored_message
from responses_app.storage import leases, services, writes

log = logging.getLogger("responses.runs")

# What receives a run's events: None when it took the event, else an awaitable to wait for.
OnEvent = Callable[[Event], Awaitable[None] | None]

SHUTDOWN_MESSAGE = (
    "The server shut down before this response finished (shutdown grace period exceeded); "
    "the response was not completed."
)

LEASE_LOST_MESSAGE = (
    "This response's lease could not be renewed and it was stored failed meanwhile "
    "(docs/operations.md); the response was not completed."
)
UNSTORED_MESSAGE = "The response stopped before it could be stored; the response was not completed."


async def drive(executor: Executor, on_event: OnEvent) -> None:
    """Every event of ``executor``'s run to ``on_event``, ending with exactly one terminal or error
    event, even when the shutdown interrupts it. ``on_event`` may answer an awaitable to wait for."""
    await _held(executor, on_event, _StreamLease(executor) if _leased(executor) else None)


def _leased(executor: Executor) -> bool:
    p = executor.p
    return p.store and bool(p.request.stream) and not p.background


async def _held(executor: Executor, on_event: OnEvent, lease: _StreamLease | None) -> None:
    with drain.held():  # the shutdown waits for an interrupted run's failure to be stored
        await _drive(executor, on_event, lease)


async def _drive(executor: Executor, on_event: OnEvent, lease: _StreamLease | None) -> None:
    events = executor.run()
    try:
        async with interruptible() as run:
            if lease is not None:
                lease.run = run
            async for event in events:
                # Not a coroutine for every event when the transport takes it at once (an SSE
                # stream's channel, a JSON answer that reads only the final object).
                taken = on_event(event)
                if taken is not None:
                    await taken
        if run.interrupted:
            await events.aclose()  # type: ignore[attr-defined]
            message = SHUTDOWN_MESSAGE
            if lease is not None and lease.unwritten is not None:
                message = unstored_message(lease.unwritten)
            elif lease is not None and lease.lost:
                message = LEASE_LOST_MESSAGE
            async for event in executor.interrupt(message):
                taken = on_event(event)
                if taken is not None:
                    await taken
    finally:
        # A run its caller stopped taking events from (a cancelled background response) is closed now,
        # not when collected: its upstream call ends and is accounted (Lifecycle.run_ended).
        await events.aclose()  # type: ignore[attr-defined]
        if lease is not None:
            await lease.release()


class _StreamLease:
    """The lease of a stored stream: its ``in_progress`` row is written just before ``response.created``
    (:meth:`take`) and renewed until the final store begins; a lost lease ends the run ``failed``, and
    a run that ends without storing fails its row.

    With ``overlap`` (SSE) :meth:`take` only queues the write and the reader waits for
    :meth:`announced`; the final store follows that write on the same writer or replaces it
    (:func:`writes.withdraw_in_progress`).
    """

    def __init__(self, executor: Executor, overlap: bool = False) -> None:
        self.executor = executor
        self.overlap = overlap
        self.run: Interruptible | None = None
        self.heartbeat: leases.Heartbeat | None = None
        self.row: asyncio.Future[Any] | None = None  # the in_progress row's write
        self.written = False  # the in_progress row is committed
        self.storing = False  # the final store has begun
        self.withdrawn = False  # the final store took the in_progress row's place
        self.lost = False
        self.unwritten: BaseException | None = None  # why the in_progress row could not be written
        executor.before_start = self.take
        executor.before_store = self.stop

    async def take(self, snapshot: dict[str, Any]) -> None:
        executor = self.executor
        row = writes.store_in_progress(
            executor.p, snapshot, leases.runner_id(), executor.config.responses.lease_s
        )
        if not self.overlap:
            await row
            self._hold()
            return
        self.row = row
        row.add_done_callback(self._row_done)

    def _row_done(self, row: asyncio.Future[Any]) -> None:
        error = row.exception() if not row.cancelled() else asyncio.CancelledError()
        if error is None:
            if self.storing:
                self.written = not self.withdrawn
            else:
                self._hold()
            return
        self.unwritten = error
        if not self.storing and self.run is not None:
            log.warning(
                "response %s: its in_progress row could not be written (%r), ending it failed",
                self.executor.p.response_id,
                error,
            )
            self.run.interrupt()

    def _hold(self) -> None:
        self.written = True
        self.heartbeat = leases.start_heartbeat(self.executor.p.response_id, self.executor.config, self._lose)

    async def announced(self) -> bool:
        """Whether the first event may be sent: waits for the in_progress row; False when its write failed or
        the final store took its place."""
        if self.row is None:
            return True
        await _settled(self.row)
        return self.written

    def _lose(self) -> None:
        log.warning("response %s: lease lost, ending it failed", self.executor.p.response_id)
        self.lost = True
        if self.run is not None:
            self.run.interrupt()

    async def stop(self) -> None:
        """The final store begins: it ends the lease (a renewal racing it must not interrupt it).
        An in_progress row still waiting to be written is taken back: the final row replaces it."""
        self.storing = True
        if self.row is not None and not self.row.done():
            self.withdrawn = writes.withdraw_in_progress(self.row)
        if self.heartbeat is not None:
            self.heartbeat.cancel()

    async def release(self) -> None:
        executor = self.executor
        # The lease is over: unhook it. The hooks form a reference cycle with the executor, which would keep
        # each stored stream's whole run alive until a (rare) full collection.
        executor.before_start = executor.before_store = None
        await self.stop()
        if self.row is not None and not self.row.done():
            await _settled(self.row)  # being written: then it can be failed
        if not self.written or executor.stored:
            return  # never written, or finished by the final store
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


def detached(executor: Executor) -> AsyncIterator[Event]:
    """``executor``'s events, produced by a task of their own (see the module docstring); a stored
    stream's first event waits for its row (:meth:`_StreamLease.announced`)."""
    return _detached(executor, frames=False)


def detached_frames(executor: Executor) -> AsyncIterator[bytes]:
    """:func:`detached`'s events as their SSE frames (one async generator fewer for every event
    of an SSE response to pass through)."""
    return _detached(executor, frames=True)


async def _detached(executor: Executor, *, frames: bool) -> AsyncIterator[Any]:
    queue = _Channel()
    lease = _StreamLease(executor, overlap=True) if _leased(executor) else None

    async def produce() -> None:
        try:
            await _held(executor, queue.put_nowait, lease)
        finally:
            queue.put_nowait(None)

    task = asyncio.get_running_loop().create_task(produce())
    keep_running(task)
    try:
        event = await queue.get()
        if event is not None and lease is not None and not await _announced(lease, task):
            failure = _unannounced(executor, lease)
            yield failure.frame if frames else failure
            return
        while event is not None:
            yield event.frame if frames else event
            event = await queue.get()
        await task  # its exception, if it ended with one
    finally:
        if not task.done() and not executor.p.store:
            task.cancel()


class _Channel:
    """The events of a detached run, from its task to the stream's one reader: ``asyncio.Queue`` without
    its bookkeeping, which showed up in profiles of stored streams."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: deque[Event | None] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Event | None) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Event | None:
        items = self.items
        while not items:
            waiter = self.waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self.waiter = None
        return items.popleft()


def _unannounced(executor: Executor, lease: _StreamLease) -> Event:
    """The one event of a stream whose response was never stored (the run's error, else the row write's
    failure), numbered 0."""
    failure = executor.failure_event
    if failure is not None:
        data = failure.data
        return error_frame(
            code=data.get("code"), message=data["message"], param=data.get("param"), sequence_number=0
        )
    return error_frame(
        code="storage_error", message=unstored_message(lease.unwritten), param=None, sequence_number=0
    )


async def _announced(lease: _StreamLease, task: asyncio.Task[None]) -> bool:
    """Whether the stream may be sent: its row is written, or its write failed and the run (which
    that interrupted) still stored its final row."""
    if await lease.announced():
        return True
    await _settled(task)
    return lease.executor.stored


async def _settled(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, whatever its outcome; cancelling the wait leaves it running."""
    if future.done():
        return
    waiter = future.get_loop().create_future()

    def wake(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        future.remove_done_callback(wake)
