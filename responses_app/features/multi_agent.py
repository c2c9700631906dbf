"""Multi-agent responses (beta): a coordinator that runs subagents for one response.

:class:`Coordinator` is the response's executor; its one task owns all mutable state (registry,
mailboxes, slots, output). Each agent is an :class:`AgentExecutor` whose turn segments run as their
own tasks and talk to the coordinator through a queue. Events are renumbered into one stream; the
tree is stored with the response and restored by ``previous_response_id`` (``docs/responses.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from gateway.core import spans
from gateway.core.config import Config
from gateway.core.ids import new_id
from gateway.core.sse import Event, EventTooLarge, StreamFailure
from inference_app.upstream import lineage
from responses_app.engine.domain import Prepared, RoundState, Usage
from responses_app.engine.executor import Executor
from responses_app.engine.tool_loop import PRIVATE_KEY, ROUND_CAP_REASON, ToolLoop
from responses_app.features import compaction
from responses_app.protocol.multi_agent_config import (
    AGENT_ITEM_TYPES,
    INPUT_MARK,
    ROOT,
    MultiAgentConfig,
    multi_agent_config,
)

TREE_VERSION = 1
COMPACT_AT_TOKENS = 100_000  # per-agent automatic compaction threshold (AgentExecutor.before_segment_round)
DEFAULT_WAIT_MS = 30_000
MAX_WAIT_MS = 300_000
ACTIONS = ("spawn_agent", "send_message", "followup_task", "wait_agent", "interrupt_agent", "list_agents")

_STR = {"type": "string"}
_TARGET = {"target": _STR}


def _fn(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """A collaboration function, declared ``strict`` (every property required, optional ones nullable):
    without ``strict``, vLLM's guided decoding constrains a forced call only to its envelope."""
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {"name": name, "description": description, "parameters": parameters, "strict": True}


# Short on purpose: every root round carries them (a small model's context is small).
COLLAB_FUNCTIONS: list[dict[str, Any]] = [
    _fn(
        "spawn_agent",
        "Start a subagent on a task; it reports back by mail.",
        {
            "task_name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
            "message": _STR,
            "fork_turns": {"type": ["string", "null"], "enum": ["all", "none", None]},
        },
    ),
    _fn("send_message", "Mail a subagent.", {**_TARGET, "message": _STR}),
    _fn("followup_task", "Give a subagent a new task.", {**_TARGET, "message": _STR}),
    _fn("wait_agent", "Wait for subagent mail.", {"timeout_ms": {"type": ["integer", "null"]}}),
    _fn("interrupt_agent", "Stop a subagent.", dict(_TARGET)),
    _fn("list_agents", "List subagents.", {}),
]


def tag(name: str) -> dict[str, Any]:
    return {"agent": {"agent_name": name}}


def agent_of(item: dict[str, Any]) -> str:
    agent = item.get("agent")
    if isinstance(agent, dict) and isinstance(agent.get("agent_name"), str):
        return agent["agent_name"]
    return ROOT


def belongs_to(item: dict[str, Any], name: str) -> bool:
    """Whether ``item`` is part of ``name``'s own history: what it produced, and mail to it."""
    if item.get("type") == "agent_message":
        return item.get("recipient") == name
    return agent_of(item) == name


def own_history(items: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Agent ``name``'s part of a stored history, from its latest compaction on; items a client gave as
    input belong to no agent, and an item held twice is read once."""
    own: list[dict[str, Any]] = []
    seen: set[str] = set()
    for item in items:
        if not belongs_to(item, name) or item.get(PRIVATE_KEY) == INPUT_MARK:
            continue
        item_id = item.get("id")
        if isinstance(item_id, str):
            if item_id in seen:
                continue
            seen.add(item_id)
        own.append(item)
    latest = max((n for n, i in enumerate(own) if i.get("type") == compaction.COMPACTION), default=None)
    if latest is None:
        return own
    return [*compaction.retained_messages(own[:latest]), *own[latest:]]


def compaction_parts(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``POST /v1/responses/compact`` of a multi-agent chain: the root's history is summarized; the other
    agents' items are kept as they are."""
    return own_history(items, ROOT), [item for item in items if not belongs_to(item, ROOT)]


def root_model_view(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The root agent's own history as its model reads it."""
    return [seen for item in items if (seen := model_item(item, ROOT)) is not None]


def _text(value: Any) -> list[dict[str, Any]]:
    return [{"type": "output_text", "text": value, "annotations": []}]


def model_item(item: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A multi-agent history item as the model of agent ``name`` sees it (``None``: not at all)."""
    kind = item.get("type")
    if kind == "multi_agent_call":
        return {
            "type": "function_call",
            "call_id": item["call_id"],
            "name": item["action"],
            "arguments": item.get("arguments") or "{}",
        }
    if kind == "multi_agent_call_output":
        text = "".join(p.get("text", "") for p in item.get("output") or () if isinstance(p, dict))
        return {"type": "function_call_output", "call_id": item["call_id"], "output": text}
    if kind == "agent_message":
        if item.get("recipient") != name:
            return None  # mail this agent sent: its own answer is already in its history
        text = "".join(p.get("text", "") for p in item.get("content") or () if isinstance(p, dict))
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": f"[message from {item.get('author')}]\n{text}"}],
        }
    return {k: v for k, v in item.items() if k not in ("agent", "phase")}  # the gateway's labels


class CollabTools:
    """An agent's gateway tools: the request's (a :class:`ToolLoop`) plus, for the root, the
    collaboration tools, shown as ``multi_agent_call`` items."""

    def __init__(self, loop: ToolLoop, collaborates: bool) -> None:
        self.loop = loop
        self.collaborates = collaborates
        self.calls: list[dict[str, Any]] = []  # this segment's collaboration calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)

    def is_gateway(self, name: str) -> bool:
        return (self.collaborates and name in ACTIONS) or self.loop.is_gateway(name)

    def on_gateway_call(self, ex: Any, call_id: str, name: str, arguments: str) -> list[Event]:
        if not (self.collaborates and name in ACTIONS):
            return self.loop.on_gateway_call(ex, call_id, name, arguments)
        item = {
            "id": new_id("mac"),
            "type": "multi_agent_call",
            "action": name,
            "arguments": arguments,
            "call_id": call_id,
        }
        events = ex.whole(item)
        self.calls.append(ex.output[-1])
        return events

    def responses_tools(self, declared: Any) -> list[dict[str, Any]]:
        out = self.loop.responses_tools(declared)
        if self.collaborates:
            out += [{"type": "function", **f} for f in COLLAB_FUNCTIONS]
        return out

    def tool_choice(self, choice: Any) -> Any:
        """A ``tool_choice`` naming a collaboration tool binds the root; a subagent lacks the tool."""
        if isinstance(choice, dict) and choice.get("name") in ACTIONS and not self.collaborates:
            return "auto"
        return self.loop.tool_choice(choice)

    def chat_tools(self) -> list[dict[str, Any]]:
        out = self.loop.chat_tools()
        if self.collaborates:
            out += [{"type": "function", "function": f} for f in COLLAB_FUNCTIONS]
        return out


class AgentExecutor(Executor):
    """One agent: its own history, tools, emitter and sink; rounds run by :func:`_segment`."""

    def __init__(self, name: str, prepared: Prepared, config: Config, upstream: Any, loop: ToolLoop) -> None:
        super().__init__(prepared, config, upstream=upstream, event_fields=tag(name))
        self.name = name
        # Each agent is its own conversation with the model: its own lineage, derived from the
        # response's (a continuation's is its parent's) and its name, so stable across the run's
        # rounds and continuations.
        self.lineage = lineage.key(prepared.owner, prepared.lineage or prepared.response_id, "agent", name)
        self.emitter.item_fields = tag(name)
        self.emitter.phases = True  # assistant messages carry phase (final_answer / commentary)
        self.collab = CollabTools(loop, collaborates=name == ROOT)
        self.loop = loop
        self.tools = self.collab  # type: ignore[assignment]  # the wire and the emitter see the proxy
        self.emitter.tools = self.collab
        self.rounds_run = 0
        self.turn_rounds = 0
        self.span: Span | None = None  # invoke_agent, from its first segment to the response's end
        # Each agent compacts itself: at the request's context_management threshold, else at
        # COMPACT_AT_TOKENS estimated tokens (a compaction_trigger is refused in multi-agent mode).
        threshold = self.compactor.threshold
        self.compactor.threshold = (
            COMPACT_AT_TOKENS if threshold is None else min(threshold, COMPACT_AT_TOKENS)
        )
        self.compactor.trigger = False

    def model_items(self) -> list[dict[str, Any]]:
        prior = [*self.p.history, *self.p.new_items]
        items = self.compactor.window(self.loop.model_items(prior, self.output))
        out = []
        for item in items:
            seen = model_item(item, self.name)
            if seen is not None:
                out.append(self.client_tools.upstream_item(seen))
        return out

    def receive(self, item: dict[str, Any]) -> None:
        """Mail (or a client's tool output) joins this agent's history (no segment runs now)."""
        self.emitter.output.append(item)

    async def before_segment_round(self) -> AsyncIterator[Event]:
        """Before every inference round of this agent: its automatic compaction (the compaction
        item is this agent's, attributed to it)."""
        async for event in self.compactor.before_round(self):
            yield event


@dataclass
class Agent:
    name: str
    ex: AgentExecutor
    task_message: str = ""
    status: str = "idle"  # idle | queued | running | completed | interrupted | failed
    answer: str = ""
    segment: asyncio.Task[None] | None = None
    mailbox: list[dict[str, Any]] = field(default_factory=list)
    pending_calls: list[str] = field(default_factory=list)  # client call ids awaiting output


@dataclass
class SegmentEnd:
    """How a segment of an agent's turn ended (sent to the coordinator)."""

    kind: str  # answer | collab | client | incomplete | failed | rounds
    answer: str = ""
    tier: str | None = None
    tier_reported: bool = False
    message: str = ""
    code: str = "server_error"
    status: int | None = None


async def _segment(agent: AgentExecutor, queue: asyncio.Queue[Any]) -> None:
    """Run ``agent``'s rounds until its turn ends or it has collaboration calls; report every event
    and the end to ``queue``. Touches only ``agent``."""
    if agent.span is not None and agent.span.get_span_context().is_valid:
        # This task's own context: the agent's rounds, compactions and tool calls nest in its span.
        otel_context.attach(trace.set_span_in_context(agent.span))
    end = SegmentEnd("rounds")
    try:
        while agent.turn_rounds < agent.config.responses.max_rounds:
            agent.turn_rounds += 1  # the round budget is per turn, across its segments
            async for event in agent.before_segment_round():
                await queue.put(("event", agent.name, event))
            agent.rounds_run += 1  # round numbers key the parsers' items: unique per agent
            state = RoundState(agent.rounds_run)
            agent.round = state
            agent.emitter.start_round()
            agent.loop.start_round()
            agent.collab.calls = []
            async with contextlib.aclosing(agent.run_round(state)) as round_events:  # closed if cancelled
                async for event in round_events:
                    await queue.put(("event", agent.name, event))
            for event in agent.emitter.close():
                await queue.put(("event", agent.name, event))
            end.tier, end.tier_reported = state.tier, True
            if agent.loop.round_calls:
                async for event in agent.loop.execute_round(agent.emitter):
                    await queue.put(("event", agent.name, event))
            for event in agent.emitter.flush_deferred():  # async calls held behind gateway calls
                await queue.put(("event", agent.name, event))
            # The executor's async rule, per agent: a round whose only client calls are async goes
            # on (the call pending); two such rounds in a row end this agent's turn.
            async_more = agent.async_rounds.after_round(
                async_calls=agent.emitter.async_calls, sync_calls=agent.emitter.sync_calls
            )
            if state.status != "completed":
                end.kind = "incomplete"
                break
            if agent.emitter.sync_calls or agent.loop.ends_response:
                end.kind = "client"
                break
            if agent.collab.calls:
                end.kind = "collab"
                break
            if agent.async_rounds.exhausted or not (agent.loop.round_calls or async_more):
                end.kind = "answer"
                end.answer = _last_answer(agent.output)
                break
    except StreamFailure as failure:
        agent.emitter.drop_open()
        end = SegmentEnd("failed", message=failure.message, code=failure.code, status=failure.status)
    except EventTooLarge as exc:
        agent.emitter.drop_open()
        end = SegmentEnd("failed", message=exc.message)
    await queue.put(("end", agent.name, end))


def _last_answer(output: list[dict[str, Any]]) -> str:
    for item in reversed(output):
        if item.get("type") == "message" and item.get("role") == "assistant":
            return "".join(p.get("text", "") for p in item.get("content") or () if isinstance(p, dict))
    return ""


def _arguments(item: dict[str, Any]) -> dict[str, Any]:
    try:
        value = orjson.loads(item.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class Coordinator(Executor):
    """The executor of a multi-agent response (see the module docstring)."""

    def __init__(self, prepared: Prepared, config: Config, *, upstream: Any = None) -> None:
        super().__init__(prepared, config, upstream=upstream)
        ma = multi_agent_config(prepared.raw)
        tree = prepared_tree(prepared)
        if ma is None:  # a continuation inherits the tree's configuration
            ma = MultiAgentConfig(int(tree["config"]["max_concurrent_subagents"]))
        self.ma = ma
        self.tree_in = tree
        self.sink.extra = tag(ROOT)
        self.agents: dict[str, Agent] = {}
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.slots: dict[int, dict[str, Any]] = {}  # global output index -> finished item
        self.index_map: dict[tuple[str, int], int] = {}
        self.next_index = 0
        self.waiting: list[tuple[dict[str, Any], float]] = []  # root's wait_agent calls and deadlines
        self.root_mail_seen = 0
        self.root_tier: str | None = None
        self.agent_tree: dict[str, Any] | None = None  # the terminal snapshot, once built
        self.root_deferred = False  # the root's turn waits for subagents woken by late outputs

    # --- the public output ----------------------------------------------------------------------

    @property
    def output(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [self.slots[i] for i in sorted(self.slots)]

    def _forward(self, event: Event, name: str) -> Event:
        """An agent's event renumbered into the response's one stream."""
        data = dict(event.data)
        local = data.get("output_index")
        if isinstance(local, int):
            key = (name, local)
            if key not in self.index_map:
                self.index_map[key] = self.next_index
                self.next_index += 1
            data["output_index"] = self.index_map[key]
            if data["type"] == "response.output_item.done":
                self.slots[data["output_index"]] = data["item"]
        data["sequence_number"] = self.sink.sequence_number
        body = orjson.dumps(data)
        if len(body) > self.sink.max_event_bytes:
            raise EventTooLarge(len(body), self.sink.max_event_bytes)
        self.sink.sequence_number += 1
        return Event(data["type"], data, b"event: " + data["type"].encode() + b"\ndata: " + body + b"\n\n")

    # --- agents ---------------------------------------------------------------------------------

    async def _new_agent(self, name: str, history: list[dict[str, Any]]) -> Agent:
        p = dataclasses.replace(
            self.p, history=history, new_items=[], items_to_insert=[], store=False, tool_map=self.client_tools
        )
        assert self.tools is not None
        loop = self.tools if name == ROOT else await ToolLoop.prepare(p, self.config)
        agent = Agent(name, AgentExecutor(name, p, self.config, self.upstream, loop))
        agent.ex.meter = self.meter  # every agent's calls are this response's (stored with it)
        self.agents[name] = agent
        return agent

    def _running(self) -> int:
        return sum(1 for a in self.agents.values() if a.name != ROOT and a.status == "running")

    def _start(self, agent: Agent, *, new_turn: bool = True) -> None:
        """Start (or queue, when every slot is taken) a turn of ``agent`` (or the next segment of
        the root's turn after its collaboration calls); its mail is delivered."""
        if new_turn:
            agent.ex.turn_rounds = 0
        if agent.name != ROOT and self._running() >= self.ma.max_concurrent_subagents:
            agent.status = "queued"
            return
        for item in agent.mailbox:
            agent.ex.receive(item)
        agent.mailbox.clear()
        agent.status = "running"
        if agent.ex.span is None:
            agent.ex.span = spans.tracer().start_span(f"invoke_agent {agent.name}", kind=SpanKind.INTERNAL)
            if agent.ex.span.is_recording():
                agent.ex.span.set_attributes(
                    {
                        spans.OPERATION: "invoke_agent",
                        spans.AGENT_NAME: agent.name,
                        spans.PROVIDER: spans.PROVIDER_NAME,
                        spans.REQUEST_MODEL: self.p.request.model or "",
                    }
                )
        agent.segment = asyncio.get_running_loop().create_task(_segment(agent.ex, self.queue))

    def _busy(self) -> bool:
        return any(a.status in ("running", "queued") for a in self.agents.values() if a.name != ROOT)

    def _start_queued(self) -> None:
        for agent in self.agents.values():
            if agent.status == "queued" and self._running() < self.ma.max_concurrent_subagents:
                self._start(agent)

    def _mail(self, author: str, recipient: str, text: str) -> list[Event]:
        """An ``agent_message`` from ``author`` (its item, streamed now) into ``recipient``'s mailbox."""
        sender = self.agents[author]
        item = {
            "id": new_id("amsg"),
            "type": "agent_message",
            "author": author,
            "recipient": recipient,
            "content": [{"type": "text", "text": text}],
        }
        events = [self._forward(e, author) for e in sender.ex.emitter.whole(item)]
        self.agents[recipient].mailbox.append(sender.ex.output[-1])
        return events

    async def _stop(self, agent: Agent, status: str) -> None:
        if agent.segment is not None and not agent.segment.done():
            agent.segment.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await agent.segment
        agent.segment = None
        agent.ex.emitter.drop_open()
        agent.status = status

    # --- the run --------------------------------------------------------------------------------

    async def rounds(self) -> AsyncGenerator[Event, None]:
        """The executor's seam: the agents' work, coordinated, instead of one agent's rounds."""
        try:
            await self._restore()
            async for event in self._coordinate():
                yield event
        finally:
            await self._stop_all("interrupted")
            self._end_spans()

    def _end_spans(self) -> None:
        for agent in self.agents.values():
            span, agent.ex.span = agent.ex.span, None
            if span is None:
                continue
            if span.is_recording():
                span.set_attribute("gateway.agent.status", agent.status)
                if agent.status == "failed":
                    spans.fail(span, "agent_failed")
            span.end()

    def settle(self) -> None:
        self.service_tier = self.root_tier
        self.usage = Usage.total(agent.ex.usage for agent in self.agents.values())  # each counted its own
        self.agent_tree = self._tree()

    async def _stop_all(self, status: str) -> None:
        for agent in self.agents.values():
            if agent.status in ("running", "queued"):
                await self._stop(agent, status)

    async def _restore(self) -> None:
        """The agents of this response: a fresh root, or the stored tree with each client output
        routed to the agent whose call it answers."""
        history = [*self.p.history]
        root = await self._new_agent(ROOT, own_history(history, ROOT))
        # A client output goes to the agent whose call it answers: the call's attribution (an async
        # call accepts further outputs), and the tree's record of calls awaiting the client.
        owners: dict[str, str] = {
            i["call_id"]: agent_of(i)
            for i in history
            if i.get("type") in CLIENT_CALL_TYPES
            and isinstance(i.get("call_id"), str)
            and agent_of(i) != ROOT
        }
        for entry in self.tree_in.get("agents", []):
            name = entry["name"]
            if name == ROOT:
                continue
            agent = await self._new_agent(name, own_history(history, name))
            status = entry["status"]
            agent.status = "idle" if status == "awaiting_client" else status
            if status in ("running", "queued"):
                agent.status = "interrupted"
            agent.task_message = entry.get("task", "")
            agent.answer = entry.get("answer", "")
            for call_id in entry.get("pending_calls", []):
                owners[call_id] = name
        woken: list[Agent] = []
        for item in self.p.new_items:
            if item.get("type") in AGENT_ITEM_TYPES:
                continue  # stored as input; the tree (and its own items) is the agents' state
            owner = (
                owners.get(item.get("call_id", "")) if str(item.get("type", "")).endswith("_output") else None
            )
            if owner is not None:
                item.update(tag(owner))  # stored attributed: a later continuation routes it again
                target = self.agents[owner]
                target.mailbox.append(item)
                if target not in woken:
                    woken.append(target)
            else:
                root.ex.p.new_items.append(item)
        started = False
        for agent in woken:
            # A subagent that finished its turn starts a new one on a late output; one that was
            # interrupted or failed reads it at its next turn (its mailbox is delivered then).
            if agent.status in ("idle", "completed"):
                self._start(agent)
                started = True
        if started and not root.ex.p.new_items:
            # Nothing new for the root itself: its new turn starts once the woken subagents have
            # finished theirs, so it reads their answers (their mail).
            self.root_deferred = True
            return
        self._start(root)

    async def _coordinate(self) -> AsyncIterator[Event]:
        root = self.agents[ROOT]
        while True:
            timeout = None
            if self.waiting:
                timeout = max(0.0, min(deadline for _, deadline in self.waiting) - time.monotonic())
            try:
                async with asyncio.timeout(timeout):
                    kind, name, payload = await self.queue.get()
            except TimeoutError:
                async for event in self._answer_waits():
                    yield event
                continue
            if kind == "event":
                if self.agents[name].status == "running":  # drop stragglers of a stopped agent
                    yield self._forward(payload, name)
                continue
            agent = self.agents[name]
            end: SegmentEnd = payload
            agent.segment = None
            if agent.status != "running":
                continue
            if name == ROOT and end.tier_reported:
                self.root_tier = end.tier
            if end.kind == "failed":
                if name == ROOT:
                    self.http_error = agent.ex.http_error  # a 4xx upstream answer is relayed
                    raise StreamFailure(end.message, code=end.code, status=end.status)
                agent.status = "failed"
                for event in self._mail(name, ROOT, f"Subagent failed: {end.message}"):
                    yield event
            elif end.kind == "client" or (end.kind == "incomplete" and name == ROOT):
                agent.status = "awaiting_client" if end.kind == "client" else "interrupted"
                agent.pending_calls = _open_calls(agent.ex.output)
                for call, _ in self.waiting:  # the root's waits end with the response
                    for event in self._call_output(call, "The response ended for client tool calls."):
                        yield event
                self.waiting = []
                if end.kind == "incomplete":
                    self.end_status = "incomplete"
                    self.incomplete_details = agent.ex.incomplete_details
                return  # a client call (or an incomplete root round) ends the response
            elif end.kind == "collab":
                async for event in self._collaborate(agent):
                    yield event
                continue
            elif name == ROOT:
                if end.kind == "rounds":
                    self.end_status = "incomplete"
                    self.incomplete_details = {"reason": ROUND_CAP_REASON}
                root.status = "completed"
                # The root's turn is over: subagents still at work finish their turn first (their
                # mail waits in the tree for the root's next turn), then the response ends.
                if not self._busy():
                    return
                continue
            else:
                agent.status = "completed" if end.kind == "answer" else "failed"
                agent.answer = end.answer
                text = end.answer if end.kind == "answer" else f"Subagent stopped: {end.kind}."
                for event in self._mail(name, ROOT, text):
                    yield event
            self._start_queued()
            if self.root_deferred and not self._busy():
                self.root_deferred = False
                self._start(root)
            if root.status == "completed" and not self._busy():
                return
            async for event in self._answer_waits():
                yield event

    async def _collaborate(self, root: Agent) -> AsyncIterator[Event]:
        """Execute the root's collaboration calls; ``wait_agent`` is answered once mail arrives."""
        calls = list(root.ex.collab.calls)
        root.ex.collab.calls = []
        waits = []
        for call in calls:
            if call["action"] == "wait_agent":
                waits.append(call)
                continue
            text, events = await self._execute(call)
            for event in [*events, *self._call_output(call, text)]:
                yield event
        if not waits:
            self._start(root, new_turn=False)
            return
        root.status = "waiting"
        for call in waits:
            timeout_ms = _arguments(call).get("timeout_ms")  # null (or absent): the default
            if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
                timeout_ms = DEFAULT_WAIT_MS
            self.waiting.append((call, time.monotonic() + min(timeout_ms, MAX_WAIT_MS) / 1000))
        async for event in self._answer_waits():
            yield event

    async def _answer_waits(self) -> AsyncIterator[Event]:
        """Answer the root's waits when it has mail, nothing runs, or their time is up."""
        root = self.agents[ROOT]
        if not self.waiting:
            return
        busy = any(a.status in ("running", "queued") for a in self.agents.values() if a.name != ROOT)
        expired = min(deadline for _, deadline in self.waiting) <= time.monotonic()
        if not (root.mailbox or not busy or expired):
            return
        mail = root.mailbox[:]
        lines = [f"{m['author']}: {''.join(p.get('text', '') for p in m['content'])}" for m in mail]
        text = "\n".join(lines) if lines else ("Timed out waiting." if busy else "No subagent is running.")
        text += "\n" + self._listing()
        for call, _ in self.waiting:
            for event in self._call_output(call, text):
                yield event
        self.waiting = []
        root.status = "running"
        self._start(root, new_turn=False)

    def _call_output(self, call: dict[str, Any], text: str) -> list[Event]:
        root = self.agents[ROOT]
        item = {
            "id": new_id("maco"),
            "type": "multi_agent_call_output",
            "action": call["action"],
            "call_id": call["call_id"],
            "output": _text(text),
        }
        return [self._forward(e, ROOT) for e in root.ex.emitter.whole(item)]

    def _listing(self) -> str:
        subs = [a for a in self.agents.values() if a.name != ROOT]
        if not subs:
            return "Agents: none."
        return "Agents: " + ", ".join(f"{a.name} ({a.status})" for a in subs)

    def _target(self, args: dict[str, Any]) -> Agent | str:
        target = args.get("target")
        if not isinstance(target, str):
            return "Error: 'target' is required."
        name = target if target.startswith(ROOT + "/") else f"{ROOT}/{target}"
        agent = self.agents.get(name)
        return agent if agent is not None and name != ROOT else f"Error: no subagent named {target!r}."

    async def _execute(self, call: dict[str, Any]) -> tuple[str, list[Event]]:
        """One collaboration call: its output text, and the events it streamed (mail)."""
        args = _arguments(call)
        action = call["action"]
        if action == "list_agents":
            return self._listing(), []
        if action == "spawn_agent":
            return await self._spawn(args)
        target = self._target(args)
        if isinstance(target, str):
            return target, []
        if action == "interrupt_agent":
            if target.status not in ("running", "queued"):
                return f"{target.name} is not running ({target.status}).", []
            await self._stop(target, "interrupted")
            self._start_queued()
            return f"Interrupted {target.name}.", []
        message = args.get("message")
        if not isinstance(message, str) or not message:
            return "Error: 'message' is required.", []
        events = self._mail(ROOT, target.name, message)
        if action == "followup_task" and target.status not in ("running", "queued"):
            self._start(target)
        return f"Sent to {target.name} ({target.status}).", events

    async def _spawn(self, args: dict[str, Any]) -> tuple[str, list[Event]]:
        task, message = args.get("task_name"), args.get("message")
        if not isinstance(task, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", task):
            return "Error: task_name must be letters, digits, '_' or '-'.", []
        if not isinstance(message, str) or not message:
            return "Error: 'message' is required.", []
        name = f"{ROOT}/{task}"
        if name in self.agents:
            return f"Error: {name} exists; use followup_task or send_message.", []
        fork = args.get("fork_turns")
        if fork is None:  # null (or absent): the default
            fork = "all"
        if fork not in ("all", "none"):
            return "Error: fork_turns must be 'all' or 'none'.", []
        root = self.agents[ROOT]
        base = [*root.ex.p.history, *root.ex.p.new_items] if fork == "all" else []
        # The child's history is its fork of the root's conversation (its messages only).
        forked = [{**i, **tag(name)} for i in base if i.get("type", "message") == "message"]
        agent = await self._new_agent(name, forked)
        agent.task_message = message
        events = self._mail(ROOT, name, message)
        self._start(agent)
        return f"Spawned {name} ({agent.status}).", events

    # --- storage ----------------------------------------------------------------------------------

    def _tree(self) -> dict[str, Any]:
        return {
            "version": TREE_VERSION,
            "config": self.ma.as_dict(),
            "agents": [
                {
                    "name": a.name,
                    "status": a.status,
                    "task": a.task_message,
                    "answer": a.answer,
                    "pending_calls": a.pending_calls,
                }
                for a in self.agents.values()
            ],
        }

    async def store(
        self, status: str, snapshot: dict[str, Any], terminal: tuple[int, bytes] | None = None
    ) -> None:
        from responses_app.storage import writes

        views: dict[str, Any] = {}
        for agent in self.agents.values():
            views.update(agent.ex.loop.model_calls)
        items = [{**i, PRIVATE_KEY: views[i["id"]]} if i.get("id") in views else i for i in self.output]
        outcome = writes.Outcome(
            status,
            snapshot,
            items,
            self.usage.as_dict(),
            self.error,
            terminal_event=terminal,
            agent_tree=self.agent_tree or self._tree(),
        )
        await self.store_outcome(outcome)


CLIENT_CALL_TYPES = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "shell_call",
        "apply_patch_call",
        "local_shell_call",
        "tool_search_call",
    }
)


def _open_calls(output: list[dict[str, Any]]) -> list[str]:
    answered = {i.get("call_id") for i in output if str(i.get("type", "")).endswith("_output")}
    return [
        i["call_id"]
        for i in output
        if i.get("type") in CLIENT_CALL_TYPES and i.get("call_id") not in answered
    ]


def prepared_tree(prepared: Prepared) -> dict[str, Any]:
    """The tree a continuation restores (set by ``prepare.response_prepare``), or a fresh one."""
    return prepared.agent_tree or {"version": TREE_VERSION, "config": {}, "agents": []}


def is_multi_agent(prepared: Prepared) -> bool:
    return multi_agent_config(prepared.raw) is not None or prepared.agent_tree is not None
