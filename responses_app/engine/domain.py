"""The shared types of a Responses run, so that no collaborator imports another for a type.

:class:`Prepared` (a validated request with its history), :class:`Usage`, :class:`OpenItem` (the
item being streamed), :class:`RoundState` (what a round reports back), the :class:`Emitting` and
:class:`GatewayCalls` protocols, and the stored forms (:func:`base_snapshot`,
:func:`strip_credentials`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gateway.core.principal import DEFAULT_PRINCIPAL, Principal
from inference_app.tools import strip_credentials as strip_tool
from responses_app.engine.echo import echoed_tool, tool_usage

if TYPE_CHECKING:
    from gateway.core.sse import Event, EventSink
    from responses_app.engine.translate import ToolMap
    from responses_app.protocol.schemas import ResponseCreateRequest

TERMINAL_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


@dataclass
class Prepared:
    """A validated request with its history resolved; everything the executor needs."""

    request: ResponseCreateRequest
    raw: dict[str, Any]
    owner: str
    response_id: str
    created_at: int
    history: list[dict[str, Any]]  # stored items this response continues from (ids set)
    new_items: list[dict[str, Any]]  # this request's input items (our ids set)
    items_to_insert: list[dict[str, Any]]  # the subset of new_items not stored yet
    store: bool
    headers: dict[str, str]
    previous_response_id: str | None = None
    conversation_id: str | None = None
    conversation_revision: int = 0
    prompt_cache_options: dict[str, Any] | None = None
    background: bool = False
    # The client tools as the upstream sees them (built, and collisions refused, at preparation).
    tool_map: ToolMap | None = None
    # The agent tree a multi-agent continuation restores (``responses_app.features.multi_agent``).
    agent_tree: dict[str, Any] | None = None
    # Who the usage ledger charges each upstream call to, and the request that caused it (a
    # background response may run in another context: ``responses_app.engine.metering``).
    principal: Principal = DEFAULT_PRINCIPAL
    request_id: str = ""
    # The lineage of this response's model rounds (``storage.prepare.response_lineage``); None: none.
    lineage: str | None = None


@dataclass
class Usage:
    """Usage summed over rounds. Absent counters stay absent; nothing is derived."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int | None = None
    input_details: dict[str, int] = field(default_factory=dict)
    output_details: dict[str, int] = field(default_factory=dict)
    reported: bool = False
    reports: int = 0  # how many usage objects were added (a round's own report: the ledger's delta)

    @staticmethod
    def _add_details(into: dict[str, int], details: Any) -> None:
        if not isinstance(details, dict):
            return
        for key, value in details.items():
            if isinstance(value, int) and not isinstance(value, bool):
                into[key] = into.get(key, 0) + value

    def add(
        self, *, input_tokens: Any, output_tokens: Any, total: Any, input_details: Any, output_details: Any
    ) -> None:
        self.reported = True
        self.reports += 1
        self.input_tokens += input_tokens if isinstance(input_tokens, int) else 0
        self.output_tokens += output_tokens if isinstance(output_tokens, int) else 0
        if isinstance(total, int):
            self.total_tokens = (self.total_tokens or 0) + total
        self._add_details(self.input_details, input_details)
        self._add_details(self.output_details, output_details)

    def add_reported(self, usage: dict[str, Any]) -> None:
        """Add a usage object in the Responses shape (``input_tokens``, ``…_details``, …)."""
        self.add(
            input_tokens=usage.get("input_tokens"),
            output_tokens=usage.get("output_tokens"),
            total=usage.get("total_tokens"),
            input_details=usage.get("input_tokens_details"),
            output_details=usage.get("output_tokens_details"),
        )

    @classmethod
    def total(cls, parts: Iterable[Usage]) -> Usage:
        """The sum of ``parts`` (each counted its own rounds); those that reported nothing add nothing."""
        total = cls()
        for u in parts:
            if u.reported:
                total.add(
                    input_tokens=u.input_tokens,
                    output_tokens=u.output_tokens,
                    total=u.total_tokens,
                    input_details=u.input_details,
                    output_details=u.output_details,
                )
        return total

    def as_dict(self) -> dict[str, Any] | None:
        if not self.reported:
            return None
        total = self.total_tokens
        if total is None:
            total = self.input_tokens + self.output_tokens
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": dict(self.input_details),
            "output_tokens": self.output_tokens,
            "output_tokens_details": dict(self.output_details),
            "total_tokens": total,
        }


@dataclass
class OpenItem:
    """The output item being streamed, keyed by the upstream's own position for it."""

    key: Any
    kind: str  # message | reasoning | function_call | custom_tool_call | a whole-call item type
    item: dict[str, Any]
    index: int
    parts: list[str] = field(default_factory=list)
    buffered: bool = False  # custom tool over chat: the JSON arguments are decoded at the end
    hidden: bool = False  # a gateway tool call: nothing streams; the tool loop emits its public item
    deferred: bool = False  # an async call after a gateway call: held until the round's tools ran
    citations: Any = None  # a message's CitationText once file citations are possible


@dataclass
class RoundState:
    """One inference round as its stream parser saw it; the round loop reads it when it ends."""

    number: int
    status: str = "completed"  # completed | incomplete
    tier: str | None = None  # the served service tier, when the upstream said
    streamed: bool = False  # output came as item events (not only in the terminal event)
    incomplete_details: dict[str, Any] | None = None  # set with status "incomplete"
    # The last upstream event completed an item lifecycle and left no item open: a safe boundary.
    settled: bool = False
    steered: bool = False  # the round stopped at a safe boundary for steering
    # What the upstream said of itself, for the round's span: its response id, model, finish reason.
    response_id: str | None = None
    response_model: str | None = None
    finish_reason: str | None = None  # chat completions only (Responses: from the status)


class Emitting(Protocol):
    """What the tool loop may do with the response's output: append items through the sink, under
    the ``max_retained_bytes`` budget."""

    output: list[dict[str, Any]]
    sink: EventSink
    client_tools: ToolMap  # what a server-run tool search loads into
    item_fields: dict[str, Any]  # added to every item (multi-agent: the agent that made it)
    citable: dict[str, str]  # file_id -> filename: the file_search results the model may cite

    def retain(self, size: int) -> None: ...

    def whole(self, item: dict[str, Any]) -> list[Event]: ...


class GatewayCalls(Protocol):
    """What the emitter asks the tool loop while a round streams."""

    def is_gateway(self, name: str) -> bool: ...

    def on_gateway_call(self, ex: Emitting, call_id: str, name: str, arguments: str) -> list[Event]: ...


def strip_credentials(raw: dict[str, Any]) -> dict[str, Any]:
    """The request as stored: request-scoped credentials (MCP authorization/headers) removed."""
    out = dict(raw)
    if isinstance(out.get("tools"), list):
        out["tools"] = stripped_tools(out["tools"])
    return out


def stripped_tools(tools: list[Any]) -> list[Any]:
    return [strip_tool(t) if isinstance(t, dict) else t for t in tools]


def base_snapshot(p: Prepared, status: str) -> dict[str, Any]:
    """The response object for ``p`` (no output yet): every field of the SDK's ``Response``, with
    OpenAI's defaults where the request set nothing."""
    r = p.request
    return {
        "id": p.response_id,
        "object": "response",
        "created_at": p.created_at,
        "status": status,
        "access_programs": None,
        "background": bool(r.background),
        "completed_at": None,
        "conversation": {"id": p.conversation_id} if p.conversation_id else None,
        "error": None,
        "image": None,
        "incomplete_details": None,
        "input_transformations": None,
        "instructions": r.instructions,
        "max_output_tokens": r.max_output_tokens,
        "max_tool_calls": r.max_tool_calls,
        "metadata": r.metadata or {},
        "model": r.model,
        "moderation": None,
        "output": [],
        "parallel_tool_calls": r.parallel_tool_calls is True,  # false unless asked for (spec)
        "previous_response_id": p.previous_response_id,
        "prompt": r.prompt,
        "prompt_cache_diagnostics": None,
        "prompt_cache_key": None,  # request-scoped, never echoed (spec)
        "prompt_cache_options": p.raw.get("prompt_cache_options"),
        "prompt_cache_retention": r.prompt_cache_retention,
        "reasoning": {"context": None, "effort": None, "summary": None, **(r.reasoning or {})},
        "safety_identifier": r.safety_identifier,
        "service_tier": r.service_tier or "auto",  # the served tier replaces it at the end
        "store": p.store,
        "temperature": 1.0 if r.temperature is None else r.temperature,
        "text": {"format": {"type": "text"}, "verbosity": "medium", **(r.text or {})},
        "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
        "tools": [echoed_tool(t) for t in stripped_tools(r.tools or [])],
        "tool_usage": tool_usage([]),
        "top_logprobs": r.top_logprobs or 0,
        "top_p": 1.0 if r.top_p is None else r.top_p,
        "truncation": r.truncation or "disabled",
        "usage": None,
        "user": r.user,
    }
