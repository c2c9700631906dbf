"""Fixtures for the Responses tests: a live gateway in front of the scripted upstream."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.responses.scripts import Part, Script, handler, path_for

EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@dataclass
class Gateway:
    url: str
    upstream: Any
    wire: str
    client: OpenAI

    def script(self, *parts: Part, **options: Any) -> Script:
        script = Script(list(parts), **options)
        self.upstream.script(path_for(self.wire), handler(script, self.wire))
        return script

    def upstream_bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.upstream.requests if r.path == path_for(self.wire)]

    def post(self, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/responses", json=body, timeout=30, **kwargs)

    def stream(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST with ``stream: true`` and parse the SSE frames (event name must match ``type``)."""
        return sse_events(httpx.post(f"{self.url}/v1/responses", json={**body, "stream": True}, timeout=30))


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: "), block
        data = orjson.loads(lines[1].removeprefix("data: "))
        assert lines[0] == f"event: {data['type']}"
        events.append(data)
    return events


def _sdk_view(data: dict[str, Any]) -> dict[str, Any]:
    """The SDK declares usage counters required; the gateway omits unreported ones (spec policy)."""
    data = copy.deepcopy(data)
    response = data.get("response") if "response" in data else data
    usage = (response or {}).get("usage") if isinstance(response, dict) else None
    if isinstance(usage, dict):
        usage["input_tokens_details"].setdefault("cached_tokens", 0)
        usage["input_tokens_details"].setdefault("cache_write_tokens", 0)
        usage["output_tokens_details"].setdefault("reasoning_tokens", 0)
    return data


def wait_terminal(response_id: str, timeout: float = 10) -> Any:
    """The stored row of ``response_id`` once it is no longer ``queued`` / ``in_progress``."""
    from responses_app.models import Response as Row

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = Row.objects.get(id=response_id)
        if row.status not in ("queued", "in_progress"):
            return row
        time.sleep(0.05)
    raise AssertionError(f"{response_id} is still {row.status}")


def check_sdk_event(data: dict[str, Any]) -> Any:
    return EVENT_ADAPTER.validate_python(_sdk_view(data))


def check_sdk_response(data: dict[str, Any]) -> Response:
    return Response.model_validate(_sdk_view(data))


@pytest.fixture(params=["responses", "chat_completions"])
def wire(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def gw(live_gateway: Any, upstream: Any, gateway_config: Callable[..., Any], wire: str) -> Iterator[Gateway]:
    gateway_config(llm_api_base=upstream.url, upstream_api=wire)
    client = OpenAI(base_url=f"{live_gateway.url}/v1", api_key="sk-test", max_retries=0, timeout=30)
    yield Gateway(live_gateway.url, upstream, wire, client)
    client.close()


# The tool-loop fixtures (MCP server, sandbox config; the search provider is tests/conftest.py's): tests/responses/tool_fixtures.py.
from tests.responses.tool_fixtures import mcp_server, tools_gw  # noqa: E402, F401
