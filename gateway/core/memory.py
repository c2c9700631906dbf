"""Give back what closed connections held: their reference cycles, then the C heap's free pages.

Closed WebSocket connections leave cycles that only a full collection frees, and an idle server
rarely triggers one; glibc returns freed pages only from the top of its heap. So
:func:`connection_closed` runs, :data:`RELEASE_DELAY_S` later and once per burst of closes, a full
collection and then ``malloc_trim(0)`` off the loop (skipped where libc lacks it, e.g. musl).
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
