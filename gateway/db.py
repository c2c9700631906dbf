"""The one way async code runs ORM work: :func:`run_orm`.

Shaped like Channels' ``database_sync_to_async``: the synchronous function runs on a worker thread
with the caller's context variables, and the thread's stale or broken connections are closed
before and after (``close_old_connections``; with ``CONN_MAX_AGE = 0`` a pooled PostgreSQL
connection goes back to the pool after every call). Unlike asgiref's thread-sensitive mode it
never funnels unrelated requests through one thread: calls run side by side on a pool of
``[database] pool_max_size`` threads, so the pool never holds more threads than the database pool
has connections to give them.

A caller that is cancelled stops waiting at once; work already started finishes on its thread
(a write is never cut in half).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                from gateway.config import get_config

                _executor = ThreadPoolExecutor(
                    max_workers=max(1, get_config().database.pool_max_size), thread_name_prefix="orm"
                )
    return _executor


async def run_orm(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` (synchronous ORM work) on an ORM worker thread; its result."""
    context = contextvars.copy_context()

    def call() -> R:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return await asyncio.get_running_loop().run_in_executor(_pool(), context.run, call)
