"""Anthropic Messages: the gateway's server-tool loop (Claude Code's web search and web fetch).

A request declaring ``web_search_*`` / ``web_fetch_*`` (or a ``[messages] tool_aliases`` function)
is served here in hidden rounds: the server tools go upstream as plain functions, their calls run on
the Responses tool framework, at most ``[responses] max_rounds`` times (then ``pause_turn``). The
client sees Anthropic's ``server_tool_use`` and result blocks and upstream errors unmodified.
Nothing is stored (``docs/claude-code.md``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.core import errors, spans
from gateway.core.asgi import (
    SSE_CONTENT_TYPE,
    DisconnectWatch,
    Exchange,
    RawHeaders,
    Receive,
    Scope,
    Send,
    client_left,
    send_error,
)
from gateway.core.config import Config, get_config
from gateway.core.ids import new_id
from gateway.core.principal import DEFAULT_PRINCIPAL, Principal, scope_principal
from inference_app.tools import (
    FunctionDef,
    ToolCall,
    ToolCallBudget,
    ToolResult,
    run_gateway_calls,
    single_query_web_search_function,
    web_fetch_function,
)
from inference_app.upstream import lineage
from inference_app.upstream.forward import Route, forward
from inference_app.upstream.http import UpstreamResponse, get_upstream
from messages_app import lineage as messages_lineage
from messages_app.rounds import Round, RoundError, StreamRound, parse_json_round, sse_event, sse_events
from usage_app.tap import ModelCall

UPSTREAM_PATH = "/v1/messages"
# count_tokens of a request that declares gateway tools: its body rewritten, then relayed as usual.
COUNT_TOKENS = Route("/v1/messages/count_tokens", stream_error=errors.anthropic_sse_error)
KINDS = ("web_search", "web_fetch")
# The first version of each server tool; these are accepted without ``allowed_callers``.
BASE_VERSIONS = {"web_search": "20250305", "web_fetch": "20250910"}
_SERVER_TYPE = re.compile(r"^(web_search|web_fetch)_(\d{8})$")
_RESULT_TYPES = {"web_search": "web_search_tool_result", "web_fetch": "web_fetch_tool_result"}
_USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
USAGE_MAX = 2**63 - 1
_ROUND_ERROR = "The upstream model server sent a malformed response"


# --- the decision ----------------------------------------------------------------------------------


def _server_kind(tool: Any) -> str | None:
    """``web_search`` / ``web_fetch`` for an Anthropic server-tool declaration of either, any version."""
    if isinstance(tool, Mapping) and isinstance(tool.get("type"), str):
        match = _SERVER_TYPE.match(tool["type"])
        if match:
            return match.group(1)
    return None


def _alias_kind(tool: Any, aliases: Mapping[str, str]) -> str | None:
    if (
        isinstance(tool, Mapping)
        and tool.get("type") in (None, "custom")
        and isinstance(tool.get("name"), str)
    ):
        return aliases.get(tool["name"])
    return None


def declares_gateway_tools(body: bytes) -> bool:
    """Whether a ``/v1/messages`` body declares a tool the gateway runs (then this module serves
    it); a body that is not a JSON object goes to the upstream, which answers it."""
    aliases = get_config().messages.aliases()
    # find, not "in": bytes.__contains__ first tries its operand as an integer (a TypeError raised
    # and cleared for every bytes operand).
    if (
        body.find(b"web_search_") < 0
        and body.find(b"web_fetch_") < 0
        and not any(body.find(b'"' + name.encode() + b'"') >= 0 for name in aliases)
    ):
        return False
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, list):
        return False
    return any(_server_kind(t) is not None or _alias_kind(t, aliases) is not None for t in tools)


# --- the plan --------------------------------------------------------------------------------------


@dataclass
class ServerTool:
    """One gateway tool of the request: what the model calls, and what the call needs."""

    function: FunctionDef
    declaration: dict[str, Any]  # the ToolCall's ``tool``: filters, user_location, max_content_tokens
    budget: ToolCallBudget

    @property
    def kind(self) -> str:
        return self.function.kind


@dataclass
class Plan:
    body: dict[str, Any]
    stream: bool
    tools: dict[str, ServerTool]  # by the function name the model calls
    client_tools: list[Any]
    by_kind: dict[str, str] = field(default_factory=dict)  # kind -> function name

    def upstream_tools(self) -> list[Any]:
        offered = [
            t.function.as_anthropic_tool() for t in self.tools.values() if t.budget.offer_gateway_tools
        ]
        return [*self.client_tools, *offered]


def _bad(message: str) -> errors.BadRequest:
    return errors.BadRequest(message)


def _domains(tool: Mapping[str, Any], key: str, index: int) -> list[str] | None:
    value = tool.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        raise _bad(f"tools.{index}.{key}: Input should be a valid list of strings")
    return value


def _server_tool(tool: Mapping[str, Any], kind: str, index: int) -> ServerTool:
    version = tool["type"].rsplit("_", 1)[1]
    callers = tool.get("allowed_callers")
    later = version > BASE_VERSIONS[kind] and isinstance(callers, list) and "direct" in callers
    if version != BASE_VERSIONS[kind] and not later:
        raise _bad(
            f"tools.{index}: server tool type {tool['type']!r} is not supported by this gateway: use "
            f'{kind}_{BASE_VERSIONS[kind]}, or a later version whose allowed_callers includes "direct"'
        )
    name = tool.get("name")
    if name != kind:
        raise _bad(f"tools.{index}.name: the {tool['type']} tool must be named {kind!r}")
    allowed = _domains(tool, "allowed_domains", index)
    blocked = _domains(tool, "blocked_domains", index)
    if allowed and blocked:
        raise _bad(f"tools.{index}: allowed_domains and blocked_domains cannot be used together")
    max_uses = tool.get("max_uses")
    if max_uses is not None and (isinstance(max_uses, bool) or not isinstance(max_uses, int) or max_uses < 1):
        raise _bad(f"tools.{index}.max_uses: must be a positive integer")
    declaration: dict[str, Any] = {"type": tool["type"]}
    if kind == "web_search":
        declaration["filters"] = {"allowed_domains": allowed or [], "blocked_domains": blocked or []}
        if isinstance(tool.get("user_location"), Mapping):
            declaration["user_location"] = dict(tool["user_location"])
        function = single_query_web_search_function(name, index)
    else:
        declaration["allowed_domains"] = allowed or []
        declaration["blocked_domains"] = blocked or []
        limit = tool.get("max_content_tokens")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise _bad(f"tools.{index}.max_content_tokens: must be a positive integer")
        if limit is not None:
            declaration["max_content_tokens"] = limit
        function = web_fetch_function(name, index)
    return ServerTool(function, declaration, ToolCallBudget(limit=max_uses))


def plan_request(data: Any, config: Config) -> Plan:
    """Validate a request that declares gateway tools and classify its tools (400 on a bad one)."""
    if not isinstance(data, dict):
        raise _bad("The request body must be a JSON object.")
    tools = data.get("tools")
    assert isinstance(tools, list)
    aliases = config.messages.aliases()
    plan = Plan(body=data, stream=data.get("stream") is True, tools={}, client_tools=[])
    for index, tool in enumerate(tools):
        kind = _server_kind(tool)
        alias = _alias_kind(tool, aliases) if kind is None else None
        if kind is not None:
            server = _server_tool(tool, kind, index)
        elif alias is not None:
            name = tool["name"]
            fn = (
                single_query_web_search_function(name, index)
                if alias == "web_search"
                else web_fetch_function(name, index)
            )
            server = ServerTool(fn, {"type": alias}, ToolCallBudget(limit=None))
        else:
            plan.client_tools.append(tool)
            continue
        if server.function.name in plan.tools or server.kind in plan.by_kind:
            raise _bad(f"tools.{index}: {server.kind} is declared twice")
        plan.tools[server.function.name] = server
        plan.by_kind[server.kind] = server.function.name
    client_names = {str(t.get("name")) for t in plan.client_tools if isinstance(t, Mapping)}
    clash = client_names & set(plan.tools)
    if clash:
        raise _bad(f"tools: the name {sorted(clash)[0]!r} is declared twice")
    return plan


# --- history: the public blocks this gateway returned, as the model's own turns -----------------


def result_text(block: Mapping[str, Any]) -> str:
    """The tool_result text the model gets for a public ``web_*_tool_result`` block."""
    content = block.get("content")
    if isinstance(content, Mapping) and str(content.get("type", "")).endswith("_error"):
        return orjson.dumps({"error": content.get("error_code")}).decode()
    if block.get("type") == "web_search_tool_result" and isinstance(content, list):
        lines = ["Search results:"]
        for n, hit in enumerate(content, 1):
            if isinstance(hit, Mapping):
                lines.append(f"[{n}] {hit.get('title') or hit.get('url')}\n    URL: {hit.get('url')}")
                if hit.get("encrypted_content"):
                    lines.append(f"    {hit.get('encrypted_content')}")
        return "\n".join(lines)
    if isinstance(content, Mapping):
        document: Mapping[str, Any] = (
            content["content"] if isinstance(content.get("content"), Mapping) else {}
        )
        source: Mapping[str, Any] = document["source"] if isinstance(document.get("source"), Mapping) else {}
        title = document.get("title")
        head = f"Title: {title}\n" if title else ""
        return f"{head}URL: {content.get('url')}\n\n{source.get('data', '')}"
    return ""


def upstream_messages(messages: Any, plan: Plan) -> Any:
    """``messages`` with each ``server_tool_use`` + result pair as a ``tool_use`` and a user
    ``tool_result`` (the shape the model produced them in); other messages unchanged."""
    if not isinstance(messages, list):
        return messages
    out: list[Any] = []
    synthetic = False  # out[-1] is a user turn made here: the next user turn joins it
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if (
            not isinstance(content, list)
            or message.get("role") != "assistant"
            or not any(isinstance(b, Mapping) and b.get("type") == "server_tool_use" for b in content)
        ):
            if synthetic and isinstance(message, Mapping) and message.get("role") == "user":
                rest = content if isinstance(content, list) else [{"type": "text", "text": content}]
                out[-1] = {**out[-1], "content": [*out[-1]["content"], *rest]}
            else:
                out.append(message)
            synthetic = False
            continue
        turn: list[Any] = []
        for block in content:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "server_tool_use" and block.get("name") in plan.by_kind:
                turn.append(
                    {
                        "type": "tool_use",
                        "id": block.get("id"),
                        "name": plan.by_kind[block["name"]],
                        "input": block.get("input") or {},
                    }
                )
            elif kind in ("web_search_tool_result", "web_fetch_tool_result"):
                result = {
                    "type": "tool_result",
                    "tool_use_id": block.get("tool_use_id"),
                    "content": result_text(block),
                }
                if turn:
                    out.append({**message, "content": turn})
                    synthetic = False
                if synthetic:
                    out[-1]["content"].append(result)
                else:
                    out.append({"role": "user", "content": [result]})
                synthetic = True
                turn = []
            else:
                turn.append(block)
        if turn:
            out.append({**message, "content": turn})
            synthetic = False
    return out


# --- the public blocks -----------------------------------------------------------------------------


def server_tool_use_block(call: ToolCall, arguments: Any) -> dict[str, Any]:
    return {"type": "server_tool_use", "id": call.call_id, "name": call.kind, "input": arguments}


def result_block(result: ToolResult) -> dict[str, Any]:
    """The ``web_search_tool_result`` / ``web_fetch_tool_result`` block for one call."""
    details = result.details or {}
    kind = result.kind
    content: Any
    if not result.ok:
        code = details.get("error_code") or "unavailable"
        content = {"type": f"{kind}_tool_result_error", "error_code": code}
    elif kind == "web_search":
        content = [
            {
                "type": "web_search_result",
                "title": hit.get("title") or hit.get("url") or "",
                "url": hit.get("url") or "",
                # This gateway encrypts nothing: the snippet travels as it is, and comes back to
                # the model when the client replays the block.
                "encrypted_content": hit.get("snippet") or "",
                "page_age": None,
            }
            for hit in details.get("results") or []
        ]
    else:
        content = {
            "type": "web_fetch_result",
            "url": details.get("url"),
            "retrieved_at": details.get("retrieved_at"),
            "content": {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": details.get("text") or ""},
                "title": details.get("title") or None,
                "citations": None,
            },
        }
    return {"type": _RESULT_TYPES[kind], "tool_use_id": result.call_id, "content": content}


# --- usage -----------------------------------------------------------------------------------------


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class Usage:
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_USAGE_FIELDS, 0))
    seen: set[str] = field(default_factory=set)
    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def add(self, usage: Any) -> None:
        """Add one round's usage (saturating, as the reference's integer sums)."""
        if not isinstance(usage, Mapping):
            return
        for name in _USAGE_FIELDS:
            if name in usage:
                self.seen.add(name)
                self.totals[name] = min(USAGE_MAX, self.totals[name] + _count(usage.get(name)))

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            name: self.totals[name]
            for name in _USAGE_FIELDS
            if name in ("input_tokens", "output_tokens") or name in self.seen
        }
        out["server_tool_use"] = {
            "web_search_requests": self.requests["web_search"],
            "web_fetch_requests": self.requests["web_fetch"],
        }
        return out


# --- the loop --------------------------------------------------------------------------------------


class UpstreamAnswer(Exception):
    """The upstream answered a round with an error: forwarded to the client unmodified."""

    def __init__(self, response: UpstreamResponse, body: bytes) -> None:
        super().__init__(response.status)
        self.response = response
        self.body = body


@dataclass
class Outcome:
    """A round's gateway calls, run: the public blocks and the tool_result blocks for the model."""

    public: list[dict[str, Any]]
    results: list[dict[str, Any]]


class RoundSpan:
    """The span of one upstream round (``chat {model}``), current for the round's block: the upstream
    call's span is its child, the round's gateway tool calls (run after it) its siblings. Its usage is
    the round's ledger entry's (``call``), its answer what the block sets on :attr:`answer`."""

    def __init__(self, call: ModelCall, messages: Any) -> None:
        self.call = call
        self.messages = messages  # the round's input, for capture_content
        self.answer: Round | None = None
        self.round = spans.ModelRound(call.model, **{spans.PROVIDER: "anthropic"})
        self._current = spans.current(self.round.span)

    def __enter__(self) -> RoundSpan:
        self._current.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        self._current.__exit__(exc_type, exc, traceback)
        span = self.round.span
        if span.is_recording():
            if exc is not None:
                spans.ended_by(span, exc)
            elif self.call.status not in (0, 200):
                span.set_attribute("http.response.status_code", self.call.status)
                spans.fail(span, str(self.call.status))
            answer, usage = self.answer, self.call.usage
            message = answer.message if answer is not None else {}
            self.round.answered(
                response_id=message.get("id") if isinstance(message.get("id"), str) else None,
                response_model=message.get("model") if isinstance(message.get("model"), str) else None,
                finish_reasons=[answer.stop_reason]
                if answer is not None and isinstance(answer.stop_reason, str)
                else None,
                input_tokens=_token(usage.get("input_tokens")),
                output_tokens=_token(usage.get("output_tokens")),
            )
            if answer is not None:
                self.round.messages(None, self.messages, answer.content)
        self.round.end()


def _token(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class MessagesLoop:
    def __init__(
        self,
        plan: Plan,
        headers: dict[str, str],
        query: str,
        config: Config,
        principal: Principal = DEFAULT_PRINCIPAL,
    ) -> None:
        self.plan = plan
        self.principal = principal
        self.headers = {**headers, "accept-encoding": "identity"}
        self.query = query
        self.config = config
        self.messages = upstream_messages(plan.body.get("messages"), plan)
        self.tool_choice = plan.body.get("tool_choice")
        self.usage = Usage()
        self.round_no = 0
        # Every round of the request is sent in its lineage (Claude Code's session).
        self.lineage = messages_lineage.of_request(plan.body, principal.owner)

    def round_body(self) -> bytes:
        body = dict(self.plan.body)
        body["messages"] = self.messages
        body["tools"] = self.plan.upstream_tools()
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        return orjson.dumps(body)

    def round_call(self) -> ModelCall:
        """The ledger's entry of the next upstream round (a ``with`` block records it once)."""
        model = self.plan.body.get("model")
        return ModelCall(self.principal, UPSTREAM_PATH, model if isinstance(model, str) else "")

    async def send_round(self) -> UpstreamResponse:
        self.round_no += 1
        with lineage.bind(self.lineage):
            return await get_upstream().send(
                "POST", UPSTREAM_PATH, body=self.round_body(), headers=self.headers, query=self.query
            )

    def hidden(self, block: Mapping[str, Any]) -> bool:
        """Whether a block is a gateway tool's call (never shown to the client)."""
        return block.get("type") == "tool_use" and block.get("name") in self.plan.tools

    def calls_of(self, content: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(gateway calls, client calls) among a round's blocks."""
        uses = [b for b in content if b["type"] == "tool_use"]
        if len({b["id"] for b in uses}) != len(uses):
            raise RoundError("a tool_use id used twice")
        return [b for b in uses if b["name"] in self.plan.tools], [
            b for b in uses if b["name"] not in self.plan.tools
        ]

    async def run_calls(self, uses: list[dict[str, Any]]) -> Outcome:
        """Run a round's gateway calls (``max_uses`` checked first) on the shared dispatcher."""
        calls: list[ToolCall] = []
        refused: dict[str, ToolResult] = {}
        for use in uses:
            # The srvtoolu_ id minted here replaces the upstream's id everywhere (client block, result, hidden
            # turn), as in the history the client sends back.
            use["id"] = new_id("srvtoolu")
            server = self.plan.tools[use["name"]]
            call = ToolCall(
                call_id=use["id"],
                name=use["name"],
                kind=server.function.kind,
                arguments=orjson.dumps(use["input"]).decode(),
                tool=server.declaration,
            )
            calls.append(call)
            if server.budget.admit():
                self.usage.requests[call.kind] = self.usage.requests[call.kind] + 1
            else:
                refused[call.call_id] = ToolResult.failure(
                    call, server.budget.refusal_output, details={"error_code": "max_uses_exceeded"}
                )
        ran = await run_gateway_calls([c for c in calls if c.call_id not in refused], config=self.config)
        by_id = {r.call_id: r for r in ran} | refused
        public: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for call, use in zip(calls, uses, strict=True):
            result = by_id[call.call_id]
            public += [server_tool_use_block(call, use["input"]), result_block(result)]
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": call.call_id,
                    "content": result.output if result.ok else (result.error or result.output),
                    **({} if result.ok else {"is_error": True}),
                }
            )
        return Outcome(public, results)

    def next_round(self, content: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
        self.messages = [
            *self.messages,
            {"role": "assistant", "content": content},
            {"role": "user", "content": results},
        ]
        choice = self.tool_choice
        if isinstance(choice, Mapping) and choice.get("type") in ("any", "tool"):
            self.tool_choice = {**{k: v for k, v in choice.items() if k != "name"}, "type": "auto"}

    def stop_reason(self, reason: Any, client_calls: list[dict[str, Any]]) -> Any:
        if client_calls and reason in ("end_turn", None):
            return "tool_use"  # vLLM ends a round with a client tool call as end_turn
        return reason

    # -- JSON ----------------------------------------------------------------------------------

    async def run_json(self) -> tuple[UpstreamResponse | None, dict[str, Any] | None, bytes]:
        """(first response, final message, ``b""``) or (error response, None, its body)."""
        first: UpstreamResponse | None = None
        public: list[dict[str, Any]] = []
        message: dict[str, Any] = {}
        while True:
            with self.round_call() as call, RoundSpan(call, self.messages) as span:
                response = await self.send_round()
                call.status = response.status
                try:
                    raw = await response.read()
                finally:
                    await response.aclose()
                if response.status != 200:
                    return response, None, raw
                first = first or response
                try:
                    round_ = span.answer = parse_json_round(raw)
                    gateway_calls, client_calls = self.calls_of(round_.content)
                except RoundError as exc:
                    raise errors.UpstreamError(f"{_ROUND_ERROR}: {exc}.") from None
                call.usage = round_.usage
            message = message or round_.message
            self.usage.add(round_.usage)
            outcome = await self.run_calls(gateway_calls) if gateway_calls else Outcome([], [])
            shown = {id(use): n for n, use in enumerate(gateway_calls)}
            for block in round_.content:
                n = shown.get(id(block))
                if n is None:
                    public.append(block)
                else:
                    public += outcome.public[2 * n : 2 * n + 2]  # its server_tool_use and result
            reason = self.stop_reason(round_.stop_reason, client_calls)
            if not gateway_calls or client_calls or self.round_no >= self.config.responses.max_rounds:
                if gateway_calls and not client_calls:
                    reason = "pause_turn"
                final = {**message, "content": public, "stop_reason": reason, "usage": self.usage.public()}
                final["stop_sequence"] = round_.message.get("stop_sequence")
                return first, final, b""
            self.next_round(round_.content, outcome.results)

    # -- SSE -----------------------------------------------------------------------------------

    async def run_stream(
        self, write: Callable[[bytes], Awaitable[None]], start: Callable[[UpstreamResponse], Awaitable[None]]
    ) -> UpstreamAnswer | None:
        """Stream the rounds to ``write`` (``start`` sends the head once the first round is 200);
        returns the error answer of a first round the upstream refused, else None."""
        counter = iter(range(USAGE_MAX))
        started = False
        reason: Any = None
        last: Round | None = None
        while True:
            with self.round_call() as call, RoundSpan(call, self.messages) as span:
                response = await self.send_round()
                call.status = response.status
                try:
                    if response.status == 200 and response.content_type != SSE_CONTENT_TYPE:
                        # Not the stream asked for (its hidden calls must not reach the client): a
                        # malformed round, which ends the client's stream with api_error.
                        if not started:
                            await start(response)
                            started = True
                        call.status = 502  # a malformed round is the upstream's failure
                        answered = response.content_type or "no content type"
                        failure = errors.UpstreamError(
                            f"{_ROUND_ERROR}: a streamed round answered {answered}."
                        )
                        await write(errors.anthropic_sse_error(failure))
                        return None
                    if response.status != 200:
                        body = await response.read()
                        if not started:
                            return UpstreamAnswer(response, body)
                        await write(_error_event(body, response.status))
                        return None
                    if not started:
                        await start(response)
                        started = True
                    round_state = StreamRound(self.hidden, lambda: next(counter))
                    call.usage = round_state.usage  # filled as the round's events arrive
                    try:
                        async for name, data in sse_events(
                            response, self.config.responses.max_upstream_sse_line_bytes
                        ):
                            if name == "error" or (isinstance(data, dict) and data.get("type") == "error"):
                                await write(sse_event("error", data))  # the upstream's own error, as it is
                                return None
                            shown = round_state.feed(name, data)
                            if shown is None:
                                continue
                            if shown.get("type") == "message_start" and self.round_no > 1:
                                continue
                            await write(sse_event(name or shown.get("type", ""), shown))
                        last = span.answer = round_state.result()
                        gateway_calls, client_calls = self.calls_of(last.content)
                    except RoundError as exc:
                        call.status = 502
                        await write(
                            errors.anthropic_sse_error(errors.UpstreamError(f"{_ROUND_ERROR}: {exc}."))
                        )
                        return None
                finally:
                    await response.aclose()
            self.usage.add(last.usage)
            reason = self.stop_reason(last.stop_reason, client_calls)
            if gateway_calls:
                outcome = await self._run_calls_with_pings(gateway_calls, write)
                for block in outcome.public:
                    await write(_block_events(next(counter), block))
                if not client_calls and self.round_no < self.config.responses.max_rounds:
                    self.next_round(last.content, outcome.results)
                    continue
                if not client_calls:
                    reason = "pause_turn"
            break
        delta = {"stop_reason": reason, "stop_sequence": last.message.get("stop_sequence") if last else None}
        await write(
            sse_event(
                "message_delta", {"type": "message_delta", "delta": delta, "usage": self.usage.public()}
            )
            + sse_event("message_stop", {"type": "message_stop"})
        )
        return None

    async def _run_calls_with_pings(
        self, uses: list[dict[str, Any]], write: Callable[[bytes], Awaitable[None]]
    ) -> Outcome:
        """:meth:`run_calls`, with Anthropic's ``ping`` event every ``[server] sse_keepalive_s``
        while the calls run, so the client and any proxy see a live stream."""
        task = asyncio.ensure_future(self.run_calls(uses))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=self.config.server.sse_keepalive_s)
                if not task.done():
                    await write(sse_event("ping", {"type": "ping"}))
            return task.result()
        finally:
            task.cancel()


def _error_event(body: bytes, status: int) -> bytes:
    """A later round's upstream error as the stream's ``error`` event: the upstream's own envelope
    when it is one (its wording kept), else an ``api_error`` naming the status."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and data.get("type") == "error":
        return b"event: error\ndata: " + body.strip() + b"\n\n"
    return errors.anthropic_sse_error(errors.UpstreamError(f"The upstream model server answered {status}."))


def _block_events(index: int, block: dict[str, Any]) -> bytes:
    """A public server block as Anthropic streams it: ``server_tool_use`` with its input as one
    ``input_json_delta``, a result block whole."""
    if block["type"] == "server_tool_use":
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
        return (
            sse_event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            )
            + sse_event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            )
            + sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
        )
    return sse_event(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    ) + sse_event("content_block_stop", {"type": "content_block_stop", "index": index})


# --- the ASGI handler ------------------------------------------------------------------------------


def _raw(headers: list[tuple[str, str]], extra: RawHeaders, *, drop_length: bool) -> RawHeaders:
    out = [
        (k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in headers
        if not (drop_length and k.lower() == "content-length")
    ]
    return [*out, *extra]


async def serve(
    scope: Scope,
    body: bytes,
    receive: Receive,
    send: Send,
    *,
    headers: dict[str, str],
    extra_headers: RawHeaders,
    exchange: Exchange,
) -> None:
    """Serve one ``/v1/messages`` request that declares gateway tools (``headers``: already the
    ones to forward upstream)."""
    config = get_config()
    try:
        plan = plan_request(orjson.loads(body), config)
    except orjson.JSONDecodeError:
        await send_error(send, scope, errors.BadRequest("The request body is not valid JSON."), extra_headers)
        return
    except errors.GatewayError as exc:
        await send_error(send, scope, exc, extra_headers)
        return
    query = scope.get("query_string", b"").decode("latin-1")
    loop = MessagesLoop(plan, headers, query, config, scope_principal(scope))
    head_sent = False

    async def answer(status: int, raw: RawHeaders, payload: bytes) -> None:
        exchange.finished = True
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    with DisconnectWatch(lambda: client_left(receive, exchange), lambda: exchange.finished):
        try:
            if not plan.stream:
                response, final, raw_body = await loop.run_json()
                assert response is not None
                if final is None:
                    await answer(
                        response.status, _raw(response.headers, extra_headers, drop_length=False), raw_body
                    )
                    return
                payload = orjson.dumps(final)
                raw = _raw(response.headers, extra_headers, drop_length=True)
                await answer(200, [*raw, (b"content-length", str(len(payload)).encode())], payload)
                return

            async def start(response: UpstreamResponse) -> None:
                nonlocal head_sent
                head_sent = True
                raw = _raw(response.headers, extra_headers, drop_length=True)
                if response.content_type != SSE_CONTENT_TYPE:  # a malformed round: its error event
                    raw = [(k, v) for k, v in raw if k != b"content-type"]
                    raw.append((b"content-type", SSE_CONTENT_TYPE.encode()))
                await send({"type": "http.response.start", "status": 200, "headers": raw})

            async def write(data: bytes) -> None:
                await send({"type": "http.response.body", "body": data, "more_body": True})

            refused = await loop.run_stream(write, start)
            if refused is not None:
                headers_out = _raw(refused.response.headers, extra_headers, drop_length=False)
                await answer(refused.response.status, headers_out, refused.body)
                return
            exchange.finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except errors.GatewayError as exc:
            if exchange.client_gone:
                return
            if not head_sent:
                exchange.finished = True
                await send_error(send, scope, exc, extra_headers)
                return
            exchange.finished = True
            await send(
                {"type": "http.response.body", "body": errors.anthropic_sse_error(exc), "more_body": False}
            )


async def serve_count_tokens(
    scope: Scope,
    body: bytes,
    receive: Receive,
    send: Send,
    *,
    headers: dict[str, str],
    extra_headers: RawHeaders,
    exchange: Exchange,
) -> None:
    """``count_tokens`` of a request that declares gateway tools, counted as the loop's first round sends
    it (vLLM refuses the server-tool shapes); the answer is relayed as it is."""
    try:
        plan = plan_request(orjson.loads(body), get_config())
    except orjson.JSONDecodeError:
        await send_error(send, scope, errors.BadRequest("The request body is not valid JSON."), extra_headers)
        return
    except errors.GatewayError as exc:
        await send_error(send, scope, exc, extra_headers)
        return
    rewritten = {**plan.body, "tools": plan.upstream_tools()}
    if "messages" in rewritten:
        rewritten["messages"] = upstream_messages(rewritten["messages"], plan)
    await forward(
        COUNT_TOKENS,
        scope,
        receive,
        send,
        exchange,
        orjson.dumps(rewritten),
        headers=headers,
        extra_headers=extra_headers,
    )
