"""The scripted upstream: a real HTTP server on a loopback port that speaks vLLM's wire formats.

It is the one stand-in the project allows (no real model can be scripted to call tools on demand).
Tests queue answers per path with :meth:`ScriptedUpstream.script`; without a script a route gives
vLLM's default behaviour for a tiny model. Every request it receives is recorded.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
import zlib
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.servers import free_port, wait_port

Handler = Callable[[web.Request, "Recorded"], Awaitable[web.StreamResponse]]

MODEL = "test-model"
MAX_MODEL_LEN = 4096


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    disconnected: asyncio.Event | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        return orjson.loads(self.body)


def models_body(models: list[str] | None = None) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": m,
                "object": "model",
                "created": 1700000000,
                "owned_by": "vllm",
                "root": m,
                "parent": None,
                "max_model_len": MAX_MODEL_LEN,
                "permission": [],
            }
            for m in (models or [MODEL])
        ],
    }


class ScriptedUpstream:
    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[Recorded] = []
        self.scripts: dict[str, deque[Handler]] = defaultdict(deque)
        self.models = [MODEL]
        # ``/v1/embeddings`` answers with ``word_vector`` of each input when set (its dimensions):
        # vectors that mean something, for retrieval tests and the file_search bench.
        self.word_vectors: int | None = None
        # Concurrency, counted rather than timed: requests being answered now, and the most at once.
        self.in_flight = 0
        self.peak_in_flight = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, path: str, handler: Handler) -> None:
        """Answer the next request on ``path`` with ``handler`` (FIFO per path).

        A handler marked with :func:`raw_body` gets the request before its body is read (it reads
        the body itself, e.g. to watch an upload arrive in pieces); ``Recorded.body`` stays empty.
        """
        self.scripts[path].append(handler)

    def wait_disconnected(self, rec: Recorded, timeout: float = 5.0) -> bool:
        """Wait (from the test thread) until the upstream saw the client of ``rec`` go away."""
        assert rec.disconnected is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if rec.disconnected.is_set():
                return True
            time.sleep(0.01)
        return rec.disconnected.is_set()

    def wait_requests(self, count: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.requests) >= count, f"upstream got {len(self.requests)} requests, wanted {count}"

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        # handler_cancellation: a handler sees CancelledError the moment the client goes away,
        # so tests can watch a disconnect reach the upstream (``Recorded.disconnected``).
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        self.loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self.loop.run_until_complete(site.start())
        self._started.set()
        self.loop.run_forever()

    def start(self) -> ScriptedUpstream:
        self._thread.start()
        self._started.wait(10)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.loop is None:
            return
        runner = self._runner

        async def shutdown() -> None:
            if runner is not None:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        queue = self.scripts.get(request.path)
        handler = queue.popleft() if queue else None
        raw = getattr(handler, "raw_body", False)
        rec = Recorded(
            request.method,
            request.path,
            request.query_string,
            {k.lower(): v for k, v in request.headers.items()},
            b"",
            asyncio.Event(),
        )
        # Which client connection carried the request (tests check connection reuse with it).
        rec.extra["peer"] = request.transport.get_extra_info("peername") if request.transport else None
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if not raw:
                rec.body = await request.read()
            self.requests.append(rec)
            if handler is not None:
                return await handler(request, rec)
            return await self.default(request, rec)
        except (asyncio.CancelledError, ConnectionResetError):
            # The client (the gateway) closed the connection while we were answering.
            assert rec.disconnected is not None
            rec.disconnected.set()
            if rec not in self.requests:
                self.requests.append(rec)
            raise
        finally:
            self.in_flight -= 1

    async def default(self, request: web.Request, rec: Recorded) -> web.StreamResponse:
        """vLLM's behaviour for a tiny model when no script is queued."""
        if request.path == "/health":
            return web.Response(status=200)
        if request.path == "/v1/models":
            return web.json_response(models_body(self.models))
        if request.path == "/v1/chat/completions":
            body = rec.json()
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await sse(chat_chunks(["Hello", "!"], include_usage=include_usage))(request, rec)
            return await json_answer(chat_completion("Hello!"))(request, rec)
        if request.path == "/v1/completions":
            body = rec.json()
            if body.get("stream"):
                return await sse(completion_chunks([" world", "!"]))(request, rec)
            return await json_answer(completion(" world!"))(request, rec)
        if request.path == "/tokenize":
            return await json_answer(tokenize(rec.json()))(request, rec)
        if request.path == "/v1/embeddings":
            body = rec.json()
            inputs = body["input"] if isinstance(body.get("input"), list) else [body.get("input")]
            if self.word_vectors and all(isinstance(text, str) for text in inputs):
                vectors = [word_vector(text, self.word_vectors) for text in inputs]
                return await json_answer(
                    embeddings(len(inputs), vectors=vectors, model=body.get("model") or MODEL)
                )(request, rec)
            return await json_answer(embeddings(len(inputs)))(request, rec)
        if request.path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            return await transcription_answer()(request, rec)
        if request.path == "/v1/messages":
            body = rec.json()
            if body.get("stream"):
                return await sse(anthropic_events(["Hello", "!"]))(request, rec)
            return await json_answer(anthropic_message("Hello!"))(request, rec)
        if request.path == "/v1/messages/count_tokens":
            return await json_answer({"input_tokens": 13})(request, rec)
        return web.json_response(
            vllm_error(f"no script for {request.path}", "NotFoundError", 404), status=404
        )

    def last(self, path: str | None = None) -> Recorded:
        for rec in reversed(self.requests):
            if path is None or rec.path == path:
                return rec
        raise AssertionError(f"the upstream received no request on {path}")


# --- vLLM wire formats -----------------------------------------------------------------------
# Bodies are serialized the way vLLM's pydantic models are: compact JSON, fields in declaration
# order, ``exclude_unset`` on stream chunks (see spec/vllm-openai-server.txt).

CREATED = 1761140000
FINGERPRINT = "vllm-0.11.0-3f9c1a2b"


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def vllm_error(
    message: str, type_: str = "BadRequestError", code: int = 400, param: str | None = None
) -> dict[str, Any]:
    """vLLM's ``ErrorResponse``: ``{"error": {message, type, param, code}}`` (code is the status)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def chat_completion(
    content: str | None = "Hello!",
    *,
    model: str = MODEL,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    prompt_tokens: int = 13,
    completion_tokens: int = 3,
    id_: str = "chatcmpl-3f9c0000000000000000000000000000",
) -> dict[str, Any]:
    """A non-streamed vLLM chat completion."""
    return {
        "id": id_,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": tool_calls or [],
                    "reasoning": None,
                },
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else finish_reason,
                "stop_reason": None,
                "token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }


def sse_data(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chat_chunks(
    pieces: Iterable[str],
    *,
    model: str = MODEL,
    include_usage: bool = False,
    tool_calls: list[dict[str, Any]] | None = None,
    prompt_tokens: int = 13,
    id_: str = "chatcmpl-3f9c0000000000000000000000000000",
) -> list[bytes]:
    """vLLM's chat stream: role chunk, content deltas, finish chunk, usage chunk, ``[DONE]``."""
    head = {"id": id_, "object": "chat.completion.chunk", "created": CREATED, "model": model}
    events = [
        sse_data(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "prompt_token_ids": None,
                "prompt_text": None,
            }
        )
    ]
    pieces = list(pieces)
    for piece in pieces:
        events.append(
            sse_data(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": piece},
                            "logprobs": None,
                            "finish_reason": None,
                            "token_ids": None,
                        }
                    ],
                }
            )
        )
    for index, call in enumerate(tool_calls or []):
        events.append(
            sse_data(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"tool_calls": [{"index": index, **call}]},
                            "logprobs": None,
                            "finish_reason": None,
                            "token_ids": None,
                        }
                    ],
                }
            )
        )
    finish: dict[str, Any] = {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"content": ""},
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "stop_reason": None,
                "token_ids": None,
                "weight_versions": None,
            }
        ],
    }
    if not include_usage:
        finish["system_fingerprint"] = FINGERPRINT
    events.append(sse_data(finish))
    if include_usage:
        completion_tokens = len(pieces) + 1
        events.append(
            sse_data(
                {
                    **head,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                        "completion_tokens": completion_tokens,
                    },
                    "system_fingerprint": FINGERPRINT,
                }
            )
        )
    events.append(DONE)
    return events


def completion(text: str = " world!", *, model: str = MODEL) -> dict[str, Any]:
    return {
        "id": "cmpl-3f9c0000000000000000000000000000",
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": 2,
            "total_tokens": 5,
            "completion_tokens": 3,
            "prompt_tokens_details": None,
        },
        "kv_transfer_params": None,
    }


def completion_chunks(pieces: Iterable[str], *, model: str = MODEL) -> list[bytes]:
    head = {
        "id": "cmpl-3f9c0000000000000000000000000000",
        "object": "text_completion",
        "created": CREATED,
        "model": model,
    }
    events = [
        sse_data(
            {
                **head,
                "choices": [
                    {"index": 0, "text": piece, "logprobs": None, "finish_reason": None, "stop_reason": None}
                ],
            }
        )
        for piece in pieces
    ]
    events.append(
        sse_data(
            {
                **head,
                "choices": [
                    {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None}
                ],
            }
        )
    )
    events.append(DONE)
    return events


def byte_level_tokens(text: str) -> list[str]:
    """A byte-level BPE's tokens of ``text`` as vLLM's ``token_strs`` shows them (GPT-2's byte-to-
    character table): GPT-2's pre-tokenization, each piece cut into tokens of at most five bytes
    (which may split a character's UTF-8 bytes, as real merges do)."""
    table = bytes_to_unicode()
    tokens: list[str] = []
    for piece in re.findall(r" ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+", text):
        data = piece.encode()
        tokens += ["".join(table[b] for b in data[i : i + 5]) for i in range(0, len(data), 5)]
    return tokens


def bytes_to_unicode() -> dict[int, str]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tokenize(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``POST /tokenize`` answer for a completion-style request (``prompt``) or a chat one
    (``messages``: their text contents, without a chat template's own tokens), with ``token_strs``
    when ``return_token_strs`` is true (vLLM's TokenizeResponse, field order kept)."""
    if "prompt" in body:
        text = body["prompt"]
    else:
        text = "".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
    strs = byte_level_tokens(text)
    ids = [sum(s.encode()) % 4000 for s in strs]
    return {
        "count": len(ids),
        "max_model_len": MAX_MODEL_LEN,
        "tokens": ids,
        "token_strs": strs if body.get("return_token_strs") else None,
    }


def word_vector(text: str, dim: int) -> list[float]:
    """A deterministic embedding: the words of ``text`` hashed into ``dim`` signed buckets, unit length
    (texts sharing words point the same way)."""
    vector = [0.0] * dim
    for word in re.findall(r"\w\w+", text.lower()):
        digest = zlib.crc32(word.encode())
        vector[digest % dim] += 1.0 if digest & 0x80000000 else -1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [round(v / norm, 6) for v in vector]


def embeddings(
    count: int = 1, dim: int = 4, *, model: str = MODEL, vectors: list[list[float]] | None = None
) -> dict[str, Any]:
    """vLLM's ``/v1/embeddings`` answer: ``vectors``, or ``count`` fixed ones of ``dim`` numbers."""
    return {
        "id": "embd-3f9c0000000000000000000000000000",
        "object": "list",
        "created": CREATED,
        "model": model,
        "data": [
            {
                "index": i,
                "object": "embedding",
                "embedding": vectors[i]
                if vectors
                else [round(0.125 * (i + 1) * (j + 1), 6) for j in range(dim)],
            }
            for i in range(count)
        ],
        "usage": {
            "prompt_tokens": 3 * count,
            "total_tokens": 3 * count,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


def transcription_chunks(pieces: Iterable[str], *, model: str = MODEL) -> list[bytes]:
    """vLLM's streamed transcription (``stream=true`` in the form)."""
    head = {
        "id": "trsc-3f9c0000000000000000000000000000",
        "object": "transcription.chunk",
        "created": CREATED,
        "model": model,
    }
    events = [sse_data({**head, "choices": [{"delta": {"content": piece}}]}) for piece in pieces]
    events.append(
        sse_data(
            {**head, "choices": [{"delta": {"content": ""}, "finish_reason": "stop", "stop_reason": None}]}
        )
    )
    events.append(DONE)
    return events


def anthropic_message(text: str = "Hello!", *, model: str = MODEL) -> dict[str, Any]:
    """vLLM's ``/v1/messages`` answer (Anthropic Messages shape)."""
    return {
        "id": "msg_3f9c0000000000000000000000",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 13, "output_tokens": 3},
    }


def anthropic_event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def anthropic_events(pieces: Iterable[str], *, model: str = MODEL) -> list[bytes]:
    """vLLM's streamed ``/v1/messages``: message_start … content deltas … message_stop."""
    start = anthropic_message("", model=model)
    start["content"] = []
    start["stop_reason"] = None
    start["usage"] = {"input_tokens": 13, "output_tokens": 0}
    events = [
        anthropic_event("message_start", {"type": "message_start", "message": start}),
        anthropic_event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
    ]
    pieces = list(pieces)
    for piece in pieces:
        events.append(
            anthropic_event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
            )
        )
    events.append(anthropic_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(
        anthropic_event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": len(pieces)},
            },
        )
    )
    events.append(anthropic_event("message_stop", {"type": "message_stop"}))
    return events


def anthropic_error(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


# --- handler factories -------------------------------------------------------------------------


class Gate:
    """A switch a test thread opens to let a scripted handler continue."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def open(self) -> None:
        self._event.set()

    async def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._event.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError("gate never opened")
            await asyncio.sleep(0.005)


def raw_body(handler: Handler) -> Handler:
    """Mark ``handler`` to get the request before its body is read."""
    handler.raw_body = True  # type: ignore[attr-defined]
    return handler


def json_answer(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Handler:
    """Answer with ``body`` (a dict is serialized compactly, bytes are sent as they are)."""
    payload = body if isinstance(body, bytes) else dumps(body)

    async def handler(request: web.Request, rec: Recorded) -> web.StreamResponse:
        response = web.Response(body=payload, status=status, content_type="application/json")
        for key, value in (headers or {}).items():
            response.headers[key] = value
        return response

    return handler


def sse(
    events: Iterable[bytes],
    *,
    delay: float = 0.0,
    gate: Gate | None = None,
    gate_after: int = 1,
    stall_after: int | None = None,
    headers: dict[str, str] | None = None,
    record_finish: bool = True,
) -> Handler:
    """Stream ``events`` as vLLM does (``text/event-stream``, chunked), one write per event.

    ``delay`` waits before each event after the first; ``gate`` holds the stream after
    ``gate_after`` events until the test opens it; ``stall_after`` goes silent for good after that
    many events. ``rec.extra["finished_at"]`` records when the last event was written.
    """
    events = list(events)

    async def handler(request: web.Request, rec: Recorded) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        response.headers["Cache-Control"] = "no-cache"
        for key, value in (headers or {}).items():
            response.headers[key] = value
        await response.prepare(request)
        for index, event in enumerate(events):
            if stall_after is not None and index == stall_after:
                await asyncio.sleep(3600)
            if gate is not None and index == gate_after:
                await gate.wait()
            if delay and index:
                await asyncio.sleep(delay)
            await response.write(event)
        if record_finish:
            rec.extra["finished_at"] = time.monotonic()
        await response.write_eof()
        return response

    return handler


class Meeting:
    """Holds the requests of its handlers until ``count`` requests are in flight at ``upstream``
    (or ``timeout`` passed), then lets them all go.

    Concurrent callers meet here however slowly they start; one that waits for another's answer
    first cannot, and the upstream's ``peak_in_flight`` tells which happened.
    """

    def __init__(self, upstream: ScriptedUpstream, count: int, timeout: float = 10.0) -> None:
        self.upstream, self.count, self.timeout = upstream, count, timeout
        self.met = False

    def handler(self, inner: Handler) -> Handler:
        async def handler(request: web.Request, rec: Recorded) -> web.StreamResponse:
            deadline = time.monotonic() + self.timeout
            while not self.met and time.monotonic() < deadline:
                self.met = self.upstream.in_flight >= self.count
                if not self.met:
                    await asyncio.sleep(0.005)
            return await inner(request, rec)

        return handler


def hang() -> Handler:
    """Never answer (not even headers) until the client goes away."""

    async def handler(request: web.Request, rec: Recorded) -> web.StreamResponse:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return handler


def transcription_answer() -> Handler:
    """vLLM's transcription answer for the form's ``response_format`` / ``stream`` fields."""

    async def handler(request: web.Request, rec: Recorded) -> web.StreamResponse:
        form = await _parse_form(request, rec.body)
        rec.extra["form"] = form
        if form.get("stream") == "true":
            return await sse(transcription_chunks(["Hello", " world"]))(request, rec)
        fmt = form.get("response_format", "json")
        if fmt == "text":
            return web.Response(text="Hello world\n", content_type="text/plain")
        return web.json_response({"text": "Hello world", "usage": {"type": "duration", "seconds": 1}})

    return handler


async def _parse_form(request: web.Request, body: bytes) -> dict[str, Any]:
    """The multipart form of a recorded body: text fields as str, files as (filename, bytes)."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + request.headers["Content-Type"].encode() + b"\r\n\r\n" + body
    )
    form: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        filename = part.get_filename()
        payload = part.get_payload(decode=True)
        form[name] = (filename, payload) if filename else payload.decode()
    return form


def anthropic_tool_message(
    calls: Iterable[tuple[str, str, dict[str, Any]]],
    *,
    text: str | None = None,
    stop_reason: str = "tool_use",
    usage: dict[str, Any] | None = None,
    model: str = MODEL,
) -> dict[str, Any]:
    """vLLM's ``/v1/messages`` answer with tool calls: ``(id, name, input)`` each, after ``text``."""
    message = anthropic_message(text or "", model=model)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]
    message["content"] = content
    message["stop_reason"] = stop_reason
    if usage is not None:
        message["usage"] = usage
    return message


def anthropic_tool_events(
    calls: Iterable[tuple[str, str, dict[str, Any]]],
    *,
    text: str | None = None,
    stop_reason: str = "tool_use",
    usage: dict[str, Any] | None = None,
    final_usage: dict[str, Any] | None = None,
    model: str = MODEL,
) -> list[bytes]:
    """vLLM's streamed ``/v1/messages`` with tool calls: a ``tool_use`` block each (input as
    ``input_json_delta`` pieces), after an optional text block."""
    start = anthropic_message("", model=model)
    start["content"] = []
    start["stop_reason"] = None
    start["usage"] = usage or {"input_tokens": 13, "output_tokens": 0}
    events = [anthropic_event("message_start", {"type": "message_start", "message": start})]
    index = 0
    if text:
        events += [
            anthropic_event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            anthropic_event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
            ),
            anthropic_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        index = 1
    for call_id, name, arguments in calls:
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        raw = dumps(arguments).decode()
        half = len(raw) // 2
        events.append(
            anthropic_event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
            )
        )
        for piece in (raw[:half], raw[half:]):
            events.append(
                anthropic_event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                )
            )
        events.append(anthropic_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(
        anthropic_event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": final_usage or {"output_tokens": 5},
            },
        )
    )
    events.append(anthropic_event("message_stop", {"type": "message_stop"}))
    return events
