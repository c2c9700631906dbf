"""The one items ↔ messages module.

* ``normalize_input`` turns the request's ``input`` (a string or a list of items / easy messages)
  into Responses input items;
* ``output_to_input`` is the single conversion of an output item (what a response returned) into
  the input item that continues the conversation;
* ``items_to_messages`` renders Responses items as Chat Completions messages for upstreams that
  only speak ``/v1/chat/completions``. System and developer text is merged into one leading system
  message, because several chat templates refuse a second system message.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.ids import new_id

# Our public id prefix for each stored item type.
ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
}

CALL_TYPES = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
OUTPUT_TYPES = {v: k for k, v in CALL_TYPES.items()}


def mint_item_id(item_type: str) -> str:
    return new_id(ID_PREFIX.get(item_type, "item"))


def _text_part(role: str, text: str) -> dict[str, Any]:
    if role == "assistant":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": "input_text", "text": text}


def normalize_input(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Request ``input`` as a list of typed input items (``type`` always set)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [_text_part("user", value)]}]
    items: list[dict[str, Any]] = []
    for raw in value:
        item = dict(raw)
        kind = item.setdefault("type", "message")
        if kind == "message" and isinstance(item.get("content"), str):
            role = str(item.get("role", "user"))
            item["content"] = [_text_part(role, item["content"])]
        items.append(item)
    return items


def output_to_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the input item that replays it (the one output→input conversion)."""
    kind = item.get("type")
    if kind == "message":
        parts = []
        for part in item.get("content") or ():
            part = dict(part)
            part.pop("logprobs", None)  # not an input field
            parts.append(part)
        out = {k: v for k, v in item.items() if k != "content"}
        out["content"] = parts
        return out
    if kind == "reasoning":
        return {k: v for k, v in item.items() if v is not None}
    return item


# --- Chat Completions rendering ----------------------------------------------------------------


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
    return "".join(texts)


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    """User content as a plain string, or chat content parts when it carries images."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    has_media = False
    for part in content or ():
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            has_media = True
            url = part.get("image_url") or part.get("file_id") or ""
            image: dict[str, Any] = {"url": url}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file" and part.get("file_data"):
            has_media = True
            parts.append({"type": "file", "file": {"file_data": part["file_data"]}})
    if not has_media:
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(value: Any) -> str:
    """A tool output (string or content parts) as the text of a ``tool`` message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _content_text(value)
    return orjson.dumps(value).decode()


def items_to_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items → Chat Completions messages."""
    system_parts: list[str] = [instructions] if instructions else []
    messages: list[dict[str, Any]] = []
    pending_reasoning: list[str] = []
    assistant: dict[str, Any] | None = None  # the assistant message being assembled

    def flush_assistant() -> None:
        nonlocal assistant
        if assistant is not None:
            messages.append(assistant)
            assistant = None

    def open_assistant() -> dict[str, Any]:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": None}
            if pending_reasoning:
                assistant["reasoning"] = "".join(pending_reasoning)
                pending_reasoning.clear()
        return assistant

    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role in ("system", "developer"):
                text = _content_text(item.get("content"))
                if text:
                    system_parts.append(text)
                continue
            if role == "assistant":
                msg = open_assistant()
                if msg.get("tool_calls"):
                    flush_assistant()
                    msg = open_assistant()
                text = _content_text(item.get("content"))
                msg["content"] = (msg["content"] or "") + text
                continue
            flush_assistant()
            messages.append({"role": "user", "content": _user_content(item.get("content"))})
        elif kind == "reasoning":
            flush_assistant()
            text = "".join(
                part.get("text", "") for part in item.get("content") or () if isinstance(part, dict)
            ) or "".join(part.get("text", "") for part in item.get("summary") or () if isinstance(part, dict))
            if text:
                pending_reasoning.append(text)
        elif kind in ("function_call", "custom_tool_call"):
            msg = open_assistant()
            arguments = item.get("arguments", "")
            if kind == "custom_tool_call":
                arguments = orjson.dumps({"input": item.get("input", "")}).decode()
            msg.setdefault("tool_calls", []).append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": arguments},
                }
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            flush_assistant()
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _output_text(item.get("output")),
                }
            )
        # Other item types (gateway tool calls, compaction) have no chat rendering yet.
    flush_assistant()
    if system_parts:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system_parts)})
    return messages


def tools_to_chat(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Client tools as Chat Completions function tools (a custom tool takes one string ``input``)."""
    out: list[dict[str, Any]] = []
    for tool in tools or ():
        if tool.get("type") == "function":
            function: dict[str, Any] = {"name": tool["name"]}
            if tool.get("description") is not None:
                function["description"] = tool["description"]
            function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            if tool.get("strict") is not None:
                function["strict"] = tool["strict"]
            out.append({"type": "function", "function": function})
        elif tool.get("type") == "custom":
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description") or "",
                        "parameters": {
                            "type": "object",
                            "properties": {"input": {"type": "string"}},
                            "required": ["input"],
                        },
                    },
                }
            )
    return out


def tool_choice_to_chat(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") in ("function", "custom") and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return None


def text_to_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None
