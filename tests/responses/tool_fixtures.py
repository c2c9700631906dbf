"""Fixtures for the tool-loop tests: the live gateway, the scripted model, and real tool servers.

``tools_gw`` is a :class:`Gateway` whose process config points web search at a real
SearXNG-compatible provider on loopback (``tests.tools.tools_servers.SearchProvider``) and
allows MCP servers on 127.0.0.1 (the real MCP server built with the ``mcp`` SDK). The code
interpreter is the real bubblewrap sandbox. ``configure(**changes)`` applies more config changes
on top of that base.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gateway.core.config import Config
from tests.responses.conftest import Gateway, check_sdk_event, check_sdk_response
from tests.servers import LiveServer
from tests.tools.tools_servers import McpRecord, SearchProvider, start_mcp_server


@dataclass
class ToolsGateway(Gateway):
    provider: SearchProvider | None = None
    configure: Callable[..., Config] | None = None

    def events(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Stream ``body``; every event and the final response parse with the SDK types."""
        events = self.stream(body)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        for event in events:
            check_sdk_event(event)
        if "response" in events[-1]:
            check_sdk_response(events[-1]["response"])
        return events

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Non-streaming create (status 200 asserted); the response parses with the SDK type."""
        r = self.post(body)
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        check_sdk_response(data)
        return data


@pytest.fixture
def tools_gw(
    gw: Gateway, provider: SearchProvider, gateway_config: Callable[..., Config]
) -> Iterator[ToolsGateway]:
    base: dict[str, Any] = {
        "llm_api_base": gw.upstream.url,
        "upstream_api": gw.wire,
        "redis_url": "",  # in-process tool calls (the Celery path has its own test)
        "web_search__provider": "searxng",
        "web_search__base_url": provider.url,
        "mcp__allowed_hosts": ("127.0.0.1",),
        "code_interpreter__cpu_time_s": 5,
        "code_interpreter__wall_time_s": 10.0,
    }

    def configure(**changes: Any) -> Config:
        return gateway_config(**{**base, **changes})

    configure()
    yield ToolsGateway(gw.url, gw.upstream, gw.wire, gw.client, provider=provider, configure=configure)


@pytest.fixture
def mcp_server() -> Iterator[tuple[LiveServer, McpRecord, str]]:
    live, record, url = start_mcp_server(3, page_size=2)
    yield live, record, url
    live.stop()


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def args(**value: Any) -> str:
    return orjson.dumps(value).decode()


def model_input(gw: Gateway, request: int) -> list[dict[str, Any]]:
    """The conversation the model saw in upstream request ``request``, normalized across wire APIs.

    ``responses``: the input items; ``chat_completions``: messages rendered back to
    ``{"call": (name, arguments, id)}`` / ``{"output": (id, text)}`` / ``{"text": ...}`` entries.
    """
    body = gw.upstream_bodies()[request]
    out: list[dict[str, Any]] = []
    if gw.wire == "responses":
        for item in body["input"]:
            if item.get("type") == "function_call":
                out.append({"call": (item["name"], item["arguments"], item["call_id"])})
            elif item.get("type") == "function_call_output":
                out.append({"output": (item["call_id"], item["output"])})
            elif item.get("type") == "message":
                text = "".join(p.get("text", "") for p in item["content"])
                out.append({"text": (item["role"], text)})
            else:
                out.append({"other": item["type"]})
        return out
    for message in body["messages"]:
        if message["role"] == "tool":
            out.append({"output": (message["tool_call_id"], message["content"])})
            continue
        if message.get("content"):
            out.append({"text": (message["role"], message["content"])})
        for tc in message.get("tool_calls") or ():
            out.append({"call": (tc["function"]["name"], tc["function"]["arguments"], tc["id"])})
    return out


def offered_tools(gw: Gateway, request: int) -> list[str]:
    """Names of the function tools offered to the model in upstream request ``request``."""
    tools = gw.upstream_bodies()[request].get("tools") or []
    if gw.wire == "responses":
        return [t.get("name") or t["type"] for t in tools]
    return [t["function"]["name"] for t in tools]
