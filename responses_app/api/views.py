"""HTTP views of the Responses API. Thin: authenticate → parse → service/selector → render."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from gateway.core import errors
from gateway.core.config import get_config
from gateway.core.db import run_orm
from gateway.core.http import allow_methods, json_response, parse_json_body
from gateway.core.pipeline import meter_request
from gateway.core.principal import Principal, credential_consumed, request_principal
from gateway.core.sse import Event
from inference_app.upstream import lineage
from inference_app.upstream.http import HOP_BY_HOP, forward_headers, get_upstream
from responses_app import tasks
from responses_app.engine import metering, runs
from responses_app.engine.domain import Prepared
from responses_app.engine.executor import Executor
from responses_app.engine.tool_loop import PRIVATE_KEY, ToolLoop, history_model_items
from responses_app.features.multi_agent import Coordinator, compaction_parts, is_multi_agent, root_model_view
from responses_app.protocol.features import REFUSED_FIELDS, refuse_hosted_fields
from responses_app.protocol.schemas import ResponseCreateRequest, parse_create_request
from responses_app.storage import prepare, selectors, writes
from usage_app import quotas

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_TERMINAL_TYPES = {"response.completed", "response.incomplete", "response.failed", "error"}
_TAIL_POLL_S = 0.05


def _check_json(content_type: str) -> None:
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise errors.BadRequest(
            f"Invalid Content-Type header ({content_type or 'none'}), expected application/json.",
            code="invalid_content_type",
        )


def _upstream_headers(headers: Mapping[str, str], credential_consumed: bool) -> dict[str, str]:
    headers = forward_headers(headers, get_config(), caller_credential_consumed=credential_consumed)
    # The executor writes its own body: only identity and tracing headers travel with it.
    keep = ("authorization", "x-api-key", "openai-organization", "openai-project", "x-request-id")
    return {k: v for k, v in headers.items() if k in keep}


def _request_headers(request: HttpRequest) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


@dataclass
class Call:
    """``POST /v1/responses`` as both transports see it (Django below, the ASGI fast path)."""

    content_type: str  # the media type, lower-case, without parameters
    body: bytes
    headers: Mapping[str, str]  # lower-case names
    principal: Principal
    credential_consumed: bool


@dataclass
class Outcome:
    """The answer: a JSON body, or ``frames`` streamed as they come (``close`` runs after them)."""

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    frames: AsyncIterator[bytes] | None = None
    close: Callable[[], Awaitable[None]] | None = None


_JSON_HEADERS = [("Content-Type", "application/json")]
_SSE_HEADERS = [("Content-Type", "text/event-stream"), *SSE_HEADERS.items()]


def _json(data: Any) -> Outcome:
    return Outcome(headers=_JSON_HEADERS, body=orjson.dumps(data))


def _stream(frames: AsyncIterator[bytes]) -> Outcome:
    return Outcome(headers=_SSE_HEADERS, frames=frames)


async def create(call: Call) -> Outcome:
    """Create a response; refusals raise :class:`errors.GatewayError` before any byte is sent."""
    _check_json(call.content_type)
    parsed, raw = parse_create_request(call.body)
    config = get_config()
    if not prepare.needs_executor(parsed, raw, config):
        return await _direct(call, parsed.model or "", parsed.prompt_cache_key)
    arguments: dict[str, Any] = {
        "request": parsed,
        "raw": raw,
        "owner": call.principal.owner,
        "principal": call.principal,
        "headers": _upstream_headers(call.headers, call.credential_consumed),
        "config": config,
    }
    prepared: Prepared
    if prepare.prepare_reads_database(parsed):
        prepared = await run_orm(prepare.response_prepare, **arguments)
    else:
        prepared = prepare.response_prepare(**arguments)  # nothing stored referenced
    if prepared.background:
        # Tool declarations, host policy and approvals are refused (400) before anything is queued;
        # MCP discovery happens when the work runs.
        await ToolLoop.prepare(prepared, config, discover=False)
        snapshot = await tasks.create_background(prepared, config)
        quotas.hold_until(tasks.finished(prepared.response_id))  # its slot: until the work ends
        if parsed.stream:
            return _stream(_tail(prepared.response_id, -1))
        return _json(snapshot)
    executor = (Coordinator if is_multi_agent(prepared) else Executor)(prepared, config)
    await executor.prepare_tools()  # MCP discovery and tool validation: 400s before any byte
    if parsed.stream:
        return _stream(runs.detached_frames(executor))
    # Nobody reads the events as they come: one answer a round, and events made without their frames.
    executor.stream_rounds = False
    executor.sink.unread = True
    await runs.drive(executor, _ignore)
    if executor.store_refusal is not None:
        raise executor.store_refusal
    if executor.failure_event is not None:
        data = executor.failure_event.data
        raise errors.ServerError(data["message"], code=data.get("code"))
    final = executor.final or {}
    if (
        final.get("status") == "failed"
        and executor.http_error is not None
        and executor.http_error.status < 500
    ):
        raise executor.http_error
    return _json(final)


@allow_methods("POST")
async def responses_create(request: HttpRequest) -> HttpResponse:
    """Django's route for ``POST /v1/responses``; the ASGI fast path (``responses_app.api.fastpath``)
    normally serves it first, through the same :func:`create`."""
    await meter_request(request)
    call = Call(
        content_type=request.content_type or "",
        body=request.body,
        headers=_request_headers(request),
        principal=request_principal(request),
        credential_consumed=credential_consumed(request),
    )
    return django_response(await create(call))


def django_response(outcome: Outcome) -> HttpResponse:
    response: HttpResponse
    if outcome.frames is None:
        response = HttpResponse(outcome.body, status=outcome.status)
    else:
        response = cast(HttpResponse, StreamingHttpResponse(_closing(outcome), status=outcome.status))
    for key, value in outcome.headers:
        response[key] = value
    return response


async def _closing(outcome: Outcome) -> AsyncIterator[bytes]:
    assert outcome.frames is not None
    try:
        async for frame in outcome.frames:
            yield frame
    finally:
        if outcome.close is not None:
            await outcome.close()


def _ignore(event: Event) -> None:
    return None


def _sse(frames: AsyncIterator[bytes]) -> HttpResponse:
    return django_response(_stream(frames))


async def _direct(call: Call, model: str, prompt_cache_key: str | None) -> Outcome:
    """Stateless pass-through: the body goes to the upstream byte for byte, the answer comes back as it
    arrives; its usage-ledger row is read from it as it passes (:class:`metering.DirectCall`). Its one
    round has the lineage its ``prompt_cache_key`` names (Codex sends one), else none."""
    config = get_config()
    headers = forward_headers(call.headers, config, caller_credential_consumed=call.credential_consumed)
    headers.pop("accept-encoding", None)
    metered = metering.DirectCall(call.principal, model, config.responses.max_upstream_sse_line_bytes)
    named = prepare.prompt_cache_lineage(call.principal.owner, prompt_cache_key) if prompt_cache_key else None
    try:
        with lineage.bind(named):
            upstream = await get_upstream().send("POST", "/v1/responses", body=call.body, headers=headers)
    except BaseException as exc:
        metered.end(metering.failed_status(exc, None))
        raise
    relayed = [
        (key, value)
        for key, value in upstream.headers
        if key.lower() not in HOP_BY_HOP and key.lower() != "content-length"
    ]
    metered.answered(upstream.status, upstream.content_type or "")

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream:
                metered.feed(chunk)
                yield chunk
        except BaseException as exc:
            metered.end(metering.failed_status(exc, upstream.status))
            raise
        metered.end()

    async def close() -> None:
        metered.end(metering.CLIENT_LEFT)  # a relay that never ran (else already recorded)
        await upstream.aclose()

    return Outcome(status=upstream.status, headers=relayed, frames=relay(), close=close)


def sse_tail(response_id: str, starting_after: int) -> HttpResponse:
    """A background response's stored events after ``starting_after`` as server-sent events,
    following the response to its end (``GET /v1/responses/{id}?stream=true``)."""
    return _sse(_tail(response_id, starting_after))


async def _tail(response_id: str, starting_after: int) -> AsyncIterator[bytes]:
    """Replay stored events after ``starting_after``, then follow a running response to its end."""
    after = starting_after
    finished_checks = 0
    while True:
        events = await run_orm(selectors.response_events_after, response_id=response_id, after=after)
        for event in events:
            after = event.sequence_number
            data = event.data
            kind = orjson.loads(data).get("type", "")
            yield b"event: " + kind.encode() + b"\ndata: " + data.encode() + b"\n\n"
            if kind in _TERMINAL_TYPES:
                return
        if events:
            continue
        status = await run_orm(selectors.response_status, id=response_id)
        if status is None or status not in ("queued", "in_progress"):
            finished_checks += 1
            if finished_checks > 2:  # terminal and nothing more arrives (e.g. cancelled)
                return
        await asyncio.sleep(_TAIL_POLL_S)


# ``POST /v1/responses/compact``: what the summary uses, and what is accepted but unused.
_COMPACT_FIELDS = frozenset(
    {
        "model",
        "input",
        "previous_response_id",
        "instructions",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "service_tier",
    }
)
_COMPACT_UNUSED = frozenset({"tools", "parallel_tool_calls", "reasoning", "text"})


@allow_methods("POST")
async def response_compact(request: HttpRequest) -> HttpResponse:
    """``POST /v1/responses/compact``: one summary round over ``input`` and/or the owner's
    ``previous_response_id`` chain, answered as a ``response.compaction`` and stored as a checkpoint."""
    from responses_app.features import compaction

    await meter_request(request)  # before anything is read or stored
    _check_json(request.content_type or "")
    try:
        raw = orjson.loads(request.body) if request.body else None
    except orjson.JSONDecodeError:
        raw = None
    if not isinstance(raw, dict):
        raise errors.BadRequest(
            "We could not parse the JSON body of your request. The request body must be a JSON object.",
            code="invalid_json",
        )
    for key in raw:
        if key in REFUSED_FIELDS:
            refuse_hosted_fields(raw)  # as responses.create answers it (null: accepted, unused)
        elif key not in _COMPACT_FIELDS and key not in _COMPACT_UNUSED:
            raise errors.BadRequest(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
    if raw.get("input") is None and raw.get("previous_response_id") is None:
        raise errors.BadRequest(
            "Missing required parameter: 'input' (or 'previous_response_id'): there is nothing to compact.",
            param="input",
            code="missing_required_parameter",
        )
    # The same request model and preparation as responses.create: types, items, input_file,
    # prompt_cache_options, and the owner-checked history of previous_response_id.
    fields = {k: v for k, v in raw.items() if k in _COMPACT_FIELDS}
    parsed, fields = parse_create_request(orjson.dumps({**fields, "store": True}))
    config = get_config()
    principal = request_principal(request)
    prepared = await run_orm(
        prepare.response_prepare,
        request=parsed,
        raw=fields,
        owner=principal.owner,
        principal=principal,
        headers=_upstream_headers(_request_headers(request), credential_consumed(request)),
        config=config,
        model_turn=False,  # a history ending in a call that awaits its output is summarized too
    )
    items = [*prepared.history, *prepared.new_items]
    kept: list[dict[str, Any]] = []
    model_items = items
    if prepared.agent_tree is not None:  # a multi-agent chain: the root agent is compacted
        items, kept = compaction_parts(items)
        model_items = root_model_view(items)
    # The summary's ledger row is stored with the checkpoint; if that never happens, batch-written.
    meter = metering.Meter(prepared, route=metering.COMPACT_ROUTE)
    try:
        summary = await compaction.summarize(
            upstream=get_upstream(),
            config=config,
            headers=prepared.headers,
            model=parsed.model,
            model_items=history_model_items(model_items),
            instructions=parsed.instructions,
            forwarded=compaction.forwarded_fields(fields, prepared.prompt_cache_options),
            meter=meter,
            lineage_key=prepared.lineage,  # the lineage it compacts
        )
    except BaseException:
        meter.settle()
        raise
    retained = compaction.retained_messages(items)
    item = compaction.compaction_item(summary.text)
    # Required by the SDK's CompactedResponse: zeros when the upstream reported none.
    usage = summary.usage if summary.usage is not None else compaction.usage_dict({})
    answer = {
        "id": prepared.response_id,
        "object": "response.compaction",
        "created_at": prepared.created_at,
        "output": [*retained, item],
        "usage": usage,
    }
    entries = meter.take()
    try:
        await run_orm(
            writes.response_compaction_store,
            prepared=prepared,
            retained=retained,
            item=item,
            kept=kept,
            usage=usage,
            usage_entries=entries,
        )
    except Exception:
        meter.unwritten(entries)  # rolled back: the batch writer writes them
        raise
    return json_response(answer)


@allow_methods("POST")
async def response_input_tokens(request: HttpRequest) -> HttpResponse:
    """``POST /v1/responses/input_tokens``: counted by the upstream's ``/tokenize``."""
    from responses_app.engine import translate

    _check_json(request.content_type or "")
    # Malformed JSON (not UTF-8 included) is the 400 every JSON route gives (was: a 500; schema fuzzing).
    raw = parse_json_body(request) if request.body else {}
    raw.setdefault("model", "")
    parsed, raw = parse_create_request(orjson.dumps(raw))
    config = get_config()
    prepared = await run_orm(
        prepare.response_prepare,
        request=_without_store(parsed),
        raw=raw,
        owner=request_principal(request).owner,
        headers=_upstream_headers(_request_headers(request), credential_consumed(request)),
        config=config,
    )
    from responses_app.features.compaction import model_view
    from responses_app.storage.input_files import input_file_view

    # A summary, and an input file's text, count as the model reads them.
    items = model_view(
        [input_file_view(item, PRIVATE_KEY) for item in (*prepared.history, *prepared.new_items)]
    )
    messages = translate.items_to_messages(parsed.instructions, items)
    body: dict[str, Any] = {"messages": messages}
    if parsed.model:
        body["model"] = parsed.model
    tools = translate.tools_to_chat(parsed.tools)
    if tools:
        body["tools"] = tools
    headers = dict(prepared.headers)
    headers["content-type"] = "application/json"
    upstream = await get_upstream().send("POST", "/tokenize", body=orjson.dumps(body), headers=headers)
    payload = await upstream.read()
    if upstream.status == 404:
        raise errors.NotImplementedFeature(
            "The configured upstream has no /tokenize endpoint, so input tokens cannot be counted.",
            code="tokenize_unavailable",
        )
    if upstream.status != 200:
        raise errors.UpstreamError(f"The upstream /tokenize answered {upstream.status}.")
    try:
        count = orjson.loads(payload)["count"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise errors.UpstreamError("The upstream /tokenize answer has no count.") from None
    return json_response({"object": "response.input_tokens", "input_tokens": count})


def _without_store(request: ResponseCreateRequest) -> ResponseCreateRequest:
    return request.model_copy(update={"background": None, "store": False})
