"""``POST /v1/responses`` served at the ASGI layer, below Django (see ``gateway/fastpath.py``).

Django's request handling costs more than a stored response's own work, so this handler reads the
body, admits the request through :func:`gateway.core.pipeline.admitted`, runs the one
implementation (:func:`responses_app.api.views.create`) and answers errors as
``GatewayErrorMiddleware`` would. A stream's head goes out with its first frames; a disconnect
cancels the work. Other ``/v1/responses/…`` paths stay Django views.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from gateway.core import errors
from gateway.core.asgi import (
    ClientDisconnected,
    DisconnectWatch,
    Exchange,
    RawHeaders,
    Receive,
    Scope,
    Send,
    client_left,
    read_body,
    send_error,
)
from gateway.core.pipeline import admitted, passage_of
from gateway.core.sse import coalesce
from responses_app.api.views import Call, Outcome, create

log = logging.getLogger("gateway")

_METHODS = frozenset({"POST"})


def _media_type(value: str) -> str:
    """``request.content_type`` as Django computes it: the media type, lower-case, no parameters."""
    return value.split(";", 1)[0].strip().lower()


async def serve_create(scope: Scope, receive: Receive, send: Send) -> None:
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        headers[key.decode("latin-1").lower()] = value.decode("latin-1")
    passage = passage_of(scope)
    exchange = Exchange()
    try:
        body = await read_body(receive, exchange)
    except ClientDisconnected:
        return
    outcome: Outcome | None = None
    try:
        with DisconnectWatch(lambda: client_left(receive, exchange), lambda: exchange.finished):
            try:
                auth = await admitted(passage, headers, _METHODS, metered=True)
                call = Call(
                    content_type=_media_type(headers.get("content-type", "")),
                    body=body,
                    headers=headers,
                    principal=auth.principal,
                    credential_consumed=auth.credential_consumed,
                )
                outcome = await create(call)
            except errors.GatewayError as exc:
                exchange.finished = True
                await send_error(send, scope, exc, passage.cors)
                return
            except Exception as exc:
                log.exception("unhandled error on %s", scope["path"])
                exchange.finished = True
                await send_error(send, scope, errors.as_gateway_error(exc), passage.cors)
                return
            await _send(outcome, send, exchange, passage.cors)
    finally:
        if outcome is not None:
            await _close(outcome)


async def _send(outcome: Outcome, send: Send, exchange: Exchange, extra: RawHeaders) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in outcome.headers]
    if extra:
        raw.extend(extra)
    if outcome.frames is None:
        raw.append((b"content-length", str(len(outcome.body)).encode("latin-1")))
        await send({"type": "http.response.start", "status": outcome.status, "headers": raw})
        exchange.finished = True
        await send({"type": "http.response.body", "body": outcome.body, "more_body": False})
        return
    start = {"type": "http.response.start", "status": outcome.status, "headers": raw}
    started = False
    # The head goes out with the first events in one write, and events produced together share a write.
    # The coalescer is closed first on every exit, unwinding a source it left waiting.
    try:
        async with contextlib.aclosing(coalesce(outcome.frames)) as frames:
            async for frame in frames:
                if frame:
                    if not started:
                        started = True  # before the send: a send that fails is not repeated below
                        await send(start)
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
    finally:
        if not started:  # no event was sent: the head all the same (the end, or a failure, follows)
            await send(start)
    exchange.finished = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _close(outcome: Outcome) -> None:
    frames: Any = outcome.frames
    if frames is not None and hasattr(frames, "aclose"):
        await frames.aclose()
    if outcome.close is not None:
        await outcome.close()
