"""The one way async code runs ORM work: :func:`run_orm`.

Shaped like Channels' ``database_sync_to_async``: the synchronous function runs on a worker thread
with the caller's context variables, and the thread's stale or broken connections are closed
before and after (``close_old_connections``; with ``CONN_MAX_AGE = 0`` a pooled PostgreSQL
connection goes back to the pool after every call). Unlike asgiref's thread-sensitive mode it
never funnels unrelated requests through one thread: calls run side by side on a pool of up to
``[database] pool_max_size`` threads, so the pool never holds more threads than the database pool
has connections to give them.

The pool is a queue and plain threads that hand each result back with
``loop.call_soon_threadsafe``: a ``ThreadPoolExecutor`` round trip (its future, chained to an
asyncio future) measured at a tenth of a stored response's CPU.

A caller that is cancelled stops waiting at once; work already started finishes on its thread
(a write is never cut in half).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger("gateway.db")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[[], Any]]


class _Pool:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.threads = 0
        self.idle = 0

    def submit(self, job: _Job) -> None:
        """Queue ``job`` for an idle thread (reserved here), else a new one up to the limit; at the
        limit it waits for the first thread that frees up."""
        with self.lock:
            start = False
            if self.idle:
                self.idle -= 1
            elif self.threads < _max_threads():
                self.threads += 1
                start = True
        self.jobs.put(job)
        if start:
            threading.Thread(target=self._work, name="orm", daemon=True).start()

    def _work(self) -> None:
        while True:
            loop, future, context, call = self.jobs.get()
            try:
                result = context.run(call)
            except BaseException as exc:  # handed to the caller, as an executor would
                _hand_back(loop, future, None, exc)
            else:
                _hand_back(loop, future, result, None)
            with self.lock:
                self.idle += 1


def _hand_back(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    def settle() -> None:
        if future.done():  # the caller was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop closed meanwhile: nobody waits for this any more
        log.debug("ORM call finished after its event loop closed")


def _max_threads() -> int:
    from gateway.config import get_config

    return max(1, get_config().database.pool_max_size)


_pool = _Pool()


async def run_orm(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` (synchronous ORM work) on an ORM worker thread; its result."""

    def call() -> R:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    loop = asyncio.get_running_loop()
    future: asyncio.Future[R] = loop.create_future()
    _pool.submit((loop, future, contextvars.copy_context(), call))
    return await future
