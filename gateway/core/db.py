"""The one way async code runs ORM work: :func:`run_orm`.

Channels' ``database_sync_to_async`` with ``thread_sensitive=False`` on a pool of ``[database]
pool_max_size`` threads less one (left for the group-commit writer), so unrelated requests never
queue on one thread. A cancelled caller stops waiting; started work finishes (a write is never cut).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from channels.db import database_sync_to_async

from gateway.core.config import get_config

P = ParamSpec("P")
R = TypeVar("R")

_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        size = max(1, get_config().database.pool_max_size - 1)
        _executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="orm")
    return _executor


def _forget_pool() -> None:
    """In a forked child the parent's pool threads do not exist: start a pool of its own."""
    global _executor
    _executor = None


os.register_at_fork(after_in_child=_forget_pool)


async def run_orm(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` (synchronous ORM work) on an ORM worker thread; its result."""
    call = database_sync_to_async(fn, thread_sensitive=False, executor=_pool())
    return await call(*args, **kwargs)
