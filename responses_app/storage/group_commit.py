"""The group commit of the stored-response writes (``writes.final_writes``). It stays because
writing each response alone, measured side by side on SQLite and PostgreSQL, cost far more CPU
per stored response and throughput (docs/performance.md).

:class:`GroupWriter` is the group commit of one write path: writes that wait at the same time run
together in one transaction on one ORM thread (one thread hop and one commit per batch instead of
per write), and each caller gets its own result or exception. A batch that fails is rolled back
and its writes are run again one by one, each in its own transaction, so one bad write fails only
its own caller. Nothing queued is dropped: a cancelled caller stops waiting, its write still runs.

A writer's batches run on a thread of its own (one a process, started on first use), which keeps
its database connection from one batch to the next, and from one burst of writes to the next: with
PostgreSQL's pool, giving the connection back after a burst and taking it again for the next costs
a health-check round trip each time.
The connection is tidied (``close_old_connections``) before the first batch and after a batch in
which a write failed. A kept connection that died meanwhile (the database restarted) fails its
batch with a connection error (``OperationalError``, ``InterfaceError``): the batch is written once
more on a fresh connection (so is one whose statement failed on a live connection, a
``statement_timeout``: psycopg cannot yet tell the two apart when the write fails, since after a
restart the server's shutdown message arrives before the connection's end). The kept connection
counts against ``[database] pool_max_size``: :func:`gateway.core.db.run_orm`'s threads are one fewer; with a pool
of one connection the writer gives it back after each burst instead. :meth:`GroupWriter.release`
gives it back on demand (before the database is dropped: the tests' teardown).

A writer built with ``combine`` also takes *combined* writes (:meth:`GroupWriter.put`): values
rather than functions, which the batch hands to ``combine`` in one call (one statement for all of
them, where the backend allows it) that answers one result per value. ``combine`` is atomic on its
own and joins a surrounding transaction: a batch of combined writes alone runs without the batch's
transaction (on PostgreSQL its one statement is one round trip, instead of ``BEGIN``, a statement
per write and ``COMMIT``). A failed call is retried one value at a time, like a failed batch.
A combined write that no batch has taken yet can be withdrawn (:meth:`GroupWriter.withdraw`).

One batch is written at a time: a write queued while a batch is being written goes into a later
batch, committed after it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ParamSpec, TypeVar

from django.db import InterfaceError, OperationalError, close_old_connections, connections

from gateway.core.config import get_config

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger("responses_app.storage.group_commit")

# A result handed back to its caller: the future, and the result or the exception.
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]


def _hand_back(loop: asyncio.AbstractEventLoop, outcomes: list[_Outcome]) -> None:
    """Settle the futures of ``outcomes`` (all of ``loop``) with one wake-up of the loop."""

    def settle() -> None:
        for future, result, error in outcomes:
            if future.done():  # the caller was cancelled
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop closed meanwhile: nobody waits for this any more
        log.debug("ORM call finished after its event loop closed")


def _keeps_connection() -> bool:
    """Whether a writer's thread keeps its connection between bursts (module docstring): not with
    a pool of one connection, which ``run_orm``'s threads need too."""
    return get_config().database.pool_max_size >= 2


class _Write:
    __slots__ = ("call", "context", "future", "loop", "value")

    def __init__(self, call: Callable[[], Any] | None, value: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Any] = self.loop.create_future()
        self.context = contextvars.copy_context()
        self.call = call  # None: a combined write (``value`` goes to the writer's ``combine``)
        self.value = value


class GroupWriter:
    """Group commit (module docstring): ``await writer.run(fn, ...)`` runs ``fn`` on an ORM
    thread together with the other writes waiting at that moment, all inside one ``transaction()``.

    One batch is written at a time; the writes that arrive meanwhile form the next one, and the first
    write after a pause starts at the end of the current turn of its event loop, so the writes that
    turn produces are written with it (larger batches, docs/performance.md). ``fn`` must be atomic on its own (a write alone, or
    retried alone, runs without the batch's transaction), join a surrounding transaction, and do
    its side effects outside the database with ``transaction.on_commit`` (a rolled-back batch runs
    it again).
    """

    def __init__(
        self,
        transaction: Callable[[], AbstractContextManager[Any]],
        combine: Callable[[list[Any]], list[Any]] | None = None,
    ) -> None:
        self.transaction = transaction
        self.combine = combine
        self.lock = threading.Lock()
        self.waiting: list[_Write] = []
        self.writing = False
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread_pid = 0  # the process whose writer thread runs (a forked child starts its own)
        # Per thread, as Django's connections are: whether the thread's connection served its last
        # batch and was kept since.
        self.connection_state = threading.local()

    @property
    def held(self) -> bool:
        return getattr(self.connection_state, "held", False)

    @held.setter
    def held(self, value: bool) -> None:
        self.connection_state.held = value

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._queue(_Write(functools.partial(fn, *args, **kwargs)))  # type: ignore[no-any-return]

    async def put(self, value: Any) -> Any:
        """A combined write (module docstring): ``value`` joins the batch's one ``combine`` call;
        its result."""
        return await self.submit(value)

    def submit(self, value: Any) -> asyncio.Future[Any]:
        """:meth:`put`, queued now: the future of its result, which :meth:`withdraw` may take back
        while the write still waits (from the event loop that queued it)."""
        assert self.combine is not None, "a writer without combine takes no combined writes"
        write = _Write(None, value)
        self._enqueue(write)
        return write.future

    def withdraw(self, future: asyncio.Future[Any]) -> bool:
        """Take back the combined write of ``future`` (:meth:`submit`) if no batch has taken it yet:
        it is never written and ``future`` answers None. False when it is being written or was."""
        with self.lock:
            for position, write in enumerate(self.waiting):
                if write.future is future:
                    del self.waiting[position]
                    break
            else:
                return False
        if not future.done():
            future.set_result(None)
        return True

    async def _queue(self, write: _Write) -> Any:
        self._enqueue(write)
        return await write.future

    def _enqueue(self, write: _Write) -> None:
        with self.lock:
            self.waiting.append(write)
            start = not self.writing
            self.writing = True
        if start:
            # At the end of this turn of the event loop: the writes that the callbacks already due
            # produce (responses that finished on the same upstream read) join the batch. Not a
            # timer: nothing waits for anything that is not already running.
            write.loop.call_soon(self._submit, self._drain)

    def _submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the writer's thread, started in this process on first use."""
        with self.lock:
            if self.thread_pid != os.getpid():
                self.thread_pid = os.getpid()
                self.jobs = queue.SimpleQueue()
                threading.Thread(
                    target=self._serve, args=(self.jobs,), name="orm-writer", daemon=True
                ).start()
            jobs = self.jobs
        jobs.put(job)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while True:
            job = jobs.get()
            if job is None:  # released (:meth:`release`)
                return
            try:
                job()
            except BaseException:  # a drain hands its own outcomes back; this is a bug in one
                log.exception("ORM writer job failed")

    def release(self, timeout: float = 10.0) -> None:
        """Give back the connection the writer's thread keeps (module docstring) and end the thread
        once the writes queued before are done (a later write starts another); waits for it.
        Nothing to do in a process whose writer has no thread."""
        with self.lock:
            if self.thread_pid != os.getpid():
                return
            self.thread_pid = 0
            jobs = self.jobs
        done = threading.Event()

        def give_back() -> None:
            try:
                connections.close_all()  # this thread's connections: back to the pool
            finally:
                self.held = False
                done.set()

        jobs.put(give_back)
        jobs.put(None)
        done.wait(timeout)

    def _drain(self) -> None:
        """On the writer's thread: write batches until nothing waits, on the connection the last
        batch used (module docstring)."""
        while True:
            with self.lock:
                batch, self.waiting = self.waiting, []
                if not batch:
                    self.writing = False
                    break
            kept = self.held
            outcomes = self._attempt(batch)
            if kept and any(isinstance(error, (OperationalError, InterfaceError)) for _, error in outcomes):
                # The kept connection died meanwhile (a database restart): once more on a fresh one.
                log.info("a kept connection failed a batch of %d writes; writing it again", len(batch))
                outcomes = self._attempt(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
            for write, (result, error) in zip(batch, outcomes, strict=True):
                by_loop.setdefault(write.loop, []).append((write.future, result, error))
            for loop, settled in by_loop.items():
                _hand_back(loop, settled)
        if self.held and _keeps_connection():
            return
        self.held = False
        try:
            close_old_connections()
        except Exception:  # the writes are done (committed or not): their outcomes stand
            log.warning("closing an ORM thread's connections failed", exc_info=True)

    def _attempt(self, batch: list[_Write]) -> list[tuple[Any, BaseException | None]]:
        """The batch's outcomes, on a tidied connection unless the last batch's was kept; a batch
        in which a write failed leaves its connection to be tidied before the next."""
        try:
            if not self.held:
                close_old_connections()
            outcomes = self._write(batch)
        except BaseException as exc:  # tidying the connection failed: every caller hears it
            outcomes = [(None, exc)] * len(batch)
        self.held = all(error is None for _, error in outcomes)
        return outcomes

    def _write(self, batch: list[_Write]) -> list[tuple[Any, BaseException | None]]:
        outcomes = self._together(batch) if len(batch) > 1 else None
        if outcomes is None:
            outcomes = [self._alone(write) for write in batch]
        return outcomes

    def _together(self, batch: list[_Write]) -> list[tuple[Any, BaseException | None]] | None:
        """The batch in one transaction (the combined writes in one ``combine`` call): every write's
        result, or None when it was rolled back."""
        calls = [write for write in batch if write.call is not None]
        combined = [write for write in batch if write.call is None]
        results: dict[int, Any] = {}
        try:
            # Combined writes alone: ``combine`` is atomic on its own, no batch transaction.
            with self.transaction() if calls else nullcontext():
                for write in calls:
                    results[id(write)] = write.context.run(write.call)  # type: ignore[arg-type]
                if combined:
                    assert self.combine is not None
                    values = combined[0].context.run(self.combine, [write.value for write in combined])
                    if len(values) != len(combined):
                        raise RuntimeError(
                            f"combine answered {len(values)} results for {len(combined)} writes"
                        )
                    results.update(zip(map(id, combined), values, strict=True))
        except Exception:
            log.info("a batch of %d writes failed; writing them one by one", len(batch), exc_info=True)
            close_old_connections()  # a connection the failure broke is not used for the retries
            return None
        return [(results[id(write)], None) for write in batch]

    def _alone(self, write: _Write) -> tuple[Any, BaseException | None]:
        try:
            if write.call is not None:
                return write.context.run(write.call), None
            assert self.combine is not None
            return write.context.run(self.combine, [write.value])[0], None
        except BaseException as exc:  # handed to the caller, as run_orm does
            return None, exc
