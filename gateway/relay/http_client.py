"""A lean HTTP/1.1 client for the one upstream: asyncio Protocols, ``httptools`` and a keep-alive pool.

It lives in ``gateway.relay`` because the callback relay is designed with it (``send_on``, ``Outbox``,
``Sink``), but it is not part of what ``[server] direct_relay = false`` or the uvicorn version guard
switch off: it uses only public APIs (asyncio, ``httptools``' parser) and is the HTTP client of
``inference_app.upstream.HttpUpstream`` on every path (the ASGI fast path, the executor, the Messages
loop, Celery workers, management commands). The gateway app hands :class:`HttpPool` to the upstream
factory in ``AppConfig.ready()`` (``inference_app.upstream.use_http_client``), so ``inference_app``
never imports this package.

Why not aiohttp: on the pass-through path the upstream round trip is most of the gateway's own work,
and aiohttp's general-purpose client (sessions, tracing hooks, cookie jars, multidicts, stream
readers) costs several times what a single-host relay needs. This client does only that: one pool per
event loop to one base URL, requests framed by hand, responses parsed by ``httptools`` (llhttp), body
chunks handed on exactly as they arrive.

Pool: at most ``pool_size`` connections; idle ones are reused newest first; when all are busy the
callers queue first come, first served. A connection is pooled again only when its response arrived
in full and both sides keep it alive; one the server closed while idle is dropped before reuse, and a
replayable request (a ``bytes`` body) that finds its reused connection closed before any answer byte
is retried once on a fresh one.

Two ways to take a response: :meth:`HttpPool.request` (await the headers, then iterate the body),
or, for a relay that runs on callbacks alone (``gateway.relay.callbacks``), :meth:`HttpPool.send_on` with a
:class:`Sink` whose ``pump()`` is called whenever the exchange moves on (headers, body bytes, the
end, an error); it reads the same state :class:`ResponseBody` reads.

Timers: each connection has one ``call_at`` handle that is re-armed only when it fires (it checks the
phase and the time of the last body data then), never per request or per chunk.

Writes on the callback path go through the loop's :class:`Outbox`: held until the loop has run every
callback that is ready now, then written in one pass. A write to a socket whose reader is waiting
wakes that process, which on a busy machine takes the CPU from the writer there and then; one pass
per loop iteration lets the gateway handle every request that is ready before the upstream and the
clients are woken, and lets them read several answers per wake-up (``docs/performance.md``).

A lone exchange's wait is polled (:class:`IdlePoll`, ``[upstream] idle_poll_us``): after the outbox
wrote with at most one exchange of its pool in flight, the loop keeps polling its sockets for a
short, adaptive while before it sleeps, because waking a sleeping process costs more than the
answer of a fast upstream (or a client's next request) takes to arrive.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import AsyncIterable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools

from gateway import errors
from gateway.config import UpstreamConfig

log = logging.getLogger("gateway.upstream")

UNREACHABLE = "Could not reach the upstream model server."
MID_RESPONSE = "The upstream connection failed mid-response."
# Unread response body buffered per connection before the socket stops being read.
READ_HIGH_WATER = 256 * 1024
# An idle connection older than this is closed, not reused: vLLM's server (uvicorn) closes idle
# keep-alive connections after 5 s, and a request sent as it does so fails (a streamed body cannot
# be replayed).
IDLE_REUSE_S = 4.0
# Larger bytes bodies are written after the head instead of being copied into one buffer with it.
_JOIN_LIMIT = 64 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Request heads remembered by HttpPool.head() (cleared when full: distinct header sets are few).
_HEADS_KEPT = 256

# Where a connection is in its exchange; the timer checks this when it fires.
_IDLE, _HEADERS, _BODY, _DONE = 0, 1, 2, 3

RequestBody = bytes | AsyncIterable[bytes] | None


class IdlePoll:
    """Keeps the event loop polling for a short while after a lone exchange's write, instead of
    letting it sleep in ``epoll`` at once.

    With one exchange in flight the loop has nothing to do until the answer (or the client's next
    request) arrives, and sleeps. Waking it costs the sender an inter-processor interrupt and the
    woken CPU a return from idle, which on a virtual machine costs more than a fast upstream takes
    to answer (measured, ``docs/performance.md``: a relayed exchange at concurrency 1 went from
    about 4,300 to about 7,500 a second at the same CPU per request). So after :meth:`wrote`,
    while at most one exchange of the pool is in flight (``lone``), the loop runs one cheap
    callback per iteration until a deadline: uvloop then polls the sockets without blocking and
    runs what arrives at once. It polls only once the last :attr:`STREAK` writes were all lone:
    under load a moment with one exchange in flight comes now and then (the other requests are
    still with the clients or the upstream, which on a busy machine need the CPU that polling
    would take), while a process serving one exchange at a time meets it at every write. With
    more exchanges in flight the loop is seldom idle: nothing is polled.

    How long to poll adapts as the kernel's ``cpuidle-haltpoll`` governor does, so that a slow
    upstream (a real model's first token takes milliseconds) is not polled for: each wait is
    measured from one write to the next; a wait longer than the window but within ``limit``
    doubles the window (at least to a quarter of ``limit``), a longer one halves it (to nothing
    below an eighth of ``limit``), and a wait the window covered leaves it alone.
    """

    # Lone writes in a row before the waits are polled.
    STREAK = 16

    __slots__ = ("clock", "limit", "lone", "loop", "polling", "since", "streak", "until", "window")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limit: float,
        lone: Callable[[], bool],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.loop = loop
        self.limit = limit  # seconds
        self.lone = lone
        self.clock = clock
        self.window = 0.0  # how long the next wait is polled
        self.since = 0.0  # when the wait now going on began (0: none measured)
        self.until = 0.0  # polling ends then
        self.polling = False
        self.streak = 0  # lone writes in a row

    def wrote(self) -> None:
        """Writes went out: learn from the wait that ended, and poll the next one when it is lone."""
        now = self.clock()
        since = self.since
        if since:
            self._adapt(now - since)
        if not self.lone():
            self.since = 0.0
            self.streak = 0
            return
        self.since = now
        self.streak += 1
        if self.window <= 0.0 or self.streak < self.STREAK:
            return
        self.until = now + self.window
        if not self.polling:
            self.polling = True
            self.loop.call_soon(self._poll)

    def _adapt(self, waited: float) -> None:
        window, limit = self.window, self.limit
        if waited <= window:
            return  # the poll covered it
        if waited <= limit:
            self.window = min(limit, max(window * 2, limit / 4))
        else:
            window /= 2
            self.window = window if window >= limit / 8 else 0.0

    def _poll(self) -> None:
        if self.clock() < self.until:
            self.loop.call_soon(self._poll)
        else:
            self.polling = False


class Outbox:
    """Writes held until the callbacks that are ready on the loop have run, then written in order:
    one write a connection, of everything held for it (a stream's head, its chunk and its
    terminator put in one turn go out in one ``send()``, as one segment that wakes its reader once;
    past ``_JOIN_LIMIT`` bytes as one ``writelines``, which uvloop sends with one ``writev``
    without copying them together).

    A transport closed in the meantime gets nothing; one whose write fails is aborted, and the
    other connections' writes still go out. Whoever closes a transport it wrote to through the
    outbox calls :meth:`flush` first, so that the bytes go out before the close.

    Work that need not delay the bytes (an answered request's metrics and access log) is handed to
    :meth:`then`. When the held writes go to one connection (one request in flight) it runs after
    them, so that the answer does not wait for its own book-keeping; when they go to several, before
    them, which is what they are held for: each write wakes its reader, which on a busy machine takes
    the CPU, and what is left to do here would wait for it.
    """

    __slots__ = ("after", "items", "loop", "poll")

    def __init__(self, loop: asyncio.AbstractEventLoop, poll: IdlePoll | None = None) -> None:
        self.loop = loop
        self.poll = poll  # told after each pass of writes
        # What is held for each connection, in the order it was put (connections in the order of
        # their first write).
        self.items: dict[asyncio.BaseTransport, list[bytes]] = {}
        self.after: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def write(self, transport: asyncio.BaseTransport, data: bytes) -> None:
        items = self.items
        held = items.get(transport)
        if held is not None:
            held.append(data)
            return
        if not items:
            self.loop.call_soon(self.flush)
        items[transport] = [data]

    def then(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` when the held writes go out (now, if none is held)."""
        if self.items:
            self.after.append((callback, args))
        else:
            callback(*args)

    def flush(self) -> None:
        items = self.items
        if not items:
            return
        self.items = {}
        after = self.after
        if after:
            self.after = []
            if len(items) > 1:
                self._run(after)  # several readers to wake: the work first, then the writes
                after = []
        for transport, held in items.items():
            if transport.is_closing():
                continue
            try:
                if len(held) == 1:
                    transport.write(held[0])  # type: ignore[attr-defined]
                elif sum(map(len, held)) <= _JOIN_LIMIT:
                    transport.write(b"".join(held))  # type: ignore[attr-defined]
                else:
                    transport.writelines(held)  # type: ignore[attr-defined]  # one writev, no copy
            except Exception:
                # That connection's bytes are lost: end it (its protocol hears connection_lost and
                # ends the exchange as broken) rather than leave its peer waiting; the others' bytes
                # still go out.
                log.exception("a held write failed; aborting its connection")
                transport.abort()  # type: ignore[attr-defined]
        if after:
            self._run(after)  # one reader: its bytes go out first
        if self.poll is not None:
            self.poll.wrote()

    @staticmethod
    def _run(after: list[tuple[Callable[..., object], tuple[Any, ...]]]) -> None:
        for callback, args in after:
            try:
                callback(*args)
            except Exception:
                log.exception("unhandled error after a write")


def _framing(method: str, length: int) -> bytes:
    """The length line and the blank line ending the head of a request with a ``bytes`` body."""
    if length:
        return b"content-length: %d\r\n\r\n" % length
    if method in _BODY_METHODS:
        return b"content-length: 0\r\n\r\n"
    return b"\r\n"


class Sink(Protocol):
    """Told when an exchange started with :meth:`HttpPool.send_on` moves on."""

    def pump(self) -> None: ...


def describe(exc: BaseException | None) -> str:
    if exc is None:
        return "connection closed"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Connection(asyncio.Protocol):
    """One keep-alive connection and the state of the exchange on it (one at a time)."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.counted = True  # holds one of the pool's pool_size slots
        self.lost = False
        self.lost_exc: BaseException | None = None
        self.reused = False
        self.idle_since = 0.0
        self.writing_paused = False
        self.reading_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.reset()

    def reset(self) -> None:
        self.phase = _IDLE
        self.deadline = 0.0
        self.last_data = 0.0
        self.head_request = False
        self.request_complete = True
        self.received = False
        self.status = 0
        # Header names lower-cased, values as received; hop-by-hop ones (``drop_headers``) left out.
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.framed = False
        self.keep_alive = True
        self.headers_done = False
        self.message_done = False
        self.body: list[bytes] = []
        self.buffered = 0
        self.error: errors.GatewayError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.sink: Sink | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        if self.phase in (_IDLE, _DONE):
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.keep_alive = False
            self.abort()
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            log.warning("upstream sent a malformed response: %s", describe(exc))
            self._fail(errors.UpstreamError(MID_RESPONSE))  # it answered: it was reached
            return
        if self.phase == _BODY:
            self.last_data = self.loop.time()
            if self.buffered > READ_HIGH_WATER and not self.reading_paused and self.transport is not None:
                self.reading_paused = True
                self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.lost_exc = exc
        self.keep_alive = False
        self._stop_timer()
        phase = self.phase
        if phase == _IDLE:
            self.pool._forget(self)
            return
        if phase == _BODY and self.error is None:
            if self.framed or exc is not None:
                log.warning("upstream connection failed mid-response: %s", describe(exc))
                self.error = errors.UpstreamError(MID_RESPONSE)
            else:
                self.message_done = True  # a body without length ends with the connection
                self.phase = _DONE
        elif phase == _HEADERS and self.error is None:
            # Lost before its answer's head was in: unreached if nothing came, else cut off.
            self.error = errors.UpstreamError(MID_RESPONSE if self.received else UNREACHABLE)
        self._wake()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake()

    # -- httptools callbacks -----------------------------------------------------------------

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The response headers as text (what :meth:`HttpPool.request` returns)."""
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers]

    def on_header(self, name: bytes, value: bytes) -> None:
        low = name.lower()
        if low == b"content-length":
            self.framed = True
        elif low in self.pool.drop_raw:
            if low == b"transfer-encoding" and value.lower().find(b"chunked") >= 0:
                self.framed = True
            return
        self.raw_headers.append((low, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self.status = status
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()
        if status == 204 or status == 304:
            self.framed = True
        if self.head_request:
            # llhttp would wait for the body the headers describe; a HEAD answer has none.
            self.framed = True
            self.keep_alive = False
            self.message_done = True
            self.phase = _DONE
        else:
            self.phase = _BODY

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if not self.headers_done:
            self.raw_headers = []  # the end of an interim answer
            self.framed = False
            return
        self.message_done = True
        self.phase = _DONE

    # -- the exchange ------------------------------------------------------------------------

    def begin(self, now: float, deadline: float, head_request: bool) -> None:
        self.phase = _HEADERS
        self.deadline = deadline
        self.head_request = head_request
        # The timer must fire no later than the header deadline, nor later than one stall period
        # after the body could start (now, at the earliest); it is re-armed only when it fires.
        self._arm(min(deadline, now + self.pool.stall_timeout))

    def wait(self) -> asyncio.Future[None]:
        waiter = self.loop.create_future()
        self.waiter = waiter
        return waiter

    def take_body(self) -> bytes:
        """Everything buffered since the last call, in one piece (usually one socket read)."""
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.reading_paused:
            self.resume_reading()
        return data

    def _wake(self) -> None:
        sink = self.sink
        if sink is not None:
            sink.pump()
            return
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: errors.GatewayError) -> None:
        if self.error is None:
            self.error = error
        self.keep_alive = False
        self.abort()
        self._wake()

    def abort(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            if self.transport is not None and not self.lost:
                self.transport.resume_reading()

    # -- the one timer -----------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        timer = self._timer
        if timer is not None:
            if self._timer_at <= when:
                return  # it fires early enough; it re-arms itself then
            timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._on_timer)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        phase = self.phase
        if phase in (_IDLE, _DONE) or self.lost:
            return
        now = self.loop.time()
        stall = self.pool.stall_timeout
        if phase == _HEADERS:
            if now >= self.deadline:
                read = self.pool.read_timeout
                self._fail(
                    errors.UpstreamTimeout(f"The upstream model server did not answer within {read:g}s.")
                )
            else:
                self._arm(min(self.deadline, now + stall))
            return
        if self.body or self.reading_paused:
            self.last_data = now  # the reader is behind, not the upstream
        due = self.last_data + stall
        if now >= due:
            self._fail(errors.UpstreamTimeout(f"The upstream stream stalled for more than {stall:g}s."))
        else:
            self._arm(due)


class ResponseBody:
    """The body of one response: an async iterator of the bytes as they arrive.

    Exhausting it, or closing it once the whole response has arrived, hands the connection back to
    the pool; closing it earlier closes the connection.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn

    def __aiter__(self) -> ResponseBody:
        return self

    @property
    def complete(self) -> bool:
        """Whether the whole response has arrived (closing it then hands the connection back)."""
        return self._conn is None or self._conn.message_done

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        while True:
            if conn.body:
                return conn.take_body()
            if conn.message_done:
                self._conn = None
                conn.pool._release(conn)
                raise StopAsyncIteration
            error = conn.error
            if error is not None:
                self._conn = None
                conn.pool._discard(conn)
                raise error
            try:
                await conn.wait()
            except BaseException:
                self._conn = None
                conn.pool._discard(conn)
                raise

    async def aclose(self) -> None:
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        if conn.message_done:
            conn.pool._release(conn)  # fully received: what was left unread is dropped with it
        else:
            conn.pool._discard(conn)


class HttpPool:
    """Keep-alive connections from one event loop to one base URL (``http`` or ``https``)."""

    def __init__(
        self,
        base_url: str,
        timeouts: UpstreamConfig,
        *,
        drop_headers: frozenset[str] = frozenset(),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.https = parts.scheme == "https"
        self.port = parts.port or (443 if self.https else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if parts.port is None else f"{host}:{parts.port}"
        self.prefix = parts.path.rstrip("/")
        self.ssl: ssl.SSLContext | None = None
        if self.https:
            self.ssl = ssl_context or ssl.create_default_context()
        self.connect_timeout = timeouts.connect_timeout_s
        self.read_timeout = timeouts.read_timeout_s
        self.stall_timeout = timeouts.stall_timeout_s
        self.limit = max(1, timeouts.pool_size)
        self.drop_raw = frozenset(name.lower().encode("latin-1") for name in drop_headers)
        self._heads: dict[tuple[object, ...], bytes] = {}  # see head()
        self.size = 0  # open or opening connections, idle ones included
        self.idle: list[Connection] = []
        self.waiters: deque[asyncio.Future[Connection | None]] = deque()
        self.closed = False
        self.outbox = Outbox(self.loop)  # send_on()'s writes

    # -- requests ----------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: RequestBody = None,
    ) -> tuple[int, list[tuple[str, str]], ResponseBody]:
        """Send one request; return status, headers and the body iterator once the headers arrived.

        ``target`` is the path and query below the base URL; ``headers`` are lower-cased.
        """
        now = self.loop.time()
        deadline = now + self.read_timeout
        stream: AsyncIterable[bytes] | None = None
        payload = b""
        if isinstance(body, bytes | bytearray | memoryview):
            payload = bytes(body) if not isinstance(body, bytes) else body
        elif body is not None:
            stream = body
        streamed = stream is not None
        head = self._head(method, target, headers, len(payload), streamed)
        if payload and len(payload) <= _JOIN_LIMIT:
            head, payload = head + payload, b""  # one write, one send()
        for attempt in (0, 1):
            conn = self._pop_idle(now)
            if conn is None:
                conn = await self._acquire(deadline)
            try:
                conn.begin(now, deadline, method == "HEAD")
                transport = conn.transport
                assert transport is not None
                if stream is not None:
                    await self._write_stream(conn, head, stream, "content-length" not in headers)
                else:
                    transport.write(head)
                    if payload:
                        transport.write(payload)
                while not conn.headers_done:
                    error = conn.error
                    if error is not None:
                        self._discard(conn)
                        if (
                            attempt == 0
                            and conn.reused
                            and not conn.received
                            and not streamed
                            and isinstance(error, errors.UpstreamError)
                        ):
                            # The server closed the idle connection as we sent: replay once.
                            log.debug("reused upstream connection was closed; retrying")
                            break
                        if isinstance(error, errors.UpstreamError) and not conn.headers_done:
                            log.warning("upstream %s %s failed: %s", method, target, describe(conn.lost_exc))
                        raise error
                    await conn.wait()
                else:
                    return conn.status, conn.headers, ResponseBody(conn)
            except BaseException:
                self._discard(conn)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    # -- exchanges on callbacks (gateway.relay) -----------------------------------------------

    def head(self, method: str, target: str, headers: Mapping[str, str], length: int) -> bytes:
        """The request line and headers for a ``bytes`` body of ``length``, as :meth:`request` frames them.

        ``headers`` carry no framing headers (``content-length``, ``transfer-encoding``). The lines
        before the framing are remembered per request line and headers: a client sends the same
        headers with every request, so they are built, checked and encoded once.
        """
        key = (method, target, *headers.items())
        lines = self._heads.get(key)
        if lines is None:
            lines = self._lines(method, target, headers)
            if len(self._heads) >= _HEADS_KEPT:
                self._heads.clear()
            self._heads[key] = lines
        return lines + _framing(method, length)

    def _lone(self) -> bool:
        """At most one exchange in flight (open connections less the idle ones)."""
        return self.size - len(self.idle) <= 1

    def idle_connection(self) -> Connection | None:
        """A pooled connection ready for a request now, if there is one."""
        return self._pop_idle(self.loop.time())

    async def connection(self) -> Connection:
        """A connection for one request: pooled, new, or the next one freed (read timeout)."""
        return await self._acquire(self.loop.time() + self.read_timeout)

    def send_on(self, conn: Connection, head: bytes, body: bytes, sink: Sink) -> None:
        """Write one request on ``conn`` (through the :attr:`outbox`); ``sink.pump()`` is called as
        its response moves on.

        The sink reads ``conn``'s state as :class:`ResponseBody` does and ends the exchange with
        :meth:`release` (the response arrived in full) or :meth:`discard`.
        """
        now = self.loop.time()
        conn.begin(now, now + self.read_timeout, False)
        conn.sink = sink
        transport = conn.transport
        assert transport is not None
        if len(body) <= _JOIN_LIMIT:
            self.outbox.write(transport, head + body)  # one write, one send()
        else:
            self.outbox.write(transport, head)
            self.outbox.write(transport, body)

    def release(self, conn: Connection) -> None:
        """Hand ``conn`` back after an exchange (it is closed unless it can be reused)."""
        conn.sink = None
        self._release(conn)

    def discard(self, conn: Connection) -> None:
        """Close ``conn`` for good (an exchange abandoned or failed)."""
        conn.sink = None
        self._discard(conn)

    def _head(
        self, method: str, target: str, headers: Mapping[str, str], length: int, streamed: bool
    ) -> bytes:
        if streamed:
            framing = b"" if "content-length" in headers else b"transfer-encoding: chunked\r\n"
            return self._lines(method, target, headers) + framing + b"\r\n"
        if "content-length" in headers or "transfer-encoding" in headers:
            headers = {k: v for k, v in headers.items() if k not in ("content-length", "transfer-encoding")}
        return self._lines(method, target, headers) + _framing(method, length)

    def _lines(self, method: str, target: str, headers: Mapping[str, str]) -> bytes:
        """The request line, ``host`` and ``headers``, each line ended (no blank line yet)."""
        lines = [f"{k}: {v}\r\n" for k, v in headers.items()]
        text = f"{method} {self.prefix}{target} HTTP/1.1\r\nhost: {self.host_header}\r\n{''.join(lines)}"
        # A line break inside a name or value would let a caller smuggle a second request.
        breaks = len(lines) + 2
        if text.count("\n") != breaks or text.count("\r") != breaks:
            raise errors.BadRequest("A request header contains a line break.")
        try:
            return text.encode("latin-1")
        except UnicodeEncodeError:
            return text.encode()

    async def _write_stream(
        self, conn: Connection, head: bytes, body: AsyncIterable[bytes], chunked: bool
    ) -> None:
        """Stream a request body as it is produced, waiting while the socket's buffer is full."""
        transport = conn.transport
        assert transport is not None
        transport.write(head)
        try:
            async for chunk in body:
                if conn.lost or conn.headers_done or conn.error is not None:
                    # The upstream answered (or failed) before the body was done: this request's
                    # framing is incomplete, so the connection cannot be reused.
                    conn.request_complete = False
                    return
                if not chunk:
                    continue
                if chunked:
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                else:
                    transport.write(chunk)
                while conn.writing_paused and not (conn.lost or conn.headers_done or conn.error is not None):
                    await conn.wait()
        except (errors.GatewayError, asyncio.CancelledError):
            raise
        except Exception as exc:
            # The body's producer failed (the client went away mid-upload, or was cut off).
            log.info("request body to the upstream ended early: %s", describe(exc))
            raise errors.UpstreamError(UNREACHABLE) from None
        if chunked and not conn.lost:
            transport.write(b"0\r\n\r\n")

    # -- the pool ----------------------------------------------------------------------------

    def _pop_idle(self, now: float) -> Connection | None:
        """The most recently used idle connection that is still open, if any."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if now - conn.idle_since > IDLE_REUSE_S:
                # The rest of the stack is older still.
                stale, self.idle = [conn, *idle], []
                for old in stale:
                    self._discard(old)
                return None
            transport = conn.transport
            if conn.lost or transport is None or transport.is_closing():
                self._discard(conn)
                continue
            conn.reused = True
            return conn
        return None

    async def _acquire(self, deadline: float) -> Connection:
        while True:
            conn = self._pop_idle(self.loop.time())
            if conn is not None:
                return conn
            if self.closed:
                raise errors.UpstreamError(UNREACHABLE)
            if self.size < self.limit:
                self.size += 1
                return await self._connect()
            handed = await self._wait_turn(deadline)
            if handed is None:
                return await self._connect()  # a freed slot, already counted for us
            if not handed.lost:
                handed.reused = True
                return handed
            # It closed on the way to us; connection_lost already gave its slot back.

    async def _wait_turn(self, deadline: float) -> Connection | None:
        waiter: asyncio.Future[Connection | None] = self.loop.create_future()
        self.waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                handed = waiter.result()  # handed to us as we gave up: pass it on
                if handed is None:
                    self._free_slot()
                else:
                    self._release(handed)
            else:
                waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise errors.UpstreamTimeout(
                    f"The upstream model server did not answer within {self.read_timeout:g}s."
                ) from None
            raise

    async def _connect(self) -> Connection:
        conn = Connection(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, _ = await self.loop.create_connection(
                    lambda: conn,
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl is not None else None,
                )
        except TimeoutError:
            self._discard(conn)
            raise errors.UpstreamTimeout(
                f"Could not connect to the upstream model server within {self.connect_timeout:g}s."
            ) from None
        except OSError as exc:
            self._discard(conn)
            # The detail (host, port, OS error) goes to the log, not to the client.
            log.warning("upstream %s:%s unreachable: %s", self.host, self.port, describe(exc))
            raise errors.UpstreamError(UNREACHABLE) from None
        except BaseException:
            self._discard(conn)
            raise
        # uvloop may call connection_made only after create_connection returned.
        conn.transport = transport
        return conn

    def _hand_over(self, conn: Connection | None) -> bool:
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def _free_slot(self) -> None:
        if not self._hand_over(None):
            self.size -= 1

    def _release(self, conn: Connection) -> None:
        """Pool ``conn`` again if its exchange ended cleanly, else close it."""
        if (
            not conn.keep_alive
            or conn.lost
            or not conn.message_done
            or not conn.request_complete
            or conn.reading_paused
            or self.closed
        ):
            self._discard(conn)
            return
        conn.reset()
        if not self._hand_over(conn):
            conn.idle_since = self.loop.time()
            self.idle.append(conn)

    def _discard(self, conn: Connection) -> None:
        """Close ``conn`` for good and give its slot to the next waiter."""
        if not conn.lost:
            conn.abort()
        conn._stop_timer()
        if conn.counted:
            conn.counted = False
            self._free_slot()

    def _forget(self, conn: Connection) -> None:
        """An idle connection the server closed."""
        try:
            self.idle.remove(conn)
        except ValueError:
            pass  # on its way to a waiter, which sees it is lost
        if conn.counted:
            conn.counted = False
            self._free_slot()

    def close(self) -> None:
        """Close the idle connections; the busy ones close when their responses are done."""
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            self._discard(conn)
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(errors.UpstreamError(UNREACHABLE))
