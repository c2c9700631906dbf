"""The lineage of Anthropic Messages requests: Claude Code's session, from ``metadata.user_id``,
seen at send time through ``[routing] session_header`` (the scripted upstream records headers).
Relayed requests and the server-tool loop's rounds alike; no ``user_id``: no lineage."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from inference_app.upstream import lineage
from messages_app.lineage import session_of
from tests.servers import LiveServer
from tests.tools.tools_servers import SearchProvider
from tests.upstream import ScriptedUpstream, anthropic_message, anthropic_tool_message, json_answer

pytestmark = pytest.mark.django_db(transaction=True)

HEADER = "x-lineage"
SESSION = "5e1f7c2a-9b3d-4e8f-a1c6-2d7e9f0b4a13"
# Claude Code's forms of metadata.user_id: the older string, and the newer JSON object.
USER_ID = f"user_{'ab' * 32}_account_0c9d1e2f-3a4b-5c6d-7e8f-9a0b1c2d3e4f_session_{SESSION}"
USER_ID_JSON = orjson.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": SESSION}).decode()
SEARCH = {"type": "web_search_20250305", "name": "web_search"}


@pytest.fixture
def gw(
    live_gateway: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any
) -> LiveServer:
    gateway_config(
        llm_api_base=upstream.url, web_search__base_url=provider.url, routing__session_header=HEADER
    )
    return live_gateway


def post(gw: LiveServer, **extra: Any) -> httpx.Response:
    body = {"model": "test-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(f"{gw.url}/v1/messages", json=body, headers={"x-api-key": "k"}, timeout=30)


def sent(upstream: ScriptedUpstream) -> list[str | None]:
    return [r.headers.get(HEADER) for r in upstream.requests if r.path == "/v1/messages"]


def test_claude_codes_session_is_the_lineage_of_relayed_requests(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    for metadata in (
        {"user_id": USER_ID},
        {"user_id": USER_ID_JSON},
        {"user_id": USER_ID.replace(SESSION, "another-session")},
        None,
        {},
    ):
        upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
        r = post(gw, **({"metadata": metadata} if metadata is not None else {}))
        assert r.status_code == 200, r.text
    old, new, other, none, empty = sent(upstream)
    assert old == new == lineage.key("default", "messages", SESSION)  # both forms, one session
    assert other is not None and other != old
    assert none is None and empty is None  # no user_id: no lineage


def test_the_server_tool_rounds_share_the_requests_lineage(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("call_1", "web_search", {"query": "news"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("News.")))
    r = post(gw, tools=[SEARCH], metadata={"user_id": USER_ID})
    assert r.status_code == 200, r.text
    assert sent(upstream) == [lineage.key("default", "messages", SESSION)] * 2
    # Without a user_id: no lineage, in any round.
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("call_2", "web_search", {"query": "more"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("More.")))
    assert post(gw, tools=[SEARCH], metadata={}).status_code == 200
    assert sent(upstream)[2:] == [None, None]


def test_session_of_each_form() -> None:
    assert session_of(USER_ID) == SESSION
    assert session_of(USER_ID_JSON) == SESSION
    assert session_of("plain-user") == "plain-user"  # no session named: the user id as a whole
    assert session_of("{not json") == "{not json"
