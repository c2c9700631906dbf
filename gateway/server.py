"""uvicorn's httptools protocol, tuned for the gateway.

:class:`GatewayServerProtocol` (what ``manage.py serve`` runs) relays the pass-through routes
without the ASGI round trip (:mod:`gateway.direct`); for everything else, and in
:class:`GatewayHttpProtocol`, there is one change to uvicorn: a sized response goes out in one write.

uvicorn writes the status line and headers to the socket as soon as the application sends
``http.response.start``, and the body with a second write. For a response with a
``Content-Length`` (every JSON answer, relayed or our own) the headers are useless to the client
without the body, so here they are held until the first body message and written together with it:
one system call per response instead of two, which is a measurable share of a small pass-through
request's cost (``docs/performance.md``). Streamed responses (no length: SSE, chunked) are written
exactly as uvicorn writes them, so their headers still reach the client at once.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


class _HeldHead:
    """Stands in for the transport while uvicorn writes the status line and headers."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:  # uvicorn never closes while writing a head; be safe anyway
        return None


class _WithHead:
    """Stands in for the transport while uvicorn writes the first body bytes: head + body at once."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: Any, head: bytes) -> None:
        self.transport = transport
        self.head = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        self.transport.write(head + data if head else data)

    def close(self) -> None:
        if self.head:
            self.transport.write(self.head)
            self.head = b""
        self.transport.close()


def _sized(message: dict[str, Any]) -> bool:
    return any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))


class CoalescingCycle(RequestResponseCycle):
    """A request/response cycle that writes a sized response's head together with its body."""

    _held: bytes = b""

    async def send(self, message: Any) -> None:
        if (
            not self.response_started
            and message["type"] == "http.response.start"
            and self.scope["method"] != "HEAD"
            and _sized(message)
        ):
            transport, holder = self.transport, _HeldHead()
            self.transport = holder  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._held = holder.data
            return
        if self._held:
            transport, proxy = self.transport, _WithHead(self.transport, self._held)
            self._held = b""
            self.transport = proxy  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
                if proxy.head and not self.disconnected:
                    transport.write(proxy.head)  # nothing was written (an error): head alone
            return
        await super().send(message)


class GatewayHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` whose requests run as :class:`CoalescingCycle`."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.__class__ = CoalescingCycle
        super()._start_asgi_task(cycle, app)


_direct_module: Any = None


def _direct() -> Any:
    global _direct_module
    if _direct_module is None:
        from gateway import direct  # imported on first use: it needs Django's settings

        _direct_module = direct
    return _direct_module


class GatewayServerProtocol(GatewayHttpProtocol):
    """The protocol ``manage.py serve`` runs the gateway with.

    Pass-through requests that :func:`gateway.direct.eligible` accepts are relayed on callbacks by
    :class:`gateway.direct.Relay` when :func:`gateway.direct.start` takes them, else by
    :func:`gateway.direct.serve` in the task uvicorn would have run the ASGI app in; every other
    request goes to the ASGI app. The hooks below feed the active relay the events it runs on.
    """

    _routes: dict[str, Any] | None = None
    # False: every eligible request takes the task (tests run the pass-through cases both ways).
    callbacks = True
    relay: Any = None  # the gateway.direct.Relay answering on this connection now, if any

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        routes = GatewayServerProtocol._routes
        if routes is None:
            from gateway.fastpath import fast_routes

            routes = GatewayServerProtocol._routes = fast_routes()
        scope = cycle.scope
        route = routes.get(scope["path"])
        if route is not None:
            direct = _direct()
            if self.callbacks and direct.start(self, cycle, route):
                return
            if direct.eligible(scope, route):
                task = self.loop.create_task(direct.serve(self, cycle, route))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
                return
        super()._start_asgi_task(cycle, app)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        relay = self.relay
        if relay is not None and relay.cycle is self.cycle:
            self.flow.resume_reading()  # the declared length is within the ceiling: read it all

    def on_message_complete(self) -> None:
        super().on_message_complete()
        relay = self.relay
        if relay is not None and relay.cycle is self.cycle:
            relay.body_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        relay = self.relay
        if relay is not None:
            relay.client_gone()

    def resume_writing(self) -> None:
        super().resume_writing()
        relay = self.relay
        if relay is not None:
            relay.pump()
