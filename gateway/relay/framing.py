"""The bytes the server side writes, shared by its cycles: the status line, the chunked framing, and
an answer's bytes held until the end of the loop turn that produced them.

``CoalescingCycle`` (uvicorn's cycle, subclassed), ``HandlerCycle`` (a registered handler's
request) and the callback ``Relay`` frame a body without a length with :func:`chunk`, and the two
cycles hold a stream's head and chunks in a :class:`HeldWrites` (the relay holds its writes in the
pool's ``Outbox``, with the upstream's).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

LAST_CHUNK = b"0\r\n\r\n"


def status_line(status: int) -> bytes:
    """uvicorn's status line for ``status`` (``HTTP/1.1 <status> <reason>``)."""
    return STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status


def chunk(data: bytes, last: bool = False) -> bytes:
    """``data`` as one chunk of a chunked body (nothing for no data: an empty chunk would end it),
    followed by the terminating chunk when it is the ``last``."""
    framed = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
    return framed + LAST_CHUNK if last else framed


class Answering(Protocol):
    """What :class:`HeldWrites` needs of the cycle whose bytes it holds."""

    disconnected: bool
    transport: Any


class HeldWrites:
    """An answer's bytes not written yet: held until the end of the loop turn that produced them
    (:meth:`flush_soon`: what the application sends in one turn goes out in one write), or taken to
    go out with the answer's next write (:meth:`take`). Nothing is written to a client that has
    left or a transport that is closing."""

    __slots__ = ("cycle", "data", "handle")

    def __init__(self, cycle: Answering) -> None:
        self.cycle = cycle
        self.data = b""
        self.handle: asyncio.Handle | None = None

    def add(self, data: bytes) -> None:
        self.data += data

    def flush_soon(self) -> None:
        if self.handle is None:
            self.handle = asyncio.get_running_loop().call_soon(self.flush)

    def take(self) -> bytes:
        """What is held (written by the caller), no longer held."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.cancel()
        data, self.data = self.data, b""
        return data

    def flush(self) -> None:
        self.handle = None
        data, self.data = self.data, b""
        cycle = self.cycle
        if data and not cycle.disconnected and not cycle.transport.is_closing():
            cycle.transport.write(data)
