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

import logging
import time
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from gateway import errors
from gateway.config import get_config
from gateway.fastpath import cors_headers
from gateway.ids import request_id_for
from gateway.logging import request_id_var
from gateway.metrics import HTTP_IN_FLIGHT
from gateway.middleware import record_request
from gateway.passthrough import SSE_CONTENT_TYPE, DisconnectWatch, RawHeaders, Route
from inference_app.upstream import UpstreamResponse, forward_headers, get_upstream

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger("gateway")

_LAST_CHUNK = b"0\r\n\r\n"


def eligible(scope: dict[str, Any], route: Route | None) -> bool:
    """Whether this request can be served directly (else it takes the ASGI path)."""
    if route is None or route.stream_request_body or scope["method"] != "POST":
        return False
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
            cycle.transport.close()
        cycle.on_response()

    async def error(self, exc: errors.GatewayError, path: str) -> None:
        """Answer with ``exc`` in the envelope of ``path`` (nothing sent yet)."""
        status, body, headers = errors.render(exc, path, self.request_id.decode("latin-1"))
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", b"%d" % len(body)))
        if any(k == b"connection" and v.lower() == b"close" for k, v in raw):
            self.cycle.keep_alive = False
            raw = [(k, v) for k, v in raw if k != b"connection"]  # _head writes it once
        await self._write(self._head(status, raw) + body)
        self._complete()

    async def relay(self, response: UpstreamResponse, route: Route) -> None:
        """The upstream's status, headers and body, as they arrive."""
        sized = False
        raw: list[tuple[bytes, bytes]] = []
        for name, value in response.headers:
            low = name.lower()
            if low == "content-length":
                sized = True
            raw.append((low.encode("latin-1"), value.encode("latin-1")))
        if not sized and response.status not in (204, 304):
            self.chunked = True
            raw.append((b"transfer-encoding", b"chunked"))
        head = self._head(response.status, raw)
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
    from gateway.auth import authenticate

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
    body = await _read_body(protocol, cycle, limit)
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
