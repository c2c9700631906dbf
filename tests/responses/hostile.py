"""A hostile upstream: vLLM's own streams (tests/responses/scripts.py) with one member made wrong.

Each kind rewrites one event of a well-formed stream for the script ``HOSTILE_PARTS`` (a message
then a function call): a member of the wrong JSON type, a missing one, or an event that is not an
object at all. The executor must end every one ``failed`` with its stream terminated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.responses.scripts import Part, call, text

HOSTILE_PARTS: list[Part] = [text("Hello", " there"), call("lookup", '{"q":', '"x"}', call_id="call_h1")]

Mutation = Callable[[list[Any]], None]


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _drop(data: dict[str, Any], path: tuple[Any, ...]) -> None:
    for key in path[:-1]:
        data = data[key]
    del data[path[-1]]


def event(kind: str, path: tuple[Any, ...], value: Any, *, nth: int = 0) -> Mutation:
    """``/v1/responses``: set ``path`` in the ``nth`` event of type ``kind`` to ``value``."""

    def mutate(events: list[tuple[str, dict[str, Any]]]) -> None:
        found = [data for name, data in events if name == kind]
        _set(found[nth], path, value)

    return mutate


def event_without(kind: str, path: tuple[Any, ...]) -> Mutation:
    def mutate(events: list[tuple[str, dict[str, Any]]]) -> None:
        _drop(next(data for name, data in events if name == kind), path)

    return mutate


def event_replaced(kind: str, value: Any) -> Mutation:
    """Replace the whole data of the first ``kind`` event (a JSON value that is not an object)."""

    def mutate(events: list[tuple[str, Any]]) -> None:
        at = next(i for i, (name, _) in enumerate(events) if name == kind)
        events[at] = (kind, value)

    return mutate


def chunk(where: Callable[[dict[str, Any]], bool], path: tuple[Any, ...], value: Any) -> Mutation:
    """``/v1/chat/completions``: set ``path`` in the first chunk ``where`` accepts."""

    def mutate(chunks: list[dict[str, Any]]) -> None:
        _set(next(c for c in chunks if where(c)), path, value)

    return mutate


def chunk_replaced(where: Callable[[Any], bool], value: Any) -> Mutation:
    def mutate(chunks: list[Any]) -> None:
        at = next(i for i, c in enumerate(chunks) if where(c))
        chunks[at] = value

    return mutate


def _delta(c: dict[str, Any]) -> dict[str, Any]:
    return dict(c["choices"][0]["delta"]) if c.get("choices") else {}


def _content(c: dict[str, Any]) -> bool:
    return bool(_delta(c).get("content"))


def _tool_start(c: dict[str, Any]) -> bool:
    return "id" in (_delta(c).get("tool_calls") or [{}])[0]


def _tool_args(c: dict[str, Any]) -> bool:
    calls = _delta(c).get("tool_calls") or [{}]
    return "arguments" in calls[0].get("function", {})


def _usage(c: dict[str, Any]) -> bool:
    return "usage" in c


def _any(c: Any) -> bool:
    return True


DONE = "response.output_item.done"
ADDED = "response.output_item.added"
TEXT = "response.output_text.delta"
ARGS = "response.function_call_arguments.delta"
COMPLETED = "response.completed"

RESPONSES_KINDS: dict[str, Mutation] = {
    "item_done_item_is_number": event(DONE, ("item",), 5),
    "item_done_item_missing": event_without(DONE, ("item",)),
    "item_added_item_is_string": event(ADDED, ("item",), "x"),
    "item_added_item_without_type": event_without(ADDED, ("item", "type")),
    "item_added_type_is_number": event(ADDED, ("item", "type"), 7),
    "output_index_is_string": event(TEXT, ("output_index",), "0"),
    "text_delta_is_number": event(TEXT, ("delta",), 5),
    "text_delta_is_object": event(TEXT, ("delta",), {"a": 1}),
    "arguments_delta_is_array": event(ARGS, ("delta",), [1]),
    "message_content_is_number": event(DONE, ("item", "content"), 5),
    "content_part_text_is_number": event(DONE, ("item", "content", 0, "text"), 5),
    "call_name_is_number": event(ADDED, ("item", "name"), 5, nth=1),
    "call_id_is_number": event(DONE, ("item", "call_id"), 7, nth=1),
    "call_arguments_is_number": event(DONE, ("item", "arguments"), 5, nth=1),
    "completed_response_is_number": event(COMPLETED, ("response",), 5),
    "completed_response_missing": event_without(COMPLETED, ("response",)),
    "usage_is_string": event(COMPLETED, ("response", "usage"), "lots"),
    "usage_input_tokens_is_string": event(COMPLETED, ("response", "usage", "input_tokens"), "12"),
    "usage_output_tokens_is_decimal": event(COMPLETED, ("response", "usage", "output_tokens"), 1.5),
    "usage_total_tokens_is_boolean": event(COMPLETED, ("response", "usage", "total_tokens"), True),
    "usage_details_count_is_string": event(
        COMPLETED, ("response", "usage", "input_tokens_details", "cached_tokens"), "x"
    ),
    "completed_output_is_number": event(COMPLETED, ("response", "output"), 5),
    "completed_output_item_is_number": event(COMPLETED, ("response", "output", 0), 5),
    "completed_status_is_number": event(COMPLETED, ("response", "status"), 5),
    "completed_service_tier_is_number": event(COMPLETED, ("response", "service_tier"), 5),
    "event_is_array": event_replaced(TEXT, [1, 2]),
    "event_type_is_number": event(TEXT, ("type",), 5),
    "created_response_is_string": event("response.created", ("response",), "x"),
    "in_progress_response_is_array": event("response.in_progress", ("response",), [1]),
}

CHAT_KINDS: dict[str, Mutation] = {
    "choices_is_number": chunk(_content, ("choices",), 5),
    "choice_is_number": chunk(_content, ("choices", 0), 5),
    "choice_index_is_string": chunk(_content, ("choices", 0, "index"), "0"),
    "delta_is_number": chunk(_content, ("choices", 0, "delta"), 5),
    "delta_is_array": chunk(_content, ("choices", 0, "delta"), [1]),
    "content_is_number": chunk(_content, ("choices", 0, "delta", "content"), 5),
    "content_is_object": chunk(_content, ("choices", 0, "delta", "content"), {"a": 1}),
    "reasoning_is_number": chunk(_content, ("choices", 0, "delta", "reasoning"), 5),
    "finish_reason_is_number": chunk(_content, ("choices", 0, "finish_reason"), 5),
    "tool_calls_is_number": chunk(_tool_start, ("choices", 0, "delta", "tool_calls"), 5),
    "tool_call_is_string": chunk(_tool_start, ("choices", 0, "delta", "tool_calls", 0), "x"),
    "tool_call_index_is_string": chunk(_tool_start, ("choices", 0, "delta", "tool_calls", 0, "index"), "0"),
    "tool_call_id_is_number": chunk(_tool_start, ("choices", 0, "delta", "tool_calls", 0, "id"), 5),
    "tool_call_function_is_number": chunk(
        _tool_start, ("choices", 0, "delta", "tool_calls", 0, "function"), 5
    ),
    "tool_call_name_is_number": chunk(
        _tool_start, ("choices", 0, "delta", "tool_calls", 0, "function", "name"), 5
    ),
    "tool_call_arguments_is_number": chunk(
        _tool_args, ("choices", 0, "delta", "tool_calls", 0, "function", "arguments"), 5
    ),
    "usage_is_string": chunk(_usage, ("usage",), "lots"),
    "usage_prompt_tokens_is_string": chunk(_usage, ("usage", "prompt_tokens"), "13"),
    "usage_completion_tokens_is_decimal": chunk(_usage, ("usage", "completion_tokens"), 1.5),
    "usage_total_tokens_is_boolean": chunk(_usage, ("usage", "total_tokens"), True),
    "usage_details_is_string": chunk(_usage, ("usage", "prompt_tokens_details"), "x"),
    "service_tier_is_number": chunk(_content, ("service_tier",), 5),
    "chunk_is_array": chunk_replaced(_content, [1, 2]),
    "chunk_is_string": chunk_replaced(_content, "x"),
}


# --- the answer to a "stream": false round (a JSON client's) ----------------------------------------

AnswerMutation = Callable[[Any], Any]


def answer(path: tuple[Any, ...], value: Any) -> AnswerMutation:
    """Set ``path`` in the answer (the Responses object, or the chat completion) to ``value``."""

    def mutate(data: Any) -> Any:
        _set(data, path, value)
        return data

    return mutate


def answer_without(path: tuple[Any, ...]) -> AnswerMutation:
    def mutate(data: Any) -> Any:
        _drop(data, path)
        return data

    return mutate


def answer_replaced(value: Any) -> AnswerMutation:
    return lambda _: value


RESPONSES_ANSWER_KINDS: dict[str, AnswerMutation] = {
    "answer_is_array": answer_replaced([1, 2]),
    "answer_is_string": answer_replaced("x"),
    "output_is_number": answer(("output",), 5),
    "output_item_is_number": answer(("output", 0), 5),
    "output_item_without_type": answer_without(("output", 0, "type")),
    "output_item_type_is_number": answer(("output", 0, "type"), 7),
    "message_content_is_number": answer(("output", 0, "content"), 5),
    "content_part_text_is_number": answer(("output", 0, "content", 0, "text"), 5),
    "call_name_is_number": answer(("output", 1, "name"), 5),
    "call_id_is_number": answer(("output", 1, "call_id"), 7),
    "call_arguments_is_number": answer(("output", 1, "arguments"), 5),
    "status_is_number": answer(("status",), 5),
    "service_tier_is_number": answer(("service_tier",), 5),
    "usage_is_string": answer(("usage",), "lots"),
    "usage_input_tokens_is_string": answer(("usage", "input_tokens"), "12"),
    "usage_output_tokens_is_decimal": answer(("usage", "output_tokens"), 1.5),
    "usage_details_count_is_string": answer(("usage", "input_tokens_details", "cached_tokens"), "x"),
}

CHAT_ANSWER_KINDS: dict[str, AnswerMutation] = {
    "answer_is_array": answer_replaced([1, 2]),
    "answer_is_string": answer_replaced("x"),
    "choices_is_number": answer(("choices",), 5),
    "choice_is_number": answer(("choices", 0), 5),
    "choice_index_is_string": answer(("choices", 0, "index"), "0"),
    "message_is_number": answer(("choices", 0, "message"), 5),
    "content_is_number": answer(("choices", 0, "message", "content"), 5),
    "reasoning_is_number": answer(("choices", 0, "message", "reasoning"), 5),
    "finish_reason_is_number": answer(("choices", 0, "finish_reason"), 5),
    "tool_calls_is_number": answer(("choices", 0, "message", "tool_calls"), 5),
    "tool_call_is_string": answer(("choices", 0, "message", "tool_calls", 0), "x"),
    "tool_call_id_is_number": answer(("choices", 0, "message", "tool_calls", 0, "id"), 5),
    "tool_call_name_is_number": answer(("choices", 0, "message", "tool_calls", 0, "function", "name"), 5),
    "tool_call_arguments_is_number": answer(
        ("choices", 0, "message", "tool_calls", 0, "function", "arguments"), 5
    ),
    "usage_is_string": answer(("usage",), "lots"),
    "usage_prompt_tokens_is_string": answer(("usage", "prompt_tokens"), "13"),
    "service_tier_is_number": answer(("service_tier",), 5),
}
