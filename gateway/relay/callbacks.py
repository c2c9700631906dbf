"""The callback relay: a pass-through request relayed from the server protocol, with no ASGI round
trip and no coroutine per request.

Under ``manage.py serve`` (uvicorn with :class:`gateway.relay.protocol.GatewayServerProtocol`) a
``POST`` to a pass-through route (:data:`gateway.fastroutes.RELAYED`) with a body of declared size, to
an HTTP upstream, is relayed here: the request body is taken from the protocol's parser callbacks,
the request goes out on the upstream pool's connection (:mod:`gateway.relay.http_client`) and the
upstream's answer is written to the socket as raw HTTP as it arrives. None of the ASGI plumbing runs
(scope messages, the ``send``/``receive`` wrappers of each layer, uvicorn's header re-validation);
for a small JSON exchange that plumbing cost more CPU than everything else the gateway does
(``docs/performance.md``).

:func:`start` is the one decision point of which requests the relay takes; everything else (a
chunked or streamed request body, ``Expect: 100-continue``, other methods, an upstream that is not
HTTP: the embedded engine, the Celery workers) goes to the ASGI fast path (``gateway.fastpath``).

The rules are the pipeline's (``gateway.pipeline``): :class:`~gateway.pipeline.Passage` (request id,
log context, body ceiling), :func:`~gateway.pipeline.admit` (CORS, authentication, method) and
:func:`~gateway.pipeline.finish` (metrics, in-flight, access log, 499); header forwarding and
credential injection are ``forward_headers`` (``inference_app.upstream``'s, through
``gateway.passthrough``: the relay imports no app), upstream errors are answered
in the route's envelope (``gateway.errors``) and a broken event stream ends with the route's error
event (``Route.stream_error``), as on the ASGI path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from gateway import errors
from gateway.auth import AuthResult
from gateway.config import get_config
from gateway.logging import request_id_var
from gateway.passthrough import SSE_CONTENT_TYPE, RawHeaders, Route, forward_headers, upstream_pool
from gateway.pipeline import Passage, admit, admit_waiting, finish, release
from gateway.relay.framing import LAST_CHUNK, chunk, status_line
from gateway.relay.http_client import Connection, HttpPool, describe

log = logging.getLogger("gateway")

# Each step of a relay runs in its request's log context (Passage.enter, inlined: pump runs per chunk).
_enter = request_id_var.set
_leave = request_id_var.reset


class Flow(Protocol):
    write_paused: bool


class Host(Protocol):
    """What the relay needs of the server protocol it runs on (``GatewayServerProtocol``)."""

    loop: asyncio.AbstractEventLoop
    tasks: set[asyncio.Task[None]]
    flow: Flow
    relay: Relay | None

    def serve_asgi(self, cycle: Any, body: bytes) -> None: ...


def start(protocol: Host, cycle: Any, route: Route) -> bool:
    """Relay this request on callbacks; False: it goes to the ASGI fast path.

    Called when the request's headers are parsed (``cycle.scope`` holds the method, path, query
    string and raw headers). This is the one place that decides which requests the relay takes.
    """
    scope: dict[str, Any] = cycle.scope
    if scope["method"] != "POST" or route.stream_request_body:
        return False
    pool = upstream_pool(protocol.loop)
    if not isinstance(pool, HttpPool):  # None: not an HTTP upstream
        return False
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}  # lower-cased
    declared = headers.get("content-length")
    if declared is None or not declared.isdigit() or "transfer-encoding" in headers or "expect" in headers:
        return False
    relay = Relay(protocol, cycle, route, headers, pool)
    protocol.relay = relay
    relay.admit(headers)
    if not cycle.more_body and not relay.over:
        relay.body_complete()  # a pipelined request, parsed in full while the one before it ran
    return True


class Relay:
    """One pass-through request relayed on callbacks: no coroutine per request, no future.

    The protocol calls :meth:`body_complete` when the request body is in; the request goes out on an
    idle pooled connection and the upstream connection calls :meth:`pump` whenever its response
    moves on, which writes what arrived to the client. Only what has to wait runs in a short task:
    authentication that needs I/O (OIDC, a key snapshot to reload) and opening a new upstream
    connection. The protocol calls :meth:`pump` again when a slow client's socket drains (while it
    is full the upstream's bytes stay buffered in the connection, which stops reading the upstream
    past its high-water mark), and :meth:`client_gone` when the client disconnects, which closes the
    upstream connection at once. Each of these steps runs in the request's log context.

    Its writes, to the client and (``HttpPool.send_on``) to the upstream, go through the pool's
    :class:`~gateway.relay.http_client.Outbox`: out once the loop has run every ready callback.
    """

    __slots__ = (
        "attempt",
        "body",
        "body_in",
        "chunked",
        "conn",
        "cycle",
        "extra",
        "finished",
        "forwarded",
        "head",
        "over",
        "passage",
        "path",
        "pending",
        "pool",
        "protocol",
        "request_id",
        "rid",
        "route",
        "status",
        "target",
        "task",
    )

    def __init__(
        self,
        protocol: Host,
        cycle: Any,
        route: Route,
        headers: dict[str, str],
        pool: HttpPool,
    ) -> None:
        scope: dict[str, Any] = cycle.scope
        self.path: str = scope["path"]
        passage = self.passage = Passage(
            "POST", self.path, headers.get("x-request-id"), headers.get("content-length"), log_context=False
        )
        self.rid = rid = passage.request_id
        scope["gateway.request_id"] = rid
        self.protocol = protocol
        self.cycle = cycle
        self.request_id = rid.encode("latin-1")
        self.status = 0
        self.chunked = False
        self.finished = False
        self.extra: RawHeaders = []
        self.route = route
        self.pool = pool
        query = scope["query_string"]
        self.target = route.upstream_path + ("?" + query.decode("latin-1") if query else "")
        self.forwarded: dict[str, str] | None = None  # set once the caller is admitted
        self.conn: Connection | None = None
        self.task: asyncio.Task[None] | None = None
        self.attempt = 0
        self.body = self.head = b""
        self.body_in = False
        self.pending: bytes | None = None  # a sized response's head, written with its first bytes
        self.over = False

    # -- the request ---------------------------------------------------------------------------

    def admit(self, headers: dict[str, str]) -> None:
        """The headers are in: the pipeline's admission (body ceiling, CORS, auth, method)."""
        token = _enter(self.rid)
        try:
            passage = self.passage
            if passage.refusal is not None:
                self._error(passage.refusal)
                return
            try:
                auth = admit(passage, headers, self.route.methods)
            except errors.GatewayError as exc:
                self.extra = passage.cors
                self._error(exc)
                return
            self.extra = passage.cors
            if auth is None:
                self._spawn(self._admit_waiting(headers))
                return
            self._admitted(headers, auth)
        except Exception:
            self._unexpected()  # not raised into the parser: that would answer the client 400
        finally:
            _leave(token)

    async def _admit_waiting(self, headers: dict[str, str]) -> None:
        try:
            auth = await admit_waiting(self.passage, headers, self.route.methods)
        except errors.GatewayError as exc:
            self._error(exc)
            return
        self._admitted(headers, auth)

    def _admitted(self, headers: dict[str, str], auth: AuthResult) -> None:
        self.cycle.scope["principal"] = auth.principal
        self.forwarded = forward_headers(
            headers, get_config(), caller_credential_consumed=auth.credential_consumed
        )
        if self.body_in:
            self._send_body()

    def body_complete(self) -> None:
        """The request body is in (the protocol's ``on_message_complete``)."""
        cycle = self.cycle
        self.body = bytes(cycle.body)
        cycle.body = bytearray()
        self.body_in = True
        divert = self.route.divert
        if divert is not None and divert(self.body):
            self._to_asgi()
            return
        if self.forwarded is not None:
            token = _enter(self.rid)
            try:
                self._send_body()
            except Exception:
                self._unexpected()
            finally:
                _leave(token)

    def _to_asgi(self) -> None:
        """The body says the ASGI app serves this request (``Route.divert``, the Messages server-tool
        loop): the relay steps aside unanswered and the protocol hands the request over; the ASGI
        path admits and finishes it."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()  # admission still waiting: the ASGI path admits the request again
        self.over = True
        protocol = self.protocol
        if protocol.relay is self:
            protocol.relay = None
        release(self.passage)
        protocol.serve_asgi(self.cycle, self.body)

    def _send_body(self) -> None:
        assert self.forwarded is not None
        try:
            self.head = self.pool.head("POST", self.target, self.forwarded, len(self.body))
        except errors.GatewayError as exc:
            self._error(exc)
            return
        self._send()

    def _send(self) -> None:
        conn = self.pool.idle_connection()
        if conn is None:
            self._spawn(self._connect())
            return
        self.conn = conn
        self.pool.send_on(conn, self.head, self.body, self)

    async def _connect(self) -> None:
        try:
            conn = await self.pool.connection()
        except errors.GatewayError as exc:
            self._error(exc)
            return
        self.conn = conn
        self.pool.send_on(conn, self.head, self.body, self)

    def _spawn(self, step: Coroutine[Any, Any, None]) -> None:
        """Run a step that has to wait (in the request's log context, the caller's); the relay goes
        on on callbacks once it is done."""
        task = self.task = self.protocol.loop.create_task(self._step(step))
        tasks = self.protocol.tasks  # uvicorn's shutdown waits for these
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        # A task cancelled before it first ran (the connection closed) never awaited ``step``:
        # closing it is a no-op once it ran, and spares the "never awaited" warning otherwise.
        task.add_done_callback(lambda _task: step.close())

    async def _step(self, step: Coroutine[Any, Any, None]) -> None:
        try:
            await step
        except Exception:
            self._unexpected()
        finally:
            # Unless this step started the next one (an admission that waited, then the connect).
            if self.task is asyncio.current_task():
                self.task = None

    # -- writing the answer ----------------------------------------------------------------------

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        cycle = self.cycle
        self.status = status
        cycle.response_started = True
        lines = [status_line(status)]
        for name, value in cycle.default_headers:
            lines += (name, b": ", value, b"\r\n")
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        for name, value in self.extra:
            lines += (name, b": ", value, b"\r\n")
        lines.append(b"x-request-id: " + self.request_id + b"\r\n")
        if not cycle.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def _complete(self) -> None:
        cycle = self.cycle
        self.finished = True
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self._close()
        cycle.on_response()

    def error_bytes(self, exc: errors.GatewayError, path: str) -> bytes:
        """The whole answer for ``exc`` in the envelope of ``path`` (nothing sent yet)."""
        status, body, headers = errors.render(exc, path, self.rid)
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", b"%d" % len(body)))
        if any(k == b"connection" and v.lower() == b"close" for k, v in raw):
            self.cycle.keep_alive = False
            raw = [(k, v) for k, v in raw if k != b"connection"]  # _head writes it once
        return self._head(status, raw) + body

    def _unbegin(self) -> None:
        """Forget a head that was built but never sent (a sized answer's, held for its body)."""
        self.status = 0
        self.chunked = False
        self.cycle.response_started = False

    def begin(self, status: int, headers: RawHeaders) -> bytes:
        """The head for the upstream's status and (lower-cased) headers; a body without a length is
        chunked."""
        if status not in (204, 304) and all(name != b"content-length" for name, _ in headers):
            self.chunked = True
            headers = [*headers, (b"transfer-encoding", b"chunked")]
        return self._head(status, headers)

    # -- the response ----------------------------------------------------------------------------

    def pump(self) -> None:
        """Write whatever the upstream connection has for the client now."""
        token = _enter(self.rid)
        try:
            self._pump()
        except Exception:
            self._unexpected()
        finally:
            _leave(token)

    def _pump(self) -> None:
        conn = self.conn
        if conn is None:
            return
        pool = self.pool
        if not self.status:
            if not conn.headers_done:
                error = conn.error
                if error is None:
                    return
                self.conn = None
                pool.discard(conn)
                if (
                    self.attempt == 0
                    and conn.reused
                    and not conn.received
                    and isinstance(error, errors.UpstreamError)
                ):
                    # The server closed the idle connection as we sent: replay once, as request() does.
                    self.attempt = 1
                    self._send()
                    return
                if isinstance(error, errors.UpstreamError):
                    log.warning("upstream POST %s failed: %s", self.target, describe(conn.lost_exc))
                self._error(error)
                return
            head = self.begin(conn.status, conn.raw_headers)
            if self.chunked:
                self._put(head)  # a stream's headers go out at once
            else:
                self.pending = head
        if self.protocol.flow.write_paused or self.cycle.disconnected:
            return  # resume_writing() pumps again; the upstream's bytes wait in the connection
        if conn.body:
            data = conn.take_body()
            if self.chunked:
                self._put(chunk(data))
            elif self.pending is not None:
                self._put(self.pending + data)
                self.pending = None
            else:
                self._put(data)
        if conn.message_done:
            self.conn = None
            pool.release(conn)
            if self.pending is not None:
                self._put(self.pending)  # an empty sized body
            elif self.chunked:
                self._put(LAST_CHUNK)
            self._done(True)
        elif conn.error is not None:
            self.conn = None
            error = conn.error
            pool.discard(conn)
            if self.pending is not None:  # nothing sent yet: the error can still be the answer
                self.pending = None
                self._unbegin()
                self._error(error)
                return
            if not self.chunked or _content_type(conn.raw_headers) != SSE_CONTENT_TYPE:
                self._close()  # a sized body cannot carry an error: drop it
                self._done(False)
                return
            event = self.route.stream_error(error)
            self._put(chunk(event, last=True))
            self._done(True)

    def _put(self, data: bytes) -> None:
        if not self.cycle.disconnected:
            self.pool.outbox.write(self.cycle.transport, data)

    def _close(self) -> None:
        self.pool.outbox.flush()  # what was put for the client goes out before the close
        self.cycle.transport.close()

    def _error(self, exc: errors.GatewayError) -> None:
        """Answer with ``exc`` in the route's envelope (nothing was sent yet)."""
        if self.over:
            return
        if self.cycle.disconnected or self.status:
            if self.status:
                self._close()  # an answer has begun: it cannot become an error
            self._done(False)
            return
        self._put(self.error_bytes(exc, self.path))
        self._done(True)

    def refuse(self, exc: errors.GatewayError) -> None:
        """The protocol refuses the request (its body came too late): answer ``exc`` if nothing
        was sent yet, else drop it."""
        token = _enter(self.rid)
        try:
            task, self.task = self.task, None
            if task is not None:
                task.cancel()
            self._error(exc)
        finally:
            _leave(token)

    def _unexpected(self) -> None:
        """A bug: log it, and answer 500 if nothing was sent yet, else cut the response off."""
        log.exception("unhandled error on %s", self.path)
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.discard(conn)
        if self.over:
            return
        if self.status or self.cycle.disconnected:
            self._close()
            self._done(False)
        else:
            self._error(errors.server_error())

    # -- the client ------------------------------------------------------------------------------

    def client_gone(self) -> None:
        """The client disconnected: drop the upstream request at once."""
        token = _enter(self.rid)
        try:
            task, self.task = self.task, None
            if task is not None:
                task.cancel()
            conn, self.conn = self.conn, None
            if conn is not None:
                self.pool.discard(conn)
            self._done(False)
        finally:
            _leave(token)

    def _done(self, answered: bool) -> None:
        """The exchange is over: metrics, the access log, and (answered) the cycle completed."""
        if self.over:
            return
        self.over = True
        protocol = self.protocol
        if protocol.relay is self:
            protocol.relay = None  # before completing: that may start a pipelined request's relay
        if answered:
            # Metrics and the access log once the answer is written: not between it and its client.
            self.pool.outbox.then(finish, self.passage, self.status, self.path)
            self._complete()
        else:
            finish(self.passage, 0, self.path)


def _content_type(headers: RawHeaders) -> str:
    for name, value in headers:
        if name == b"content-type":
            return value.split(b";")[0].strip().lower().decode("latin-1")
    return ""
