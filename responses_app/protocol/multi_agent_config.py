"""The ``multi_agent`` request field (beta): its validation and the refusals that go with it.

``multi_agent: {"enabled": true, "max_concurrent_subagents": N}`` (N defaults to 3, a positive
integer) asks the gateway to coordinate subagents for one response (``responses_app.features.multi_agent``).
It requires ``store: true`` and refuses ``max_tool_calls`` and reasoning summaries, each with a 400
naming its ``param`` (:func:`refuse_in_multi_agent_mode`, also applied to a continuation of a stored
agent tree by ``prepare.response_prepare``). The WebSocket transport refuses it
(``responses_app.api.session``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core import errors
from responses_app.features import async_tools

DEFAULT_MAX_CONCURRENT = 3
ROOT = "/root"
# The public items of multi-agent mode. As input they are accepted and never reach a model: the
# agents' state is the stored tree and its own output items (agentic-reference: "multi-agent public
# items are dropped from the model's input").
AGENT_ITEM_TYPES = frozenset({"multi_agent_call", "multi_agent_call_output", "agent_message"})
# Marks (under tool_loop.PRIVATE_KEY, stripped from every public view) an agent item a client gave
# as input, so a later multi-agent turn does not take it for the tree's own.
INPUT_MARK = {"agent_item": "input"}


@dataclass(frozen=True)
class MultiAgentConfig:
    max_concurrent_subagents: int = DEFAULT_MAX_CONCURRENT

    def as_dict(self) -> dict[str, Any]:
        return {"enabled": True, "max_concurrent_subagents": self.max_concurrent_subagents}


def multi_agent_config(raw: Mapping[str, Any]) -> MultiAgentConfig | None:
    """The validated configuration, or ``None`` when multi-agent mode is not asked for."""
    value = raw.get("multi_agent")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise errors.invalid_type("multi_agent", "an object", value)
    unknown = sorted(set(value) - {"enabled", "max_concurrent_subagents"})
    if unknown:
        raise errors.BadRequest(
            f"Unknown parameter: 'multi_agent.{unknown[0]}'.",
            param=f"multi_agent.{unknown[0]}",
            code="unknown_parameter",
        )
    enabled = value.get("enabled")
    if not isinstance(enabled, bool):
        if enabled is None:
            raise errors.BadRequest(
                "Missing required parameter: 'multi_agent.enabled'.",
                param="multi_agent.enabled",
                code="missing_required_parameter",
            )
        raise errors.invalid_type("multi_agent.enabled", "a boolean", enabled)
    limit = value.get("max_concurrent_subagents", DEFAULT_MAX_CONCURRENT)
    if limit is None:
        limit = DEFAULT_MAX_CONCURRENT
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise errors.BadRequest(
            f"Invalid 'multi_agent.max_concurrent_subagents': expected a positive integer, got {limit!r}.",
            param="multi_agent.max_concurrent_subagents",
            code="invalid_value",
        )
    if not enabled:
        return None
    refuse_in_multi_agent_mode(raw)
    return MultiAgentConfig(limit)


def refuse_in_multi_agent_mode(raw: Mapping[str, Any]) -> None:
    """The request rules of multi-agent mode: a fresh ``multi_agent`` request, and a continuation
    of a stored agent tree (which runs in multi-agent mode whatever it says), get the same 400s."""
    async_tools.check_parallel_async(raw)
    if raw.get("store") is False:
        raise errors.BadRequest(
            "Multi-agent responses require store=true.", param="store", code="invalid_value"
        )
    if raw.get("background"):
        raise errors.BadRequest(
            "Multi-agent responses run over HTTP JSON and SSE only, not in background mode.",
            param="background",
            code="unsupported_parameter",
        )
    if raw.get("max_tool_calls") is not None:
        raise errors.BadRequest(
            "max_tool_calls is not supported with multi_agent.",
            param="max_tool_calls",
            code="unsupported_parameter",
        )
    reasoning = raw.get("reasoning")
    if isinstance(reasoning, Mapping):
        for key in ("summary", "generate_summary"):
            if reasoning.get(key) is not None:
                raise errors.BadRequest(
                    "Reasoning summaries are not supported with multi_agent.",
                    param=f"reasoning.{key}",
                    code="unsupported_parameter",
                )
    items = raw.get("input")
    if isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, Mapping) and item.get("type") == "compaction_trigger":
                raise errors.BadRequest(
                    "compaction_trigger is not supported with multi_agent; agents compact automatically.",
                    param=f"input[{index}]",
                    code="unsupported_parameter",
                )


def single_agent_view(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A history as a single-agent model reads it (a conversation or a stateless replay that holds a
    multi-agent turn): the root's items without their ``agent`` tag; multi-agent public items and
    subagents' items dropped. Nothing of multi-agent mode reaches the upstream raw."""
    out = []
    for item in items:
        if item.get("type") in AGENT_ITEM_TYPES:
            continue
        agent = item.get("agent")
        if agent is None:
            out.append(item)
            continue
        if isinstance(agent, Mapping) and agent.get("agent_name") not in (None, ROOT):
            continue  # a subagent's own work: the root read its answer as mail
        out.append({k: v for k, v in item.items() if k != "agent"})
    return out
