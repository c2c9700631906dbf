"""Scripted upstream answers in vLLM's exact wire formats, for both executor wire APIs.

* ``/v1/responses``: named SSE events (``event: <type>\\ndata: <json>\\n\\n``) as vLLM's
  ``_convert_stream_to_sse_events`` writes them: ``response.created``, ``response.in_progress``,
  per item ``response.output_item.added`` … ``response.output_item.done`` (reasoning with
  ``response.reasoning_part.added`` / ``response.reasoning_text.delta``), ``response.completed``;
  no ``[DONE]``.
* ``/v1/chat/completions``: ``data:`` chunks (role chunk, ``content`` / ``reasoning`` /
  ``tool_calls`` deltas, a finish chunk, the usage chunk with empty ``choices``) and ``[DONE]``.

A script is a list of output parts: ``text(...)``, ``reasoning(...)``, ``call(...)``. A request
with ``"stream": false`` (compaction's summary round) gets vLLM's JSON answer instead
(:func:`json_answer`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.upstream import MODEL, Recorded


@dataclass
class Part:
    kind: str  # text | reasoning | call
    chunks: list[str]
    name: str = ""
    call_id: str = ""


def text(*chunks: str) -> Part:
    return Part("text", list(chunks))


def reasoning(*chunks: str) -> Part:
    return Part("reasoning", list(chunks))


def call(name: str, *chunks: str, call_id: str | None = None) -> Part:
    return Part("call", list(chunks), name=name, call_id=call_id or f"call_{secrets.token_hex(8)}")


@dataclass
class Script:
    parts: list[Part]
    usage: dict[str, Any] | None = field(
        default_factory=lambda: {"input_tokens": 12, "output_tokens": 7, "total_tokens": 19}
    )
    status: str = "completed"  # completed | incomplete (max_output_tokens)
    # vLLM 0.32 ends a length-capped response with ``response.completed`` whose status is
    # ``incomplete`` (seen with real vLLM); OpenAI-style servers send ``response.incomplete``.
    incomplete_event: str = "response.completed"
    service_tier: str | None = None
    truncate_after: int | None = None  # stop after this many events, without the terminal one
    malformed_at: int | None = None  # replace this event's data with broken JSON
    oversize_line: int = 0  # send one data line of this many bytes first
    delay_s: float = 0.0  # pause before each event
    error_status: int | None = None  # answer with this HTTP error instead of a stream
    error_message: str = "upstream exploded"
    # Rewrites the stream before it is sent (tests/responses/hostile.py): for ``responses`` the
    # ``(event type, data)`` list, for ``chat_completions`` the list of chunk dicts.
    mutate: Any = None
    # Rewrites the answer to a ``"stream": false`` request (the Responses object or the chat
    # completion, a dict) before it is sent.
    mutate_answer: Any = None
    # The answer to a ``"stream": false`` request is cut after this many bytes (the connection
    # closes without the rest).
    answer_truncate_at: int | None = None


def _hex() -> str:
    return secrets.token_hex(16)


def _vllm_usage(usage: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": usage["input_tokens"],
        "input_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
        "output_tokens": usage["output_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": usage.get("reasoning_tokens", 0),
            "tool_output_tokens": 0,
        },
        "total_tokens": usage["total_tokens"],
    }
    if "cache_write_tokens" in usage:
        out["input_tokens_details"]["cache_write_tokens"] = usage["cache_write_tokens"]
    return out


def responses_events(script: Script, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The event list vLLM's ``/v1/responses`` stream would carry for ``script``."""
    resp_id = f"resp_{_hex()}"
    created = int(time.time())
    base = {
        "id": resp_id,
        "created_at": created,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": None,
        "model": body.get("model", MODEL),
        "object": "response",
        "output": [],
        "parallel_tool_calls": True,
        "temperature": body.get("temperature", 1.0),
        "tool_choice": "auto",
        "tools": body.get("tools", []),
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": body.get("max_output_tokens", 4083),
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": script.service_tier or "auto",
        "status": "in_progress",
        "text": None,
        "top_logprobs": None,
        "truncation": "disabled",
        "usage": None,
        "user": None,
    }
    events: list[tuple[str, dict[str, Any]]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append((kind, {**fields, "sequence_number": len(events), "type": kind}))

    add("response.created", response=dict(base))
    add("response.in_progress", response=dict(base))
    output: list[dict[str, Any]] = []
    for index, part in enumerate(script.parts):
        whole = "".join(part.chunks)
        if part.kind == "text":
            item_id = f"msg_{_hex()}"
            add(
                "response.output_item.added",
                item={
                    "id": item_id,
                    "content": [],
                    "role": "assistant",
                    "status": "in_progress",
                    "type": "message",
                },
                output_index=index,
            )
            empty = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
            add(
                "response.content_part.added",
                content_index=0,
                item_id=item_id,
                output_index=index,
                part=empty,
            )
            for chunk in part.chunks:
                add(
                    "response.output_text.delta",
                    content_index=0,
                    delta=chunk,
                    item_id=item_id,
                    logprobs=[],
                    output_index=index,
                )
            add(
                "response.output_text.done",
                content_index=0,
                item_id=item_id,
                logprobs=[],
                output_index=index,
                text=whole,
            )
            done_part = {"annotations": [], "text": whole, "type": "output_text", "logprobs": None}
            add(
                "response.content_part.done",
                content_index=0,
                item_id=item_id,
                output_index=index,
                part=done_part,
            )
            item = {
                "id": item_id,
                "content": [done_part],
                "role": "assistant",
                "status": "completed",
                "type": "message",
            }
        elif part.kind == "reasoning":
            item_id = f"msg_{_hex()}"
            add(
                "response.output_item.added",
                item={
                    "id": item_id,
                    "summary": [],
                    "type": "reasoning",
                    "content": None,
                    "encrypted_content": None,
                    "status": "in_progress",
                },
                output_index=index,
            )
            add(
                "response.reasoning_part.added",
                content_index=0,
                item_id=item_id,
                output_index=index,
                part={"text": "", "type": "reasoning_text"},
            )
            for chunk in part.chunks:
                add(
                    "response.reasoning_text.delta",
                    content_index=0,
                    delta=chunk,
                    item_id=item_id,
                    output_index=index,
                )
            add(
                "response.reasoning_text.done",
                content_index=0,
                item_id=item_id,
                output_index=index,
                text=whole,
            )
            add(
                "response.reasoning_part.done",
                content_index=0,
                item_id=item_id,
                output_index=index,
                part={"text": whole, "type": "reasoning_text"},
            )
            item = {
                "id": item_id,
                "summary": [],
                "type": "reasoning",
                "content": [{"text": whole, "type": "reasoning_text"}],
                "encrypted_content": None,
                "status": "completed",
            }
        else:
            item_id = f"fc_{_hex()}"
            add(
                "response.output_item.added",
                item={
                    "arguments": "",
                    "call_id": part.call_id,
                    "name": part.name,
                    "type": "function_call",
                    "id": item_id,
                    "status": "in_progress",
                },
                output_index=index,
            )
            for chunk in part.chunks:
                add(
                    "response.function_call_arguments.delta", delta=chunk, item_id=item_id, output_index=index
                )
            add(
                "response.function_call_arguments.done",
                arguments=whole,
                item_id=item_id,
                output_index=index,
                name=part.name,
            )
            item = {
                "arguments": whole,
                "call_id": part.call_id,
                "name": part.name,
                "type": "function_call",
                "id": item_id,
                "status": "completed",
            }
        add("response.output_item.done", item=item, output_index=index)
        output.append(item)
    final = dict(base)
    final["output"] = output
    final["status"] = script.status
    if script.usage is not None:
        final["usage"] = _vllm_usage(script.usage)
    if script.status == "incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
        add(script.incomplete_event, response=final)
    else:
        add("response.completed", response=final)
    return events


def chat_chunks(script: Script, body: dict[str, Any]) -> list[bytes]:
    """The ``data:`` payloads vLLM's ``/v1/chat/completions`` stream would carry for ``script``."""
    chunk_id = f"chatcmpl-{_hex()}"
    created = int(time.time())
    model = body.get("model", MODEL)

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        payload = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
            **extra,
        }
        return orjson.dumps(payload)

    out = [chunk({"role": "assistant", "content": ""}, prompt_token_ids=None)]
    tool_index = 0
    for part in script.parts:
        if part.kind == "text":
            out += [chunk({"content": c}) for c in part.chunks]
        elif part.kind == "reasoning":
            out += [chunk({"reasoning": c}) for c in part.chunks]
        else:
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "id": part.call_id,
                                "type": "function",
                                "index": tool_index,
                                "function": {"name": part.name},
                            }
                        ]
                    }
                )
            )
            out += [
                chunk({"tool_calls": [{"index": tool_index, "function": {"arguments": c}}]})
                for c in part.chunks
            ]
            tool_index += 1
    finish = "tool_calls" if tool_index else ("length" if script.status == "incomplete" else "stop")
    extra = {"service_tier": script.service_tier} if script.service_tier else {}
    out.append(chunk({"content": ""}, finish, **extra))
    if script.usage is not None:
        out.append(
            orjson.dumps(
                {
                    "id": chunk_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": _chat_usage(script.usage),
                    "system_fingerprint": "vllm-0.0.0-deadbeef",
                }
            )
        )
    out.append(b"[DONE]")
    return out


def handler(script: Script, wire: str = "responses") -> Any:
    """An aiohttp handler for ``ScriptedUpstream.script`` answering with ``script``."""

    async def answer(request: web.Request, rec: Recorded) -> web.StreamResponse:
        body = rec.json()
        if script.error_status is not None:
            return web.json_response(
                {
                    "error": {
                        "message": script.error_message,
                        "type": "BadRequestError" if script.error_status < 500 else "InternalServerError",
                        "param": None,
                        "code": script.error_status,
                    }
                },
                status=script.error_status,
            )
        if body.get("stream") is False:  # an explicitly non-streaming request gets vLLM's JSON answer
            answer: Any = json_answer(script, body, wire)
            if script.mutate_answer is not None:
                answer = script.mutate_answer(answer)
            raw = orjson.dumps(answer)
            if script.delay_s:  # generating it takes as long as streaming it would
                events = responses_events(script, body) if wire == "responses" else chat_chunks(script, body)
                await asyncio.sleep(script.delay_s * len(events))
            if script.answer_truncate_at is None:
                return web.Response(body=raw, content_type="application/json")
            return await _truncated(request, raw, script.answer_truncate_at)
        if wire == "responses":
            events = responses_events(script, body)
            if script.mutate is not None:
                script.mutate(events)
            frames = [
                b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
                for kind, data in events
            ]
        else:
            payloads = chat_chunks(script, body)
            if script.mutate is not None:
                chunks = [orjson.loads(p) for p in payloads[:-1]]
                script.mutate(chunks)
                payloads = [orjson.dumps(c) for c in chunks] + payloads[-1:]
            frames = [b"data: " + payload + b"\n\n" for payload in payloads]
        if script.truncate_after is not None:
            frames = frames[: script.truncate_after]
        if script.malformed_at is not None:
            frames[script.malformed_at] = b'data: {"type": "response.output_text.delta", "delta\n\n'
        response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        if script.oversize_line:
            await response.write(b"data: " + b"x" * script.oversize_line + b"\n\n")
        for frame in frames:
            if script.delay_s:
                await asyncio.sleep(script.delay_s)
            await response.write(frame)
        await response.write_eof()
        return response

    return answer


async def _truncated(request: web.Request, raw: bytes, at: int) -> web.StreamResponse:
    """A JSON answer whose ``Content-Length`` promises ``raw`` whole, cut after ``at`` bytes."""
    response = web.StreamResponse(
        headers={"content-type": "application/json", "content-length": str(len(raw))}
    )
    await response.prepare(request)
    await response.write(raw[:at])
    assert request.transport is not None
    request.transport.close()
    return response


def json_answer(script: Script, body: dict[str, Any], wire: str) -> dict[str, Any]:
    """What vLLM answers to a ``"stream": false`` request for ``script``: the Responses object of
    the stream's terminal event, or a ``chat.completion`` with the parts joined."""
    if wire == "responses":
        response: dict[str, Any] = responses_events(script, body)[-1][1]["response"]
        return response
    content = "".join(c for part in script.parts if part.kind == "text" for c in part.chunks)
    reasoning = "".join(c for part in script.parts if part.kind == "reasoning" for c in part.chunks)
    calls = [
        {
            "id": part.call_id,
            "type": "function",
            "function": {"name": part.name, "arguments": "".join(part.chunks)},
        }
        for part in script.parts
        if part.kind == "call"
    ]
    finish = "tool_calls" if calls else ("length" if script.status == "incomplete" else "stop")
    answer: dict[str, Any] = {
        "id": f"chatcmpl-{_hex()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", MODEL),
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content or None,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": calls,
                    "reasoning": reasoning or None,
                },
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": None,
            }
        ],
        "service_tier": script.service_tier,
        "system_fingerprint": None,
        "usage": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }
    if script.usage is not None:
        answer["usage"] = {"prompt_tokens_details": None, **_chat_usage(script.usage)}
    return answer


def _chat_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """vLLM's chat ``usage`` (the stream's last chunk and a completion carry the same)."""
    out: dict[str, Any] = {
        "prompt_tokens": usage["input_tokens"],
        "total_tokens": usage["total_tokens"],
        "completion_tokens": usage["output_tokens"],
    }
    details = {k: usage[k] for k in ("cached_tokens", "cache_write_tokens") if k in usage}
    if details:
        out["prompt_tokens_details"] = details
    if "reasoning_tokens" in usage:
        out["completion_tokens_details"] = {"reasoning_tokens": usage["reasoning_tokens"]}
    return out


def path_for(wire: str) -> str:
    return "/v1/responses" if wire == "responses" else "/v1/chat/completions"
