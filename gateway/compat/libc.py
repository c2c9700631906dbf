"""glibc's allocator: give freed memory back to the system after connections close.

Every WebSocket connection allocates native memory outside Python's allocator: the zlib streams of
``permessage-deflate`` (which the ``websockets`` and ``openai`` clients negotiate by default) and
the transport's buffers. glibc keeps what is freed in its heap and returns pages to the system
only from the top of it, so once thousands of connections have come and gone the process stays at
its high-water mark and creeps above it as the heap fragments (``docs/websocket.md``, Memory).

``malloc_trim(0)`` (glibc 2.8 and newer, public API) hands every free page of every arena back.
:func:`connection_closed` asks for one: the trim runs :data:`TRIM_DELAY_S` after the first close
that asked, on a thread of the loop's default executor (the loop never waits for it), and the
closes in between share it. On a C library without ``malloc_trim`` (musl) nothing happens.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("gateway")

# How long after a close the trim runs: a burst of closes shares one trim.
TRIM_DELAY_S = 2.0


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


class Trimmer:
    """At most one pending trim per process; :attr:`trims` counts those that ran."""

    def __init__(self, trim: Callable[[int], int] | None) -> None:
        self.trim = trim
        self.trims = 0
        self._pending: asyncio.AbstractEventLoop | None = None  # the loop a trim is scheduled on

    def connection_closed(self) -> None:
        """A connection ended: trim the heap soon (called on the event loop's thread)."""
        if self.trim is None:
            return
        loop = asyncio.get_running_loop()
        if self._pending is not None and not self._pending.is_closed():
            return
        self._pending = loop
        loop.call_later(TRIM_DELAY_S, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_in_executor(None, self._run).add_done_callback(self._ran)

    def _run(self) -> None:
        assert self.trim is not None
        self.trim(0)

    def _ran(self, done: asyncio.Future[None]) -> None:
        self._pending = None
        if not done.cancelled() and done.exception() is not None:
            log.warning("malloc_trim failed: %s", done.exception())
            return
        self.trims += 1


trimmer = Trimmer(malloc_trim)


def connection_closed() -> None:
    """What a closed connection calls: see :class:`Trimmer`."""
    trimmer.connection_closed()
