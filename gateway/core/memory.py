"""Give back what closed connections held: their reference cycles, then the C heap's free pages.

A closed WebSocket connection leaves reference cycles (the upgraded HTTP protocol and its parser,
cancelled tasks and their tracebacks, the consumer's contexts) that only the garbage collector
frees. With the collector tuned for request throughput (``gateway.asgi``: young objects die by
reference count, full collections are rare) an idle connection allocates too little to trigger
one, so thousands of closed connections stayed in memory (issue 62, ``docs/websocket.md``).

What is freed then goes back to glibc, which returns pages to the system only from the top of its
heap; its ``malloc_trim(0)`` (glibc 2.8 and newer, public API) hands back every free page. Without
it the process stays at its high-water mark and creeps above it as the heap fragments.

:func:`connection_closed` asks for both: :data:`RELEASE_DELAY_S` after the first close that asked,
one full collection on the event loop's thread, then the trim on a thread of the loop's default
executor (the loop never waits for it). The closes in between share them and ask for one more
release after it, since what they held may still be in use when it runs. A connection's stored
response that outlives it asks again when it ends. On a C library without ``malloc_trim`` (musl)
only the collection runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("gateway")

# How long after a close the release runs: a burst of closes shares one.
RELEASE_DELAY_S = 5.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


malloc_trim = _load_malloc_trim()


class Releaser:
    """At most one pending release per process; :attr:`releases` counts those that ran."""

    def __init__(self, trim: Callable[[int], int] | None, collect: Callable[[], int] = gc.collect) -> None:
        self.trim = trim
        self.collect = collect
        self.releases = 0
        self._pending: asyncio.AbstractEventLoop | None = None  # the loop a release is scheduled on
        self._again = False  # a close shared the pending release: one more after it

    def connection_closed(self) -> None:
        """A connection ended: release its memory soon (called on the event loop's thread)."""
        if self._pending is not None and not self._pending.is_closed():
            # Shares the pending release, and asks for one more after it: what this connection
            # holds may still be in use when that one runs (its last task finishing).
            self._again = True
            return
        self._schedule(asyncio.get_running_loop())

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending = loop
        self._again = False
        loop.call_later(RELEASE_DELAY_S, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        started = time.perf_counter()
        freed = self.collect()
        log.debug(
            "released closed connections: %d objects in %.1f ms",
            freed,
            1000 * (time.perf_counter() - started),
        )
        if self.trim is None:
            self._ran(loop, None)
            return
        loop.run_in_executor(None, self._trim).add_done_callback(lambda done: self._ran(loop, done))

    def _trim(self) -> None:
        assert self.trim is not None
        self.trim(0)

    def _ran(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None] | None) -> None:
        self._pending = None
        if done is not None and not done.cancelled() and done.exception() is not None:
            log.warning("malloc_trim failed: %s", done.exception())
        else:
            self.releases += 1
        if self._again and not loop.is_closed():
            self._schedule(loop)


releaser = Releaser(malloc_trim)


def connection_closed() -> None:
    """What a closed connection calls: see :class:`Releaser`."""
    releaser.connection_closed()
