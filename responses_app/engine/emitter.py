"""The event emitter: our public output items and their events, under the ``max_retained_bytes`` budget.

One item is open at a time, keyed by the upstream's position for it; opening another closes it. The
stream parsers call it; whole items go through :meth:`Emitter.whole`. A gateway tool call streams
nothing: it is handed to the tool loop when it closes. ``item_fields`` are added to every item (the
seam that attributes items to an agent).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.ids import new_id
from gateway.core.sse import Event, EventSink, StreamFailure
from responses_app.engine import translate
from responses_app.engine.citations import CitationText
from responses_app.engine.domain import GatewayCalls, OpenItem
from responses_app.features import async_tools

# The public item type of a client call buffered whole → the builder of that item.
WHOLE_ITEMS = dict(translate.WHOLE_CALLS.values())


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def custom_input(arguments: str) -> str:
    """A custom tool rendered as a chat function takes ``{"input": "…"}``; unwrap it."""
    try:
        decoded = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(decoded, dict) and isinstance(decoded.get("input"), str):
        return decoded["input"]
    return arguments


def _content_text(item: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in item.get("content") or () if isinstance(p, dict))


class Emitter:
    def __init__(self, sink: EventSink, client_tools: translate.ToolMap, *, max_retained_bytes: int) -> None:
        self.sink = sink
        self.client_tools = client_tools
        self.max_retained_bytes = max_retained_bytes
        self.tools: GatewayCalls | None = None  # the gateway tools, once prepared
        self.output: list[dict[str, Any]] = []
        self.open: OpenItem | None = None
        self.closed_keys: set[Any] = set()
        self.retained = 0
        # This round's client tool calls (all, and the async ones), and the gateway calls closed so far.
        self.client_calls = 0
        self.async_calls = 0
        self.gateway_calls = 0
        # Async calls held back this round (they followed a gateway call): (kind, call_id, name, text).
        self.deferred: list[tuple[str, str, str, str]] = []
        self.item_fields: dict[str, Any] = {}  # added to every item opened or appended whole
        # Multi-agent mode: each assistant message says whether it ends its agent's turn
        # (``phase``: ``final_answer``) or the round goes on after it (``commentary``).
        self.phases = False
        self.following: str | None = None  # the kind of the item whose opening closes the open one
        # file_id -> filename of this response's file_search results: what the model may cite.
        self.citable: dict[str, str] = {}

    def retain(self, size: int) -> None:
        """Count ``size`` bytes against ``max_retained_bytes``; over it the response fails."""
        self.retained += size
        limit = self.max_retained_bytes
        if self.retained > limit:
            raise StreamFailure(
                f"The response exceeded max_retained_bytes ({limit} bytes) of retained state."
            )

    def start_round(self) -> None:
        """A new inference round: the per-round counts start again."""
        self.client_calls = self.async_calls = self.gateway_calls = 0
        self.deferred = []

    @property
    def sync_calls(self) -> int:
        """This round's synchronous client calls (each one ends the response)."""
        return self.client_calls - self.async_calls

    def flush_deferred(self) -> list[Event]:
        """Stream the async calls held back this round, now that its gateway calls finished, so
        output indexes stay in order (they were counted when they closed)."""
        out: list[Event] = []
        deferred, self.deferred = self.deferred, []
        counts = self.client_calls, self.async_calls
        for kind, call_id, name, text in deferred:
            key = ("deferred", len(self.closed_keys))  # unique: every closed item adds a key
            out += self.ensure(key, kind, call_id=call_id, name=name, hold=False)
            if text:
                out += self.call_delta(key, text)
            out += self.close()
        self.client_calls, self.async_calls = counts
        return out

    def drop_open(self) -> None:
        """Forget the unfinished item (it is not part of a failed response)."""
        self.open = None

    def is_open(self, key: Any) -> bool:
        return self.open is not None and self.open.key == key

    def ensure(
        self, key: Any, kind: str, *, call_id: Any = None, name: Any = None, hold: bool = True
    ) -> list[Event]:
        """Open the item ``key`` of ``kind`` (closing the open one) unless it is open; an async call after a
        gateway call of the round is held until :meth:`flush_deferred`."""
        if self.open is not None and self.open.key == key:
            return []
        self.following = kind
        try:
            out = self.close()
        finally:
            self.following = None
        if kind == "function_call" and self.tools is not None and self.tools.is_gateway(as_str(name)):
            # A gateway tool call: buffered whole; the tool loop emits the public item when it closes.
            self.open = OpenItem(
                key,
                kind,
                {"type": "function_call", "call_id": as_str(call_id), "name": as_str(name)},
                -1,
                hidden=True,
            )
            return out
        index = len(self.output)
        # The upstream calls the flat function; the client gets back the tool it declared.
        restored = self.client_tools.restore(as_str(name)) if kind == "function_call" else None
        namespace = None
        if restored is not None and restored.kind in translate.WHOLE_CALLS:
            # A shell or tool_search call: buffered whole, then streamed as its public item.
            public = translate.WHOLE_CALLS[restored.kind][0]
            self.open = OpenItem(key, public, {"call_id": as_str(call_id)}, -1, buffered=True)
            return out
        is_async = restored is not None and async_tools.declares_async(restored.declaration)
        if is_async and hold and self.gateway_calls:
            self.open = OpenItem(
                key, kind, {"call_id": as_str(call_id), "name": as_str(name)}, -1, deferred=True
            )
            return out
        if restored is not None:
            name, namespace = restored.name, restored.namespace
            if restored.kind == "custom":
                kind = "custom_tool_call"
        item_id = translate.mint_item_id(kind)
        item: dict[str, Any]
        if kind == "message":
            item = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        elif kind == "reasoning":
            item = {"id": item_id, "type": "reasoning", "summary": []}
        elif kind == "custom_tool_call":
            item = {
                "id": item_id,
                "type": "custom_tool_call",
                "status": "in_progress",
                "call_id": as_str(call_id),
                "name": as_str(name),
                "input": "",
            }
            if namespace is not None:
                item["namespace"] = namespace
        else:
            item = {
                "id": item_id,
                "type": "function_call",
                "status": "in_progress",
                "call_id": as_str(call_id),
                "name": as_str(name),
                "arguments": "",
            }
            if namespace is not None:
                item["namespace"] = namespace
        if is_async:
            item["async"] = True
        if self.item_fields:
            item.update(self.item_fields)
        self.open = OpenItem(key, kind, item, index)
        if kind == "custom_tool_call" and restored is not None:
            # The upstream writes {"input": "…"} as function arguments: decoded when complete.
            self.open.buffered = True
        out.append(self.sink.make("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.part_event("response.content_part.added", part))
        elif kind == "reasoning":
            out.append(self.part_event("response.content_part.added", {"type": "reasoning_text", "text": ""}))
        return out

    def part_event(self, type_: str, part: dict[str, Any]) -> Event:
        """A content part event of the open item."""
        assert self.open is not None
        return self.sink.make(
            type_, item_id=self.open.item["id"], output_index=self.open.index, content_index=0, part=part
        )

    def text(self, key: Any, delta: str) -> list[Event]:
        out = self.ensure(key, "message")
        assert self.open is not None
        annotations: list[dict[str, Any]] = []
        if self.citable:
            if self.open.citations is None:
                self.open.citations = CitationText(self.citable)
            delta, annotations = self.open.citations.feed(delta)
        if delta:
            out.append(self._text_delta(delta))
        for annotation in annotations:
            out.append(self._annotation_added(annotation))
        return out

    def _text_delta(self, delta: str) -> Event:
        assert self.open is not None
        self.retain(len(delta))
        self.open.parts.append(delta)
        return self.sink.make(
            "response.output_text.delta",
            item_id=self.open.item["id"],
            output_index=self.open.index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    def _annotation_added(self, annotation: dict[str, Any]) -> Event:
        assert self.open is not None and self.open.citations is not None
        self.retain(len(orjson.dumps(annotation)))
        return self.sink.make(
            "response.output_text.annotation.added",
            item_id=self.open.item["id"],
            output_index=self.open.index,
            content_index=0,
            annotation_index=len(self.open.citations.annotations) - 1,
            annotation=annotation,
        )

    def reasoning(self, key: Any, delta: str) -> list[Event]:
        out = self.ensure(key, "reasoning")
        assert self.open is not None
        self.retain(len(delta))
        self.open.parts.append(delta)
        out.append(
            self.sink.make(
                "response.reasoning_text.delta",
                item_id=self.open.item["id"],
                output_index=self.open.index,
                content_index=0,
                delta=delta,
            )
        )
        return out

    def call_delta(self, key: Any, delta: str) -> list[Event]:
        if self.open is None or self.open.key != key:
            if key in self.closed_keys:
                return []  # a late fragment of a finished call cannot be streamed any more
            out = self.ensure(key, "function_call", call_id=new_id("call"), name="")
        else:
            out = []
        assert self.open is not None
        self.retain(len(delta))
        self.open.parts.append(delta)
        if self.open.buffered or self.open.hidden or self.open.deferred:
            return out
        type_ = (
            "response.custom_tool_call_input.delta"
            if self.open.kind == "custom_tool_call"
            else "response.function_call_arguments.delta"
        )
        out.append(
            self.sink.make(type_, item_id=self.open.item["id"], output_index=self.open.index, delta=delta)
        )
        return out

    def item_done(self, key: Any, item: dict[str, Any]) -> list[Event]:
        """The upstream finished item ``key`` (``item`` as it sent it): close it, replaying what
        never streamed; an item of another type is appended whole."""
        out: list[Event] = []
        itype = item.get("type")
        if self.open is not None and self.open.key == key:
            if not self.open.parts:  # the upstream sent the item whole: replay it as one delta
                if itype == "message":
                    text = _content_text(item)
                    if text:
                        out += self.text(key, text)
                elif itype == "reasoning":
                    text = _content_text(item)
                    if text:
                        out += self.reasoning(key, text)
                elif itype == "function_call" and item.get("arguments"):
                    out += self.call_delta(key, as_str(item.get("arguments")))
                elif itype == "custom_tool_call" and item.get("input"):
                    out += self.call_delta(key, as_str(item.get("input")))
            if self.phases and self.open.kind == "message":
                return out  # its phase is known once the next item opens or the round ends
            out += self.close()
        elif key not in self.closed_keys and isinstance(itype, str):
            if itype in ("message", "reasoning", "function_call", "custom_tool_call"):
                out += self.ensure(key, itype, call_id=item.get("call_id"), name=item.get("name"))
                return out + self.item_done(key, item)
            self.following = itype
            try:
                out += self.close()
            finally:
                self.following = None
            whole = dict(item)
            whole["id"] = new_id("item")
            out += self.whole(whole)
            self.closed_keys.add(key)
        return out

    def close(self) -> list[Event]:
        """Close the open item, if any: its done events, and the item joins the output."""
        current, self.open = self.open, None
        if current is None:
            return []
        self.closed_keys.add(current.key)
        sink = self.sink
        item = dict(current.item)
        text = "".join(current.parts)
        if current.hidden:
            assert self.tools is not None
            self.gateway_calls += 1
            return self.tools.on_gateway_call(self, item["call_id"], item["name"], text)
        if current.deferred:
            self.client_calls += 1
            self.async_calls += 1
            self.deferred.append((current.kind, item["call_id"], item["name"], text))
            return []
        whole = WHOLE_ITEMS.get(current.kind)
        if whole is not None:
            self.client_calls += 1
            return self.whole(whole(translate.mint_item_id(current.kind), item["call_id"], text))
        if current.kind in ("function_call", "custom_tool_call"):
            self.client_calls += 1
            self.async_calls += item.get(async_tools.ASYNC) is True
        item_id, index = item["id"], current.index
        out: list[Event] = []
        self.open = current  # part_event reads the open item
        annotations: list[dict[str, Any]] = []
        if current.kind == "message" and current.citations is not None:
            held = current.citations.flush()  # an unfinished marker is plain text
            if held:
                out.append(self._text_delta(held))
                text += held
            annotations = current.citations.annotations
        if current.kind == "message":
            out.append(
                sink.make(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            part = {"type": "output_text", "text": text, "annotations": annotations, "logprobs": []}
            out.append(self.part_event("response.content_part.done", part))
            item["status"] = "completed"
            item["content"] = [part]
            if self.phases:
                ends_turn = self.following is None and not (self.client_calls or self.gateway_calls)
                item["phase"] = "final_answer" if ends_turn else "commentary"
        elif current.kind == "reasoning":
            out.append(
                sink.make(
                    "response.reasoning_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                )
            )
            out.append(
                self.part_event("response.content_part.done", {"type": "reasoning_text", "text": text})
            )
            item["content"] = [{"type": "reasoning_text", "text": text}]
        elif current.kind == "custom_tool_call":
            if current.buffered:
                text = custom_input(text)
                if text:
                    out.append(
                        sink.make(
                            "response.custom_tool_call_input.delta",
                            item_id=item_id,
                            output_index=index,
                            delta=text,
                        )
                    )
            out.append(
                sink.make(
                    "response.custom_tool_call_input.done", item_id=item_id, output_index=index, input=text
                )
            )
            item["status"] = "completed"
            item["input"] = text
        else:
            out.append(
                sink.make(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    arguments=text,
                )
            )
            item["status"] = "completed"
            item["arguments"] = text
        self.open = None
        self.retain(len(orjson.dumps(item)) - len(text))
        out.append(sink.make("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        return out

    def whole(self, item: dict[str, Any]) -> list[Event]:
        """Append a finished item: its ``output_item.added`` and ``output_item.done``."""
        if self.item_fields:
            item = {**item, **self.item_fields}
        index = len(self.output)
        self.retain(len(orjson.dumps(item)))
        out = [
            self.sink.make("response.output_item.added", output_index=index, item=item),
            self.sink.make("response.output_item.done", output_index=index, item=item),
        ]
        self.output.append(item)
        return out
