"""Reading a model call's usage as it passes, without touching the bytes.

:class:`UsageTap` is fed every chunk of an upstream answer that is relayed untouched: a JSON body's
``usage``, an event stream's ``usage`` (OpenAI's last chunk with ``stream_options.include_usage``,
Anthropic's ``message_start`` / ``message_delta``, a Responses stream's terminal ``response.usage``).
Per chunk it does one substring search; only a line that mentions ``"usage"`` is parsed. :func:`tokens`
maps any of those to the ledger's counts, each one a count the ledger's columns hold or None. :func:`request_model` reads a request's ``model`` the same
way. :class:`ModelCall` times one call and records its ledger entry exactly once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

import orjson

from gateway.core import errors
from gateway.core.logging import request_id_var
from gateway.core.principal import Principal
from usage_app import ledger

log = logging.getLogger("gateway.usage")

_USAGE = b'"usage"'
# A JSON body up to this size is parsed whole; past it only its tail is kept and searched.
WHOLE_BODY_BYTES = 256 * 1024
TAIL_BYTES = 64 * 1024
# An event-stream line longer than this is not kept across chunks (a usage line is short).
LINE_BYTES = 1024 * 1024
_MODEL = b'"model"'
_MODEL_KEY = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.)*)"')
_FORM_MODEL = re.compile(rb'name="model"\r\n(?:[^\r\n]+\r\n)*\r\n([^\r\n]*)\r\n')
# A multipart upload's model field is looked for in its first bytes only (fields come before files).
FORM_PREFIX_BYTES = 64 * 1024


# A Responses stream's terminal events: their ``response`` carries the answer's usage and id.
_RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# The largest count taken: past 2**53 a float (Prometheus' counters, the Usage API's sums in JSON)
# no longer adds small counts exactly, and no real call comes near it (the BIGINT columns hold 2**63).
MAX_COUNT = 2**53 - 1

# (input, output, cached input, reasoning): None where the upstream reported nothing usable.
Tokens = tuple[int | None, int | None, int | None, int | None]


def count(value: Any) -> int | None:
    """``value`` as a ledger token count: an int up to :data:`MAX_COUNT`, else None (negative or too
    large is an upstream's nonsense: never the reason a batch or a response's write is refused, nor a
    counter that stops adding up)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def tokens(usage: dict[str, Any] | None) -> Tokens:
    """(input, output, cached input, reasoning) of an OpenAI, Anthropic or Responses ``usage`` object
    (None or not an object: all None); each a :func:`count`."""
    if not isinstance(usage, dict):
        return None, None, None, None
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        prompt = usage.get("prompt_tokens_details")
        completion = usage.get("completion_tokens_details")
        return (
            count(usage.get("prompt_tokens")),
            count(usage.get("completion_tokens")),
            count(prompt.get("cached_tokens")) if isinstance(prompt, dict) else None,
            count(completion.get("reasoning_tokens")) if isinstance(completion, dict) else None,
        )
    # Anthropic's (and the Responses API's) names.
    details = usage.get("input_tokens_details")
    output_details = usage.get("output_tokens_details")
    cached = count(usage.get("cache_read_input_tokens"))
    if cached is None and isinstance(details, dict):
        cached = count(details.get("cached_tokens"))
    return (
        count(usage.get("input_tokens")),
        count(usage.get("output_tokens")),
        cached,
        count(output_details.get("reasoning_tokens")) if isinstance(output_details, dict) else None,
    )


def request_model(body: bytes) -> str:
    """The ``model`` of a JSON request body ("" when it has none): read at its key when the body
    names ``"model"`` once, parsed when more than once (a nested key)."""
    at = body.find(_MODEL)
    if at < 0:
        return ""
    if body.find(_MODEL, at + len(_MODEL)) < 0:
        match = _MODEL_KEY.match(body, at)
        if match is not None and b"\\" not in match.group(1):
            return match.group(1).decode("utf-8", "replace")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else ""


def form_model(prefix: bytes) -> str | None:
    """The ``model`` field of a multipart form's first bytes (None: not among them)."""
    match = _FORM_MODEL.search(prefix)
    return match.group(1).decode("utf-8", "replace") if match else None


class UsageTap:
    """Collects the ``usage`` of one answer from the chunks relayed (``sse``: an event stream,
    else a JSON body). ``max_bytes``: the most bytes kept to read a JSON body whole or an event-stream
    line (by default :data:`WHOLE_BODY_BYTES` and :data:`LINE_BYTES`). Besides ``usage``, once read:
    ``complete`` (a whole JSON body or a Responses stream's terminal event was read: the answer ended)
    and ``answer_id`` (that body's or terminal response's ``id``; "" when none)."""

    __slots__ = (
        "_body_bytes",
        "_buf",
        "_line",
        "_line_bytes",
        "_truncated",
        "answer_id",
        "complete",
        "sse",
        "usage",
    )

    def __init__(self, sse: bool, max_bytes: int | None = None) -> None:
        self.sse = sse
        self.usage: dict[str, Any] = {}
        self.complete = False
        self.answer_id = ""
        self._line = b""  # SSE: the incomplete last line, kept while it may hold usage
        self._buf = bytearray()  # JSON: the body, or its tail
        self._truncated = False
        self._line_bytes = max_bytes or LINE_BYTES
        self._body_bytes = max_bytes or WHOLE_BODY_BYTES

    def feed(self, chunk: bytes) -> None:
        if self.sse:
            self._feed_sse(chunk)
            return
        buf = self._buf
        buf += chunk
        if len(buf) > self._body_bytes:
            del buf[:-TAIL_BYTES]
            self._truncated = True

    def _feed_sse(self, chunk: bytes) -> None:
        if self._line:
            data = self._line + chunk
        elif chunk.find(_USAGE) < 0 and chunk.endswith(b"\n"):
            return  # the common case: whole events, none with usage
        else:
            data = chunk
        end = data.rfind(b"\n")
        complete, rest = (b"", data) if end < 0 else (data[:end], data[end + 1 :])
        self._line = rest if len(rest) <= self._line_bytes else b""
        if complete.find(_USAGE) < 0:
            return
        for line in complete.split(b"\n"):
            if line.startswith(b"data:") and line.find(_USAGE) >= 0:
                self._event(line[5:])

    def _event(self, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(data, dict):
            return
        usage = data.get("usage")
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            usage = data["message"].get("usage")
        elif kind in _RESPONSES_TERMINAL and isinstance(data.get("response"), dict):
            usage = self._answer(data["response"])
        if isinstance(usage, dict):
            self.usage.update(usage)  # Anthropic's message_delta adds to message_start's

    def _answer(self, answer: dict[str, Any]) -> Any:
        """The whole answer was read: keep its id; its ``usage``."""
        self.complete = True
        answer_id = answer.get("id")
        self.answer_id = answer_id if isinstance(answer_id, str) else ""
        return answer.get("usage")

    def finish(self) -> dict[str, Any]:
        """The usage found (empty: none); a JSON body is read here, once it has ended."""
        if self.sse or not self._buf:
            return self.usage
        buf, self._buf = bytes(self._buf), bytearray()
        if not self._truncated:
            try:
                data = orjson.loads(buf)
            except orjson.JSONDecodeError:
                return self.usage
            usage = self._answer(data) if isinstance(data, dict) else None
            if isinstance(usage, dict):
                self.usage = usage
            return self.usage
        # A large body: the last "usage" key of its tail (OpenAI and Anthropic write it last).
        at = buf.rfind(_USAGE)
        if at < 0:
            return self.usage
        text = buf[at + len(_USAGE) :].decode("utf-8", "replace").lstrip()
        if not text.startswith(":"):
            return self.usage
        text = text[1:].lstrip()
        try:
            usage, _ = json.JSONDecoder().raw_decode(text)
        except ValueError:
            return self.usage
        if isinstance(usage, dict):
            self.usage = usage
        return self.usage


class ModelCall:
    """One upstream call being accounted: started now, recorded once by :meth:`record`."""

    __slots__ = (
        "_perf",
        "_started",
        "model",
        "principal",
        "recorded",
        "request_id",
        "response_id",
        "route",
        "status",
        "usage",
    )

    def __init__(self, principal: Principal, route: str, model: str = "") -> None:
        self.principal = principal
        self.route = route
        self.model = model
        self.status = 0
        self.usage: dict[str, Any] = {}
        self.response_id = ""  # the answer's id, where the route keeps one (the Responses direct path)
        rid = request_id_var.get()  # now: a streamed answer may end outside the request's context
        self.request_id = "" if rid == "-" else rid
        self.recorded = False
        self._started = time.time()
        self._perf = time.perf_counter()

    def __enter__(self) -> ModelCall:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        """A block that is the whole call: recorded at its end, however it ends (an upstream error:
        its status; cancelled: 499, the client left)."""
        if not self.recorded:
            if isinstance(exc, errors.GatewayError):
                self.status = exc.status
            elif isinstance(exc, asyncio.CancelledError):
                self.status = 499
        self.record()

    def record(self, status: int | None = None, usage: dict[str, Any] | None = None) -> None:
        """Record the call's ledger entry (the first call only; later ones do nothing)."""
        if self.recorded:
            return
        self.recorded = True
        if status is not None:
            self.status = status
        if usage is not None:
            self.usage = usage
        try:
            self._record()
        except Exception:  # never into a request
            log.exception("usage ledger: a model call could not be recorded")

    def _record(self) -> None:
        input_tokens, output_tokens, cached, reasoning = tokens(self.usage)
        ledger.record(
            ledger.UsageEntry(
                principal=self.principal,
                route=self.route,
                model=self.model,
                status=self.status or 502,
                started_at=self._started,
                latency_ms=ledger.since(self._perf),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cached_tokens=cached,
                reasoning_tokens=reasoning,
                response_id=self.response_id[:128],
                request_id=self.request_id,
            )
        )
