"""Async client tools (``async: true``), emulated in front of a model server that stops at every call.

Which tools and calls are async (read from the call item itself, so a re-declaration does not change
a pending call); request and follow-up validation (a pending async call may go unanswered or be
answered more than once); the per-round upstream hints (never stored); and :class:`AsyncRounds`: a
round whose only client calls are async goes on, two such rounds in a row end the response.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core import errors

ASYNC = "async"
# Item types that can carry ``async`` (the SDK's ResponseFunctionToolCall / ResponseCustomToolCall).
ASYNC_CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
# Tool types that can be declared async (also as members of a namespace).
ASYNC_TOOL_TYPES = frozenset({"function", "custom"})
_OUTPUT_OF = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}

# Async rounds in a row after which the response ends even though the model called async tools again.
MAX_ASYNC_ROUNDS = 2

BACKGROUND_HINT = (
    "This tool runs in the background: calling it starts the work and returns at once, without a "
    "result. The result arrives later as this call's output. Do not wait for it and do not invent "
    "it; go on with what you can do without it."
)
# A name or call_id is quoted in a note only when it is a plain identifier: anything else (text a
# client or model chose) could read as an instruction.
_PLAIN = re.compile(r"[A-Za-z0-9_-]{1,64}")


# --- declarations and calls -----------------------------------------------------------------------


def declares_async(tool: Any) -> bool:
    """A ``function`` / ``custom`` declaration with ``async: true``."""
    return isinstance(tool, Mapping) and tool.get("type") in ASYNC_TOOL_TYPES and tool.get(ASYNC) is True


def request_declares_async(tools: Iterable[Any] | None) -> bool:
    """Whether any declared tool (or namespace member) is async."""
    for tool in tools or ():
        if declares_async(tool):
            return True
        members = tool.get("tools") if isinstance(tool, Mapping) and tool.get("type") == "namespace" else None
        if isinstance(members, list) and any(declares_async(member) for member in members):
            return True
    return False


def call_is_async(item: Any) -> bool:
    """A function or custom tool call that says ``async: true`` itself."""
    return isinstance(item, Mapping) and item.get("type") in ASYNC_CALL_TYPES and item.get(ASYNC) is True


def replays_async(items: Any) -> bool:
    """Whether request ``input`` replays an async call."""
    return isinstance(items, list) and any(call_is_async(item) for item in items)


def needs_executor(tools: Iterable[Any] | None, items: Any) -> bool:
    """Requests that declare an async tool or replay an async call always run through the executor
    (the upstream's own ``/v1/responses`` knows nothing of async)."""
    return request_declares_async(tools) or replays_async(items)


def async_upstream_names(client_tools: Iterable[Any]) -> frozenset[str]:
    """The names the model knows the async tools by (``translate.ClientTool`` entries)."""
    return frozenset(t.upstream_name for t in client_tools if declares_async(t.declaration))


# --- request validation -----------------------------------------------------------------------------


def _unknown(param: str) -> errors.BadRequest:
    return errors.BadRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")


def _check_flag(value: Any, param: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise errors.invalid_type(param, "a boolean", value)


def check_tool_declaration(tool: Mapping[str, Any], param: str) -> None:
    """``async``: a boolean on ``function`` / ``custom`` tools and namespace members; elsewhere an
    unknown parameter."""
    kind = tool.get("type")
    if kind in ASYNC_TOOL_TYPES:
        _check_flag(tool.get(ASYNC), f"{param}.{ASYNC}")
    elif ASYNC in tool:
        raise _unknown(f"{param}.{ASYNC}")
    if kind == "namespace" and isinstance(tool.get("tools"), list):
        for index, member in enumerate(tool["tools"]):
            if isinstance(member, Mapping):
                check_tool_declaration(member, f"{param}.tools[{index}]")


def check_item(item: Mapping[str, Any], kind: str, param: str) -> None:
    """``async`` on an input item: a boolean on function and custom tool calls, else unknown."""
    if kind in ASYNC_CALL_TYPES:
        _check_flag(item.get(ASYNC), f"{param}.{ASYNC}")
    elif ASYNC in item:
        raise _unknown(f"{param}.{ASYNC}")


def check_multi_agent(raw: Mapping[str, Any]) -> None:
    """Multi-agent mode with an explicit ``parallel_tool_calls: true`` and an async tool: refused.
    The gateway defaults ``parallel_tool_calls`` to false, so only an explicit true conflicts."""
    multi_agent = raw.get("multi_agent")
    if isinstance(multi_agent, Mapping) and multi_agent.get("enabled") is True:
        check_parallel_async(raw)


def check_parallel_async(raw: Mapping[str, Any]) -> None:
    """In multi-agent mode (a fresh request, or a continuation of a stored agent tree): an explicit
    ``parallel_tool_calls: true`` with an async tool is refused, in OpenAI's recorded words."""
    tools = raw.get("tools")
    if raw.get("parallel_tool_calls") is True and isinstance(tools, list) and request_declares_async(tools):
        raise errors.BadRequest(
            "Async parallel tool calls are not yet supported in multi-agent mode.",  # OpenAI's words
            param="multi_agent",
            code="unsupported_value",
        )


# --- follow-up validation -----------------------------------------------------------------------


def check_tool_outputs(
    history: list[dict[str, Any]], new_items: list[dict[str, Any]], call_types: Mapping[str, str]
) -> None:
    """OpenAI's pairing rules on ``history`` + ``new_items``, except that an async call may stay
    unanswered or be answered repeatedly. ``call_types``: call item type → its output type."""
    output_types = set(call_types.values())
    calls: dict[str, bool] = {}  # call_id -> async (the first call item with that id decides)
    outputs: set[str] = set()
    for item in (*history, *new_items):
        kind = item.get("type")
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            continue
        if kind in call_types:
            calls.setdefault(call_id, call_is_async(item))
        elif kind in output_types:
            outputs.add(call_id)
    for item in new_items:
        if item.get("type") in output_types and item.get("call_id") not in calls:
            raise errors.BadRequest(
                f"No tool call found for function call output with call_id {item.get('call_id')}.",
                param="input",
            )
    for call_id, is_async in calls.items():
        if call_id not in outputs and not is_async:
            raise errors.BadRequest(f"No tool output found for function call {call_id}.", param="input")


def check_multi_agent_outputs(history: list[dict[str, Any]], new_items: list[dict[str, Any]]) -> None:
    """Multi-agent mode: an async call the client itself supplied (no agent attribution) accepts one
    output; a further one is refused (spec)."""
    supplied: set[Any] = set()
    for item in history:
        if call_is_async(item) and "agent" not in item:
            supplied.add(item.get("call_id"))
    supplied |= {item.get("call_id") for item in new_items if call_is_async(item)}
    answered = {item.get("call_id") for item in history if item.get("type") in _OUTPUT_OF.values()}
    for item in new_items:
        call_id = item.get("call_id")
        if item.get("type") not in _OUTPUT_OF.values() or call_id not in supplied:
            continue
        if call_id in answered:
            raise errors.BadRequest(
                f"In multi-agent mode an async call supplied in the request input accepts one "
                f"output; call_id {call_id} already has one.",
                param="input",
                code="invalid_value",
            )
        answered.add(call_id)


def pending_calls(items: Iterable[Mapping[str, Any]]) -> set[str]:
    """call_ids of the async calls in ``items`` whose output is not among ``items``."""
    calls: set[str] = set()
    answered: set[str] = set()
    for item in items:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            continue
        if call_is_async(item):
            calls.add(call_id)
        elif item.get("type") in _OUTPUT_OF.values():
            answered.add(call_id)
    return calls - answered


def retained_async_items(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The async calls of ``items`` and their outputs, in order: what a compacted history keeps verbatim
    (spec), so a pending call stays in context and a later output still finds its call."""
    items = list(items)
    calls = {item.get("call_id") for item in items if call_is_async(item)}
    return [
        item
        for item in items
        if call_is_async(item) or (item.get("type") in _OUTPUT_OF.values() and item.get("call_id") in calls)
    ]


# --- the upstream hints -------------------------------------------------------------------------


def hinted_description(description: Any) -> str:
    text = description if isinstance(description, str) else ""
    return f"{text}\n\n{BACKGROUND_HINT}" if text else BACKGROUND_HINT


def hint_responses_tools(tools: list[dict[str, Any]], names: frozenset[str]) -> list[dict[str, Any]]:
    """Upstream ``/v1/responses`` function tools with the background hint on the async ones."""
    if not names:
        return tools
    return [
        {**t, "description": hinted_description(t.get("description"))}
        if t.get("type") == "function" and t.get("name") in names
        else t
        for t in tools
    ]


def hint_chat_tools(tools: list[dict[str, Any]], names: frozenset[str]) -> list[dict[str, Any]]:
    """Upstream ``/v1/chat/completions`` tools with the background hint on the async ones."""
    if not names:
        return tools
    out = []
    for tool in tools:
        function = tool.get("function")
        if isinstance(function, dict) and function.get("name") in names:
            function = {**function, "description": hinted_description(function.get("description"))}
            tool = {**tool, "function": function}
        out.append(tool)
    return out


def pending_note(name: Any, call_id: Any) -> str:
    """The note that follows a pending async call; names the tool and call_id only when each is a
    plain identifier."""
    plain_name = isinstance(name, str) and _PLAIN.fullmatch(name) is not None
    plain_id = isinstance(call_id, str) and _PLAIN.fullmatch(call_id) is not None
    if plain_name and plain_id:
        subject = f"The call to {name} (call_id {call_id})"
    elif plain_name:
        subject = f"The call to {name} above"
    elif plain_id:
        subject = f"The tool call above (call_id {call_id})"
    else:
        subject = "The tool call above"
    return (
        f"{subject} is running in the background; its result has not arrived yet. Do not invent "
        "it: it will arrive later as this call's output. Continue with what you can do without it."
    )


def model_view(items: list[dict[str, Any]], *, chat: bool) -> list[dict[str, Any]]:
    """The model's input items of one round (upstream form) with the pending-call notes, for the
    chat wire (``chat``) or the ``/v1/responses`` wire."""
    return with_pending_notes(items, pending_calls(items), as_tool_output=chat)


def with_pending_notes(
    items: list[dict[str, Any]], pending: set[str], *, as_tool_output: bool
) -> list[dict[str, Any]]:
    """The model's input items with a note after each pending async call, and without ``async``.

    The note is a developer message on ``/v1/responses``, but the call's ``tool`` message on the chat
    wire: chat rendering would move developer text away from the call, and several chat templates want
    an answer after every tool call.
    """
    out: list[dict[str, Any]] = []
    for item in items:
        if ASYNC not in item:
            out.append(item)
            continue
        out.append({k: v for k, v in item.items() if k != ASYNC})
        call_id = item.get("call_id")
        if not (call_is_async(item) and call_id in pending):
            continue
        note = pending_note(item.get("name"), call_id)
        if as_tool_output:
            out.append({"type": "function_call_output", "call_id": call_id, "output": note})
        else:
            out.append(
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": note}]}
            )
    return out


# --- the round decision -------------------------------------------------------------------------


@dataclass
class AsyncRounds:
    """Counts rounds in which the model called async tools (and no synchronous client tool)."""

    streak: int = 0

    def after_round(self, *, async_calls: int, sync_calls: int) -> bool:
        """Whether the response goes on because of this round's async calls: only async client
        calls were made, and fewer than :data:`MAX_ASYNC_ROUNDS` such rounds ran in a row."""
        if sync_calls or not async_calls:
            self.streak = 0
            return False
        self.streak += 1
        return not self.exhausted

    def next_round(
        self, *, completed: bool, sync_calls: int, async_calls: int, gateway_calls: bool, ends_response: bool
    ) -> bool:
        """Another round follows a completed round without synchronous client calls or an approval request,
        when it ran gateway calls or its only client calls were async."""
        async_more = self.after_round(async_calls=async_calls, sync_calls=sync_calls)
        if not completed or sync_calls or ends_response or self.exhausted:
            return False
        return gateway_calls or async_more

    @property
    def exhausted(self) -> bool:
        """:data:`MAX_ASYNC_ROUNDS` async rounds in a row: the response ends after this round, even
        when it also ran gateway tools."""
        return self.streak >= MAX_ASYNC_ROUNDS
