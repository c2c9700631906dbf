"""Pass-through requests served straight from the server protocol, without the ASGI round trip.

Under ``manage.py serve`` (uvicorn with :class:`gateway.server.GatewayHttpProtocol`) a ``POST`` to a
pass-through route with a body of known size — a chat completion, completion, embedding or
Anthropic message — is relayed here: the request body is taken from uvicorn's request cycle, the
upstream's answer is written to the socket as raw HTTP, and none of the ASGI plumbing runs (scope
messages, the ``send``/``receive`` wrappers of each layer, uvicorn's header re-validation). For a
small JSON exchange that plumbing cost more CPU than everything else the gateway does
(``docs/performance.md``).

Every rule is the one the ASGI path applies, through the same functions: the request id and the
body ceiling (as ``GatewayASGIMiddleware``), authentication and CORS (as ``gateway.fastpath``),
header forwarding, credential injection, upstream errors in the route's envelope and a broken event
stream ended with the route's error event (as ``gateway.passthrough.relay``), metrics and the access
log. Audio uploads (streamed request bodies), ``Expect: 100-continue``, other methods and CORS
preflights take the ASGI path, as does every request under daphne or another server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from gateway import errors
from gateway.auth import authenticate, authenticate_now
from gateway.config import get_config
from gateway.fastpath import cors_headers
from gateway.ids import request_id_for
from gateway.logging import request_id_var
from gateway.metrics import HTTP_IN_FLIGHT
from gateway.middleware import READ_TIMED_OUT, record_request
from gateway.passthrough import SSE_CONTENT_TYPE, DisconnectWatch, RawHeaders, Route
from inference_app.http_client import HttpPool, describe
from inference_app.upstream import HttpUpstream, UpstreamResponse, forward_headers, get_upstream

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    from gateway.auth import AuthResult
    from gateway.server import GatewayServerProtocol
    from inference_app.http_client import _Connection

log = logging.getLogger("gateway")

_LAST_CHUNK = b"0\r\n\r\n"


def eligible(scope: dict[str, Any], route: Route | None) -> bool:
    """Whether this request can be served directly (else it takes the ASGI path)."""
    if route is None or route.stream_request_body or scope["method"] != "POST":
        return False
    if route.divert is not None:
        return False  # its body decides where it goes: the ASGI path reads it (see Relay._to_asgi)
    return all(name != b"expect" for name, _ in scope["headers"])


class _ClientGone(Exception):
    """The client disconnected: nothing more can be written."""


class _Response:
    """Writes one HTTP/1.1 response to the cycle's transport and completes the cycle."""

    __slots__ = ("chunked", "cycle", "extra", "finished", "protocol", "request_id", "status")

    def __init__(self, protocol: HttpToolsProtocol, cycle: RequestResponseCycle, request_id: str) -> None:
        self.protocol = protocol
        self.cycle = cycle
        self.request_id = request_id.encode("latin-1")
        self.status = 0
        self.chunked = False
        self.finished = False
        self.extra: RawHeaders = []

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        cycle = self.cycle
        self.status = status
        cycle.response_started = True
        lines = [STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status]
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

    async def _write(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle.disconnected:
            raise _ClientGone
        flow = self.protocol.flow
        if flow.write_paused:
            await flow.drain()
            if cycle.disconnected:
                raise _ClientGone
        cycle.transport.write(data)

    def _complete(self) -> None:
        cycle = self.cycle
        self.finished = True
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self._close()
        cycle.on_response()

    def _close(self) -> None:
        self.cycle.transport.close()

    def error_bytes(self, exc: errors.GatewayError, path: str) -> bytes:
        """The whole answer for ``exc`` in the envelope of ``path`` (nothing sent yet)."""
        status, body, headers = errors.render(exc, path, self.request_id.decode("latin-1"))
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", b"%d" % len(body)))
        if any(k == b"connection" and v.lower() == b"close" for k, v in raw):
            self.cycle.keep_alive = False
            raw = [(k, v) for k, v in raw if k != b"connection"]  # _head writes it once
        return self._head(status, raw) + body

    async def error(self, exc: errors.GatewayError, path: str) -> None:
        """Answer with ``exc`` in the envelope of ``path`` (nothing sent yet)."""
        await self._write(self.error_bytes(exc, path))
        self._complete()

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

    async def relay(self, response: UpstreamResponse, route: Route) -> None:
        """The upstream's status, headers and body, as they arrive."""
        head = self.begin(
            response.status, [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        )
        pending: bytes | None = head  # a sized response's head waits to go out with its body
        if self.chunked:
            await self._write(head)  # a stream's headers go out at once
            pending = None
        try:
            async for chunk in response:
                if not chunk:
                    continue
                if self.chunked:
                    await self._write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                elif pending is not None:
                    await self._write(pending + chunk)
                    pending = None
                else:
                    await self._write(chunk)
        except errors.GatewayError as exc:
            if pending is not None:  # nothing sent yet: the error can still be the answer
                self._unbegin()
                await self.error(exc, self.cycle.scope["path"])
                return
            if response.content_type != SSE_CONTENT_TYPE or not self.chunked:
                self.cycle.transport.close()  # a sized body cannot carry an error: drop it
                return
            event = route.stream_error(exc)
            await self._write(b"%x\r\n%b\r\n%b" % (len(event), event, _LAST_CHUNK))
            self._complete()
            return
        if pending is not None:
            await self._write(pending)  # an empty sized body
        elif self.chunked:
            await self._write(_LAST_CHUNK)
        self._complete()


async def serve(protocol: HttpToolsProtocol, cycle: RequestResponseCycle, route: Route) -> None:
    """Serve one eligible request on ``cycle`` (the task uvicorn would have run the app in)."""
    scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]  # we add the gateway's keys
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    rid = request_id_for(headers.get("x-request-id"))
    scope["gateway.request_id"] = rid
    token = request_id_var.set(rid)
    started = time.perf_counter()
    out = _Response(protocol, cycle, rid)
    HTTP_IN_FLIGHT.inc()
    try:
        await _serve(protocol, cycle, route, headers, out)
    except _ClientGone:
        pass
    except Exception:
        log.exception("unhandled error on %s", scope["path"])
        if not cycle.response_started and not cycle.disconnected:
            await out.error(
                errors.ServerError("The server had an error while processing your request."), scope["path"]
            )
        elif not out.finished:
            cycle.transport.close()
    finally:
        HTTP_IN_FLIGHT.dec()
        path = scope["path"]
        status = out.status if out.finished else 499  # not answered in full: the client went away
        record_request("POST", path, path, status, time.perf_counter() - started, rid)
        request_id_var.reset(token)


async def _read_body(protocol: HttpToolsProtocol, cycle: RequestResponseCycle, limit: int) -> bytes | None:
    """The whole request body; None when the client left or it passed ``limit`` (answered 413)."""
    while True:
        if cycle.disconnected:
            return None
        if len(cycle.body) > limit:
            return None
        if not cycle.more_body:
            body = bytes(cycle.body)
            cycle.body = bytearray()
            return body
        refusal = cycle.scope.get(READ_TIMED_OUT)  # type: ignore[attr-defined]
        if isinstance(refusal, errors.GatewayError):
            raise refusal
        protocol.flow.resume_reading()
        await cycle.message_event.wait()
        cycle.message_event.clear()


async def _serve(
    protocol: HttpToolsProtocol,
    cycle: RequestResponseCycle,
    route: Route,
    headers: dict[str, str],
    out: _Response,
) -> None:
    scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
    path = scope["path"]
    config = get_config()
    limit = config.server.max_request_body_size_bytes
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await out.error(errors.payload_too_large(limit), path)
        return
    origin = headers.get("origin")
    out.extra = cors_headers(scope, origin.encode("latin-1") if origin is not None else None)
    try:
        auth = await authenticate(path, headers)
    except (errors.AuthenticationFailed, errors.ServiceUnavailable) as exc:
        await out.error(exc, path)
        return
    scope["principal"] = auth.principal
    try:
        body = await _read_body(protocol, cycle, limit)
    except errors.RequestTimeout as exc:
        await out.error(exc, path)
        return
    if body is None:
        if not cycle.disconnected:
            out.extra = []  # as GatewayASGIMiddleware refuses it, below the CORS layer
            await out.error(errors.payload_too_large(limit), path)
        return
    forwarded = forward_headers(headers, config, caller_credential_consumed=auth.credential_consumed)

    async def client_left() -> None:
        while not cycle.disconnected:
            await cycle.message_event.wait()
            cycle.message_event.clear()

    response: UpstreamResponse | None = None
    try:
        with DisconnectWatch(client_left, lambda: out.finished):
            query = scope["query_string"].decode("latin-1")
            try:
                response = await get_upstream().send(
                    "POST", route.upstream_path, body=body, headers=forwarded, query=query
                )
            except errors.GatewayError as exc:
                await out.error(exc, path)
                return
            await out.relay(response, route)
    finally:
        if response is not None:
            await response.aclose()


# -- the same relay on callbacks -------------------------------------------------------------------


def start(protocol: GatewayServerProtocol, cycle: RequestResponseCycle, route: Route) -> bool:
    """Relay this request on callbacks (:class:`Relay`); False: :func:`eligible` decides the rest.

    Called when the request's headers are parsed. :func:`serve` takes what the relay cannot: a
    request body without a declared length (chunked) and upstreams that are not HTTP (the embedded
    engine, the Celery workers). Requests that neither takes (other methods, ``Expect``, streamed
    uploads) go to the ASGI app.
    """
    scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
    if scope["method"] != "POST" or route.stream_request_body:
        return False
    upstream = get_upstream()
    if not isinstance(upstream, HttpUpstream):
        return False
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}  # lower-cased
    declared = headers.get("content-length")
    if declared is None or not declared.isdigit() or "transfer-encoding" in headers or "expect" in headers:
        return False
    relay = Relay(protocol, cycle, route, headers, upstream.pool(protocol.loop))
    protocol.relay = relay
    relay.admit(headers, int(declared))
    if not cycle.more_body and not relay.over:
        relay.body_complete()  # a pipelined request, parsed in full while the one before it ran
    return True


class Relay(_Response):
    """One pass-through request relayed on callbacks: no coroutine per request, no future.

    The same exchange as :func:`serve`, with the same rules through the same functions, driven by
    the events themselves. The protocol calls :meth:`body_complete` when the request body is in;
    the request goes out on an idle pooled connection and the upstream connection calls :meth:`pump`
    whenever its response moves on, which writes what arrived to the client. Only what has to wait
    runs in a short task: authentication that needs I/O (OIDC, a key snapshot to reload) and opening
    a new upstream connection. The protocol calls :meth:`pump` again when a slow client's socket
    drains (while it is full the upstream's bytes stay buffered in the connection, which stops
    reading the upstream past its high-water mark), and :meth:`client_gone` when the client
    disconnects, which closes the upstream connection at once. For a small JSON exchange this costs
    a fraction of a task's CPU (``docs/performance.md``).

    Its writes, to the client and (``HttpPool.send_on``) to the upstream, go through the pool's
    :class:`~inference_app.http_client.Outbox`: out once the loop has run every ready callback.
    """

    __slots__ = (
        "attempt",
        "body",
        "body_in",
        "conn",
        "forwarded",
        "head",
        "over",
        "path",
        "pending",
        "pool",
        "rid",
        "route",
        "started",
        "target",
        "task",
    )

    def __init__(
        self,
        protocol: GatewayServerProtocol,
        cycle: RequestResponseCycle,
        route: Route,
        headers: dict[str, str],
        pool: HttpPool,
    ) -> None:
        scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
        rid = request_id_for(headers.get("x-request-id"))
        scope["gateway.request_id"] = rid
        self.started = time.perf_counter()
        self.route = route
        self.pool = pool
        self.path: str = scope["path"]
        query = scope["query_string"]
        self.target = route.upstream_path + ("?" + query.decode("latin-1") if query else "")
        _Response.__init__(self, protocol, cycle, rid)
        self.rid = rid
        self.forwarded: dict[str, str] | None = None  # set once the caller is authenticated
        self.conn: _Connection | None = None
        self.task: asyncio.Task[None] | None = None
        self.attempt = 0
        self.body = self.head = b""
        self.body_in = False
        self.pending: bytes | None = None  # a sized response's head, written with its first bytes
        self.over = False
        HTTP_IN_FLIGHT.inc()

    # -- the request ---------------------------------------------------------------------------

    def admit(self, headers: dict[str, str], declared: int) -> None:
        """The headers are in: the body ceiling, CORS and authentication, as :func:`_serve` does."""
        if declared > get_config().server.max_request_body_size_bytes:
            self._error(errors.payload_too_large(get_config().server.max_request_body_size_bytes))
            return
        scope: dict[str, Any] = self.cycle.scope  # type: ignore[assignment]
        origin = headers.get("origin")
        self.extra = cors_headers(scope, origin.encode("latin-1") if origin is not None else None)
        try:
            auth = authenticate_now(self.path, headers)
        except (errors.AuthenticationFailed, errors.ServiceUnavailable) as exc:
            self._error(exc)
            return
        if auth is None:
            self._spawn(self._authenticate(headers))
            return
        self._authenticated(headers, auth)

    async def _authenticate(self, headers: dict[str, str]) -> None:
        try:
            auth = await authenticate(self.path, headers)
        except (errors.AuthenticationFailed, errors.ServiceUnavailable) as exc:
            self._error(exc)
            return
        self._authenticated(headers, auth)

    def _authenticated(self, headers: dict[str, str], auth: AuthResult) -> None:
        self.cycle.scope["principal"] = auth.principal  # type: ignore[typeddict-unknown-key]
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
            self._send_body()

    def _to_asgi(self) -> None:
        """The body says the ASGI app serves this request (``Route.divert``, the Messages server-tool
        loop): the relay steps aside without answering and the protocol hands it over."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()  # authentication still in flight: the ASGI path authenticates again
        self.over = True
        protocol: Any = self.protocol
        if protocol.relay is self:
            protocol.relay = None
        HTTP_IN_FLIGHT.dec()  # the ASGI path counts the request from here on
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
        """Run a step that has to wait; the relay goes on on callbacks once it is done."""
        task = self.task = self.protocol.loop.create_task(self._step(step))
        tasks = self.protocol.tasks  # uvicorn's shutdown waits for these
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _step(self, step: Coroutine[Any, Any, None]) -> None:
        try:
            await step
        except Exception:
            self._unexpected()
        finally:
            self.task = None

    # -- the response ----------------------------------------------------------------------------

    def pump(self) -> None:
        """Write whatever the upstream connection has for the client now."""
        try:
            self._pump()
        except Exception:
            self._unexpected()

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
                self._put(b"%x\r\n%b\r\n" % (len(data), data))
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
                self._put(_LAST_CHUNK)
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
            self._put(b"%x\r\n%b\r\n%b" % (len(event), event, _LAST_CHUNK))
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
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
        self._error(exc)

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
            self._error(errors.ServerError("The server had an error while processing your request."))

    # -- the client ------------------------------------------------------------------------------

    def client_gone(self) -> None:
        """The client disconnected: drop the upstream request at once."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.discard(conn)
        self._done(False)

    def _done(self, answered: bool) -> None:
        """The exchange is over: metrics, the access log, and (answered) the cycle completed."""
        if self.over:
            return
        self.over = True
        protocol: Any = self.protocol
        if protocol.relay is self:
            protocol.relay = None  # before completing: that may start a pipelined request's relay
        HTTP_IN_FLIGHT.dec()
        status = self.status if answered else 499
        record_request("POST", self.path, self.path, status, time.perf_counter() - self.started, self.rid)
        if answered:
            self._complete()


def _content_type(headers: RawHeaders) -> str:
    for name, value in headers:
        if name == b"content-type":
            return value.split(b";")[0].strip().lower().decode("latin-1")
    return ""
