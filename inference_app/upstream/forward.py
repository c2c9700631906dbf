"""Forwarding one HTTP request to the upstream byte for byte and relaying the answer as it arrives:
status, headers (minus hop-by-hop) and every body chunk, with no JSON parsing and no per-chunk work
beyond the usage ledger's tap (:mod:`usage_app.tap`: one substring search per chunk, the bytes untouched;
none at all with ``[usage] ledger = false``). Every call is recorded in the ledger once, however it
ends. The pass-through routes and the Anthropic Messages routes use it (a :class:`Route` each)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from gateway.core import errors
from gateway.core.asgi import (
    SSE_CONTENT_TYPE,
    ClientDisconnected,
    DisconnectWatch,
    Exchange,
    Message,
    RawHeaders,
    Receive,
    Scope,
    Send,
    client_left,
    encode_headers,
    read_body,
    send_error,
    stream_body,
)
from gateway.core.config import get_config
from gateway.core.principal import scope_principal
from inference_app.upstream import lineage
from inference_app.upstream.http import (
    UpstreamResponse,
    forward_headers,
    get_upstream,
)
from usage_app import ledger
from usage_app.tap import FORM_PREFIX_BYTES, ModelCall, UsageTap, form_model, request_model

_DONE = b"data: [DONE]\n\n"


def openai_stream_error(exc: errors.GatewayError) -> bytes:
    """A failed OpenAI-style stream ends as vLLM ends one: an error chunk, then ``[DONE]``."""
    return errors.openai_sse_error(exc) + _DONE


@dataclass(frozen=True)
class Route:
    """One pass-through route: where it goes upstream and how a broken stream ends."""

    upstream_path: str
    # Audio uploads are streamed to the upstream instead of read first.
    stream_request_body: bool = False
    # The event that ends an event stream the upstream broke off (stall or connection loss).
    stream_error: Callable[[errors.GatewayError], bytes] = openai_stream_error
    methods: frozenset[str] = field(default_factory=lambda: frozenset({"POST"}))
    # A request whose body ``divert`` says yes to is served by ``diverted`` on the ASGI path instead
    # of being relayed (the Messages server-tool loop). ``diverted`` gets the headers to forward.
    divert: Callable[[bytes], bool] | None = None
    diverted: Callable[..., Awaitable[None]] | None = None
    # The lineage of a request (its body and owner), for routes whose requests belong to one (the
    # Messages route: Claude Code's session); None: no lineage (the OpenAI pass-through routes).
    lineage: Callable[[bytes, str], str | None] | None = None


async def relay(
    route: Route,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    credential_consumed: bool,
    extra_headers: RawHeaders,
    headers: dict[str, str] | None = None,
) -> None:
    """Forward one request upstream and relay the answer as it arrives.

    A client disconnect cancels the upstream request at once; upstream failures answer 502/504 in the
    route's envelope, or end a started event stream with its error event. ``extra_headers`` (CORS)
    are added; ``headers`` are the decoded request headers when the caller has them.
    """
    config = get_config()
    exchange = Exchange()
    if headers is None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    headers = forward_headers(headers, config, caller_credential_consumed=credential_consumed)
    body: bytes | AsyncIterator[bytes]
    if route.stream_request_body:
        exchange.body_done = asyncio.Event()
        body = stream_body(receive, exchange)
        declared = _declared_length(scope)
        if declared is not None:
            headers["content-length"] = declared  # same framing upstream as the client used
    else:
        try:
            body = await read_body(receive, exchange)
        except ClientDisconnected:
            return
        if route.divert is not None and route.diverted is not None and route.divert(body):
            await route.diverted(
                scope, body, receive, send, headers=headers, extra_headers=extra_headers, exchange=exchange
            )
            return
    await forward(route, scope, receive, send, exchange, body, headers=headers, extra_headers=extra_headers)


async def forward(
    route: Route,
    scope: Scope,
    receive: Receive,
    send: Send,
    exchange: Exchange,
    body: bytes | AsyncIterator[bytes],
    *,
    headers: dict[str, str],
    extra_headers: RawHeaders,
) -> None:
    """Send ``body`` to the route's upstream path and relay the answer (what :func:`relay` does once
    it has the body; a diverted route that rewrote the body relays its answer with it too)."""
    response: UpstreamResponse | None = None
    principal = scope_principal(scope)
    call = ModelCall(principal, scope["path"])
    named = None
    if route.lineage is not None and isinstance(body, bytes):
        named = route.lineage(body, principal.owner)
    if ledger.enabled():  # off: nothing is read from the request or the answer, nothing recorded
        if isinstance(body, bytes):
            call.model = request_model(body)
        else:
            body = _form_model_tap(body, call)
    try:
        with DisconnectWatch(lambda: client_left(receive, exchange), lambda: exchange.finished):
            query = scope.get("query_string", b"").decode("latin-1")
            try:
                with lineage.bind(named):
                    response = await get_upstream().send(
                        scope["method"], route.upstream_path, body=body, headers=headers, query=query
                    )
            except errors.GatewayError as exc:
                call.status = exc.status
                if not exchange.client_gone:
                    await send_error(send, scope, exc, extra_headers)
                return
            call.status = response.status
            await _relay_response(response, scope, send, exchange, route, extra_headers, call)
    except asyncio.CancelledError:
        call.status = 499
        raise
    finally:
        if response is not None:
            await response.aclose()
        if exchange.client_gone and not exchange.finished:
            call.status = 499
        call.record()


async def _form_model_tap(body: AsyncIterator[bytes], call: ModelCall) -> AsyncIterator[bytes]:
    """Relay a streamed (multipart) request body as it is, reading its ``model`` field on the way."""
    prefix: bytes | None = b""
    async for chunk in body:
        if prefix is not None:
            prefix += chunk
            model = form_model(prefix)
            if model is not None:
                call.model = model
            if model is not None or len(prefix) > FORM_PREFIX_BYTES:
                prefix = None
        yield chunk


async def _relay_response(
    response: UpstreamResponse,
    scope: Scope,
    send: Send,
    exchange: Exchange,
    route: Route,
    extra_headers: RawHeaders,
    call: ModelCall,
) -> None:
    content_type = response.content_type
    tap: UsageTap | None = None
    if ledger.enabled() and (content_type == SSE_CONTENT_TYPE or content_type.endswith("json")):
        tap = UsageTap(sse=content_type == SSE_CONTENT_TYPE)
    failure: errors.GatewayError | None = None
    try:
        failure = await _relay_body(response, scope, send, exchange, route, extra_headers, tap)
    except errors.GatewayError as exc:
        failure = exc
        raise
    finally:
        if failure is not None:
            call.status = failure.status  # the upstream broke off: 502, or 504 when it stalled
        if tap is not None:
            call.usage = tap.finish()


async def _relay_body(
    response: UpstreamResponse,
    scope: Scope,
    send: Send,
    exchange: Exchange,
    route: Route,
    extra_headers: RawHeaders,
    tap: UsageTap | None,
) -> errors.GatewayError | None:
    """Relay the answer; the upstream's failure when it broke off (ended here with an error)."""
    raw_headers = encode_headers(response.headers)
    if extra_headers:
        raw_headers.extend(extra_headers)
    head = {"type": "http.response.start", "status": response.status, "headers": raw_headers}
    length = response.header("content-length")
    remaining = int(length) if length and length.isdigit() else -1
    start: Message | None = head
    if remaining < 0:
        await send(head)  # a body without a length (a stream): its head goes out at once
        start = None
    # A sized body's head waits for its first bytes (the server writes them together anyway):
    # an upstream that breaks off before them still gets an error answer.
    try:
        async for chunk in response:
            if tap is not None:
                tap.feed(chunk)
            if start is not None:
                await send(start)
                start = None
            if remaining >= 0:
                remaining -= len(chunk)
                if remaining <= 0:
                    # A sized body's last chunk ends the response in the same message.
                    exchange.finished = True
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return None
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except errors.GatewayError as exc:
        if start is not None:
            exchange.finished = True
            await send_error(send, scope, exc, extra_headers)
            return exc
        if response.content_type != SSE_CONTENT_TYPE:
            raise  # a sized or plain body cannot carry an error: the connection is dropped
        exchange.finished = True
        await send({"type": "http.response.body", "body": route.stream_error(exc), "more_body": False})
        return exc
    if start is not None:
        await send(start)  # an empty sized body
    exchange.finished = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return None


def _declared_length(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            text = value.decode("latin-1").strip()
            return text if text.isdigit() else None
    return None
