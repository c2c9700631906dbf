"""The group commit of the stored-response writes (``writes.final_writes``); kept because it saves
much of the CPU a stored response costs on SQLite and PostgreSQL (``docs/performance.md``).

:class:`GroupWriter` runs writes that wait together in one transaction on its own thread, which keeps
its connection between batches. A failed batch is retried on a fresh connection if the connection
died, else one write at a time, so a bad write fails alone. Nothing queued is dropped.
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
    """``await writer.run(fn, ...)`` runs ``fn`` on the writer's thread with the other writes waiting
    then, in one ``transaction()``; one batch at a time, the first after a pause at the end of the
    current loop turn so that turn's writes join it.

    ``fn`` must be atomic alone, join a surrounding transaction, and defer side effects with
    ``transaction.on_commit`` (a rolled-back batch runs it again).
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
        """A combined write: ``value`` joins the batch's one ``combine`` call (one statement for all
        values where the backend allows); its result."""
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
            # At the end of this loop turn, not on a timer: responses finished by the same upstream read join.
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
        """Give back the connection the writer's thread keeps and end the thread once queued writes are
        done; waits for it."""
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
