"""Anthropic Messages: one upstream round of the server-tool loop, validated before any tool runs.

A JSON round must be a typed message whose ``tool_use`` blocks have an id, a name and an object
input; a streamed one is checked event by event (:class:`StreamRound`) through ``message_stop``.
A broken round raises :class:`RoundError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core.sse import StreamFailure, read_sse
from inference_app.upstream.http import UpstreamResponse


class RoundError(Exception):
    """The upstream's round broke a rule (validated before any tool runs)."""


@dataclass
class Round:
    """One upstream round, parsed: its message (content blocks in index order), stop reason, usage."""

    message: dict[str, Any]
    content: list[dict[str, Any]]
    stop_reason: Any
    usage: dict[str, Any]


def _check_block(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise RoundError("a content block has no type")
    if block["type"] == "tool_use":
        if not isinstance(block.get("id"), str) or not block["id"]:
            raise RoundError("a tool_use block has an empty id")
        if not isinstance(block.get("name"), str) or not block["name"]:
            raise RoundError("a tool_use block has an empty name")
        if not isinstance(block.get("input"), dict):
            raise RoundError("a tool_use block's input is not an object")
    return block


def parse_json_round(raw: bytes) -> Round:
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RoundError("the answer is not valid JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        raise RoundError("the answer is not a message")
    content = [_check_block(b) for b in message["content"]]
    usage: dict[str, Any] = message["usage"] if isinstance(message.get("usage"), dict) else {}
    return Round(message, content, message.get("stop_reason"), usage)


class StreamRound:
    """Validates and assembles one streamed round: :meth:`feed` returns what the client may see of an
    event now; hidden blocks (gateway tool calls) are never shown."""

    def __init__(self, hidden: Callable[[Mapping[str, Any]], bool], next_index: Callable[[], int]) -> None:
        self.hidden = hidden
        self.next_index = next_index
        self.message: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}
        self.open: set[int] = set()
        self.public_index: dict[int, int] = {}  # upstream index -> client index (visible blocks)
        self.order: list[int] = []
        self.stop_reason: Any = None
        self.usage: dict[str, Any] = {}
        self.stopped = False

    def feed(self, name: str, data: Any) -> dict[str, Any] | None:
        if self.stopped:
            raise RoundError("an event after message_stop")
        if not isinstance(data, dict):
            raise RoundError("an event that is not a JSON object")
        kind = data.get("type", name)
        if kind == "message_start":
            message = data.get("message")
            if self.message is not None or not isinstance(message, dict):
                raise RoundError("a second or malformed message_start")
            self.message = message
            if isinstance(message.get("usage"), dict):
                self.usage.update(message["usage"])
            return data
        if self.message is None and kind != "ping":
            raise RoundError(f"{kind} before message_start")
        if kind == "content_block_start":
            index = data.get("index")
            block = data.get("content_block")
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise RoundError("a content block index that is not a non-negative integer")
            if index in self.blocks:
                raise RoundError(f"content block index {index} used twice")
            if isinstance(block, dict) and block.get("type") == "tool_use" and "input" not in block:
                block = {**block, "input": {}}  # a streamed tool_use's input arrives as deltas
            block = _check_block(block)
            self.blocks[index] = dict(block)
            self.partial[index] = []
            self.open.add(index)
            self.order.append(index)
            if self.hidden(block):
                return None
            self.public_index[index] = self.next_index()
            return {**data, "index": self.public_index[index]}
        if kind in ("content_block_delta", "content_block_stop"):
            index = data.get("index")
            if index not in self.open:
                raise RoundError(f"{kind} for a content block that is not open")
            if kind == "content_block_delta":
                self._apply(index, data.get("delta"))
            else:
                self.open.discard(index)
                self._finish(index)
            if index not in self.public_index:
                return None
            return {**data, "index": self.public_index[index]}
        if kind == "message_delta":
            delta: dict[str, Any] = data["delta"] if isinstance(data.get("delta"), dict) else {}
            if "stop_reason" in delta:
                self.stop_reason = delta["stop_reason"]
            if "stop_sequence" in delta and self.message is not None:
                self.message["stop_sequence"] = delta["stop_sequence"]
            if isinstance(data.get("usage"), dict):
                self.usage.update(data["usage"])
            return None  # the client gets one message_delta, at the end of the last round
        if kind == "message_stop":
            if self.open:
                raise RoundError("message_stop with a content block not closed by content_block_stop")
            self.stopped = True
            return None
        if kind == "ping":
            return data
        raise RoundError(f"unknown event {kind!r}")

    def _apply(self, index: int, delta: Any) -> None:
        if not isinstance(delta, dict):
            raise RoundError("a content_block_delta without a delta")
        block = self.blocks[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
        elif kind == "input_json_delta":
            self.partial[index].append(str(delta.get("partial_json", "")))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))

    def _finish(self, index: int) -> None:
        parts = self.partial.pop(index, [])
        block = self.blocks[index]
        if parts and block.get("type") in ("tool_use", "server_tool_use"):
            text = "".join(parts)
            try:
                value = orjson.loads(text) if text.strip() else {}
            except orjson.JSONDecodeError:
                raise RoundError("a tool_use block's input is not valid JSON") from None
            if not isinstance(value, dict):
                raise RoundError("a tool_use block's input is not an object")
            block["input"] = value

    def result(self) -> Round:
        if not self.stopped or self.message is None:
            raise RoundError("the stream ended before message_stop")
        content = [self.blocks[i] for i in self.order]
        return Round(self.message, content, self.stop_reason, self.usage)


async def sse_events(response: UpstreamResponse, max_line: int) -> Any:
    """``(event name, parsed data)`` for each event of an upstream SSE body; ``[DONE]``, malformed JSON and
    an over-long line raise :class:`RoundError`."""
    try:
        async for name, payload in read_sse(response, max_line):
            if payload.strip() == b"[DONE]":
                raise RoundError("[DONE] before message_stop")
            try:
                parsed = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise RoundError("an event whose data is not valid JSON") from None
            yield name or "", parsed
    except StreamFailure:
        raise RoundError("an event line over the size limit") from None


def sse_event(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
