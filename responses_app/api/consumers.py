"""``WS /v1/responses``: the Responses API over one WebSocket (Codex-style clients).

The Channels side of a connection: each text frame is one client event (``response.create`` or
``response.steer``), handed to the connection's :class:`~responses_app.api.session.WebSocketSession`,
which runs it through the same preparation and executor as ``POST /v1/responses``. Outbound events
go through the session's bounded queue and one writer with a send deadline, so a client that stops
reading stops the producers instead of growing a buffer; a send blocked past the deadline closes
the connection with 1008. On shutdown new requests are refused and the connection closes with 1012
once the running ones' terminal events are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import orjson
from channels.generic.websocket import AsyncWebsocketConsumer

from gateway.core import errors, memory
from gateway.core.auth.websocket import ensure_not_expired
from gateway.core.config import get_config
from gateway.core.lifecycle import drain
from gateway.core.principal import scope_principal
from responses_app.api.session import MAX_STREAM_ID, Counted, WebSocketSession
from usage_app import quotas

log = logging.getLogger("responses.websocket")

# Close code when a client stops reading: "policy violation" with a reason naming the cause.
CLOSE_SLOW_CLIENT = 1008
SLOW_CLIENT_REASON = "send deadline exceeded: the client is not reading events"
# How long the close frame itself may wait for the client's buffer to drain before the
# connection is dropped outright.
CLOSE_GRACE_S = 10.0
# Close code when the server shuts down, sent after the last terminal event ("service restart").
CLOSE_SHUTDOWN = 1012


class ResponsesConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    """One connection's Channels adapter: frames in, the bounded writer out, closes and drain."""

    session: WebSocketSession

    async def connect(self) -> None:
        self.session = WebSocketSession(self.scope, get_config(), self)
        self.main_task = asyncio.current_task()
        self.writer = asyncio.create_task(self._write_loop())
        await self.accept()
        self.unlisten = drain.listen(self._on_drain)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "unlisten"):
            self.unlisten()
            del self.unlisten  # it holds this consumer's bound method: no cycle outlives the connection
        tasks = self.session.end() if hasattr(self, "session") else []
        if hasattr(self, "writer"):
            tasks.append(self.writer)
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        for task in tasks:
            if task is not current:
                with contextlib.suppress(BaseException):
                    await task
        memory.connection_closed()  # what the connection held goes back to the system

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        session = self.session
        if session.closing:
            return
        if text_data is None:
            await session.error(
                errors.BadRequest(
                    "Binary frames are not supported; send each client event as one JSON text frame.",
                    code="invalid_json",
                ),
                None,
            )
            return
        try:
            content = orjson.loads(text_data)
        except orjson.JSONDecodeError as exc:
            await session.error(
                errors.BadRequest(
                    f"We could not parse the JSON of your WebSocket message: {exc}.", code="invalid_json"
                ),
                None,
            )
            return
        if not isinstance(content, dict):
            await session.error(
                errors.BadRequest("Each WebSocket message must be a JSON object.", code="invalid_json"),
                None,
            )
            return
        stream_id = content.get("stream_id")
        echo = stream_id if isinstance(stream_id, str) and 0 < len(stream_id) <= MAX_STREAM_ID else None
        kind = content.get("type")
        if kind == "response.steer":
            await session.steer(content)
            return
        if kind != "response.create":
            shown = kind if isinstance(kind, str) else orjson.dumps(kind).decode()
            await session.error(
                errors.BadRequest(
                    f"Unsupported WebSocket event type '{shown}'. This endpoint accepts 'response.create' "
                    "and 'response.steer'.",
                    param="type",
                    code="unknown_event_type",
                ),
                echo,
            )
            return
        if session.draining:
            await session.error(
                errors.ServiceUnavailable(
                    "The server is shutting down; send this request again on a new connection.",
                    code="server_shutting_down",
                ),
                echo,
            )
            return
        try:
            job = session.parse(content, len(text_data.encode("utf-8")))
            ensure_not_expired(self.scope)
            session.admit(job)
        except errors.GatewayError as exc:
            await session.error(exc, echo)
            return
        try:
            job.quota = await quotas.admit_principal(scope_principal(self.scope))
        except errors.GatewayError as exc:  # a quota's 429: the connection stays open
            session.withdraw(job)
            await session.error(exc, echo)
            return
        session.enqueue(job)

    # --- outbound ----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        session = self.session
        outbound = session.outbound
        deadline = session.limits.send_timeout_s
        while True:
            item = await outbound.get()
            frame = item.frame if isinstance(item, Counted) else item
            try:
                async with asyncio.timeout(deadline):
                    await self.send(text_data=frame.decode("utf-8"))
            except TimeoutError:
                await self._close_slow_client()
                return
            except Exception:  # the client went away: disconnect() cleans up
                return
            finally:
                if isinstance(item, Counted):
                    session.steering.release_failure(item.size)
                outbound.task_done()

    # --- closes and shutdown -----------------------------------------------------------------

    def _on_drain(self) -> None:
        """The server is shutting down: refuse new requests, close once the running ones ended."""
        self.session.draining = True
        self.drain_task = asyncio.get_running_loop().create_task(self._close_when_idle())

    async def _close_when_idle(self) -> None:
        session = self.session
        # Running responses end by themselves (finished, or failed at the shutdown deadline).
        while session.outstanding and not session.closing:
            await asyncio.sleep(0.05)
        # Their terminal events are on the wire before the close.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_GRACE_S):
                await session.outbound.join()
        if not session.closing:
            session.closing = True
            await self.close(code=CLOSE_SHUTDOWN)

    async def _close_slow_client(self) -> None:
        log.warning("closing a WebSocket whose client stopped reading (send_timeout_s exceeded)")
        await self.close_policy(SLOW_CLIENT_REASON)

    async def close_policy(self, reason: str) -> None:
        """Close with 1008 and ``reason``; running work ends, nothing more is sent."""
        self.session.cancel_lanes()
        try:
            async with asyncio.timeout(CLOSE_GRACE_S):
                await self.close(code=CLOSE_SLOW_CLIENT, reason=reason)
        except (TimeoutError, Exception):
            # Not even the close frame can be written: end the connection outright.
            if self.main_task is not None:
                self.main_task.cancel()
