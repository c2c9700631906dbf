"""Anthropic Messages: the gateway's server-tool loop (web search, web fetch), with the real
``anthropic`` SDK against the scripted upstream (vLLM's ``/v1/messages`` wire), a local search
provider and a local web site.

Reference (spec/agentic-reference.md, "Anthropic Messages: the gateway's server-tool loop"): the
gateway tools go upstream as plain function tools; the gateway runs them in hidden rounds; the
client sees ``server_tool_use`` + ``web_search_tool_result`` / ``web_fetch_tool_result`` and the
final answer, never the hidden ``tool_use``; ``end_turn`` after a client tool call becomes
``tool_use``; usage is summed; each round is validated before any tool runs.

The tests run on the gateway as ``manage.py serve`` serves it (uvicorn, on a loopback port).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from messages_app.server_tools import USAGE_MAX
from tests.conftest import serve_gateway
from tests.servers import LiveServer
from tests.tools.tools_servers import SearchProvider, WebSite
from tests.upstream import (
    ScriptedUpstream,
    anthropic_error,
    anthropic_event,
    anthropic_events,
    anthropic_message,
    anthropic_tool_events,
    anthropic_tool_message,
    json_answer,
    sse,
)

pytestmark = pytest.mark.django_db(transaction=True)

SRVTOOLU = re.compile(r"^srvtoolu_[a-zA-Z0-9_]+$")  # Anthropic's server tool-use id form

SEARCH = {"type": "web_search_20250305", "name": "web_search"}
FETCH = {"type": "web_fetch_20250910", "name": "web_fetch"}
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
USER = [{"role": "user", "content": "What is new?"}]


@pytest.fixture
def site() -> Iterator[WebSite]:
    server = WebSite().start()
    yield server
    server.stop()


@pytest.fixture
def gw(
    live_gateway: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any
) -> LiveServer:
    gateway_config(llm_api_base=upstream.url, web_search__base_url=provider.url)
    return live_gateway


def sdk(gw: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-caller", max_retries=0)


def post(gw: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/messages", json=body, headers={"x-api-key": "k"}, timeout=30)


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.split(b"\n\n"):
        if not chunk.strip():
            continue
        name, data = "", b""
        for line in chunk.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data = line[6:]
        out.append((name, orjson.loads(data)))
    return out


def stream(gw: LiveServer, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    with httpx.stream(
        "POST", f"{gw.url}/v1/messages", json={**body, "stream": True}, headers={"x-api-key": "k"}, timeout=30
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return events_of(r.read())


def rounds(upstream: ScriptedUpstream) -> list[dict[str, Any]]:
    return [rec.json() for rec in upstream.requests if rec.path == "/v1/messages"]


def body(tools: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "max_tokens": 256, "messages": USER, "tools": tools, **extra}


# --- search rounds --------------------------------------------------------------------------------


def test_search_round_json(gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider) -> None:
    upstream.script(
        "/v1/messages",
        json_answer(
            anthropic_tool_message([("call_1", "web_search", {"query": "gateway news"})], text="Searching.")
        ),
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("News: fact number 1.")))
    message = sdk(gw).messages.create(
        model="test-model", max_tokens=256, messages=USER, tools=[{**SEARCH, "max_uses": 3}]
    )
    assert [b.type for b in message.content] == ["text", "server_tool_use", "web_search_tool_result", "text"]
    use, result = message.content[1], message.content[2]
    assert (
        use.type == "server_tool_use" and use.name == "web_search" and use.input == {"query": "gateway news"}
    )
    assert result.type == "web_search_tool_result" and result.tool_use_id == use.id
    assert SRVTOOLU.match(use.id)  # Anthropic's form, minted by the gateway, not the upstream's id
    assert isinstance(result.content, list)
    assert [r.url for r in result.content] == [
        "https://example.com/gateway-news/1",
        "https://docs.python.org/gateway-news/2",
        "https://blocked.example.org/gateway-news/3",
    ]
    assert result.content[0].title == "gateway news result 1"
    assert message.content[3].text == "News: fact number 1."  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 26 and message.usage.output_tokens == 6
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1
    assert message.usage.server_tool_use.web_fetch_requests == 0
    assert [r.query["q"] for r in provider.requests] == ["gateway news"]
    first, second = rounds(upstream)
    # The server tool went upstream as a plain function tool.
    assert first["tools"] == [
        {
            "name": "web_search",
            "description": first["tools"][0]["description"],
            "input_schema": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "The search query."}},
                "required": ["query"],
            },
        }
    ]
    assert second["messages"][:1] == USER
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Searching."},
            {"type": "tool_use", "id": use.id, "name": "web_search", "input": {"query": "gateway news"}},
        ],
    }
    tool_result = second["messages"][2]["content"][0]
    assert second["messages"][2]["role"] == "user" and tool_result["tool_use_id"] == use.id
    assert "https://example.com/gateway-news/1" in tool_result["content"]
    assert "About gateway news: fact number 1." in tool_result["content"]


def test_search_round_sse(gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider) -> None:
    upstream.script(
        "/v1/messages",
        sse(
            anthropic_tool_events([("call_1", "web_search", {"query": "gateway news"})], text="Let me look.")
        ),
    )
    upstream.script("/v1/messages", sse(anthropic_events(["The answer ", "is here."])))
    events = stream(gw, body([SEARCH]))
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("message_start") == 1 and names.count("message_delta") == 1
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2, 3]
    assert [s["content_block"]["type"] for s in starts] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert all(s["content_block"]["type"] != "tool_use" for s in starts)  # the hidden call never shows
    use_id = starts[1]["content_block"]["id"]
    assert SRVTOOLU.match(use_id) and starts[2]["content_block"]["tool_use_id"] == use_id
    assert rounds(upstream)[1]["messages"][1]["content"][1]["id"] == use_id
    stops = [data["index"] for name, data in events if name == "content_block_stop"]
    assert stops == [0, 1, 2, 3]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["input_tokens"] == 26
    assert delta["usage"]["output_tokens"] == 7  # 5 in the tool round, 2 in the answer
    assert delta["usage"]["server_tool_use"] == {"web_search_requests": 1, "web_fetch_requests": 0}
    # The SDK's stream accumulator builds the same message.
    upstream.script(
        "/v1/messages", sse(anthropic_tool_events([("call_2", "web_search", {"query": "again"})]))
    )
    upstream.script("/v1/messages", sse(anthropic_events(["Done."])))
    with sdk(gw).messages.stream(model="test-model", max_tokens=64, messages=USER, tools=[SEARCH]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["server_tool_use", "web_search_tool_result", "text"]
    assert final.content[0].input == {"query": "again"}  # type: ignore[union-attr]
    assert final.content[1].content[0].url == "https://example.com/again/1"  # type: ignore[union-attr,index]
    assert final.stop_reason == "end_turn"


def test_pings_keep_the_stream_alive_while_tools_run(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any
) -> None:
    gateway_config(server__sse_keepalive_s=0.1)
    provider.slow_delay_s = 1.0  # a query with "slow" in it answers after this long
    upstream.script("/v1/messages", sse(anthropic_tool_events([("s1", "web_search", {"query": "slow one"})])))
    upstream.script("/v1/messages", sse(anthropic_events(["ok"])))
    events = stream(gw, body([SEARCH]))
    names = [name for name, _ in events]
    shown = names.index("content_block_start")  # the server_tool_use block, once the search is done
    assert names[0] == "message_start" and set(names[1:shown]) == {"ping"}
    assert "ping" not in names[shown:]
    assert ("ping", {"type": "ping"}) in events


def test_the_served_gateway_runs_the_loop_and_relays_a_body_without_gateway_tools(
    upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any, transactional_db: None
) -> None:
    """On the served gateway the loop runs, and a body without gateway tools is still relayed byte
    for byte."""
    gateway_config(llm_api_base=upstream.url, web_search__base_url=provider.url)
    for live in serve_gateway():
        for kind in ("first", "second"):
            upstream.script(
                "/v1/messages", json_answer(anthropic_tool_message([("c1", "web_search", {"query": kind})]))
            )
            upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
            r = post(live, body([SEARCH]))
            assert r.status_code == 200, (kind, r.text)
            assert [b["type"] for b in r.json()["content"]] == [
                "server_tool_use",
                "web_search_tool_result",
                "text",
            ]
            # No gateway tool (the text mentions one): pass-through, the upstream's bytes as they are.
            answer = orjson.dumps(anthropic_message("plain")) + b"  "
            upstream.script("/v1/messages", json_answer(answer))
            plain = {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "web_search_20250305?"}],
            }
            raw = orjson.dumps(plain)
            r = httpx.post(f"{live.url}/v1/messages", content=raw, headers={"x-api-key": "k"}, timeout=30)
            assert r.content == answer
            assert upstream.last("/v1/messages").body == raw


def test_pipelined_requests_are_handed_over_in_order(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider
) -> None:
    """Three requests in one write on one connection: the first and the third declare a server
    tool and run the loop; the second is relayed. Each gets its own answer, in order."""
    import socket

    from tests.servers import sized_answers

    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "one"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("first")))
    upstream.script("/v1/messages", json_answer(anthropic_message("second")))
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s3", "web_search", {"query": "three"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("third")))
    with_tools = orjson.dumps(body([SEARCH]))
    plain = orjson.dumps({"model": "m", "max_tokens": 5, "messages": USER})

    def request(payload: bytes) -> bytes:
        return b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + (
            b"content-length: %d\r\n\r\n%b" % (len(payload), payload)
        )

    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(request(with_tools) + request(plain) + request(with_tools))
        answers = sized_answers(sock, 3)
    bodies = [orjson.loads(a.split(b"\r\n\r\n", 1)[1]) for a in answers]
    assert [b["content"][-1]["text"] for b in bodies] == ["first", "second", "third"]
    assert [b["content"][0]["type"] for b in bodies] == ["server_tool_use", "text", "server_tool_use"]
    assert [r.query["q"] for r in provider.requests] == ["one", "three"]


# --- fetch rounds ---------------------------------------------------------------------------------


def test_fetch_round_json_and_sse(
    gw: LiveServer, upstream: ScriptedUpstream, site: WebSite, gateway_config: Any
) -> None:
    gateway_config(web_fetch__allowed_hosts=("127.0.0.1",))
    url = f"{site.url}/article"
    upstream.script("/v1/messages", json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": url})])))
    upstream.script("/v1/messages", json_answer(anthropic_message("The number is 7319.")))
    message = sdk(gw).messages.create(model="test-model", max_tokens=64, messages=USER, tools=[FETCH])
    assert [b.type for b in message.content] == ["server_tool_use", "web_fetch_tool_result", "text"]
    result = message.content[1]
    assert result.type == "web_fetch_tool_result"
    assert result.content.type == "web_fetch_result"
    assert result.content.url == url
    assert result.content.retrieved_at
    document = result.content.content
    assert document.type == "document" and document.title == "Tool loops"  # trafilatura's title: the headline
    assert document.source.type == "text" and "secret number of this page is 7319" in document.source.data
    assert "Copyright nobody" not in document.source.data  # boilerplate left out by trafilatura
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_fetch_requests == 1
    tool_result = rounds(upstream)[1]["messages"][2]["content"][0]
    assert tool_result["tool_use_id"] == message.content[0].id and "7319" in tool_result["content"]
    assert "Title: Tool loops" in tool_result["content"]

    upstream.script(
        "/v1/messages", sse(anthropic_tool_events([("f2", "web_fetch", {"url": f"{site.url}/notes.txt"})]))
    )
    upstream.script("/v1/messages", sse(anthropic_events(["42."])))
    with sdk(gw).messages.stream(model="test-model", max_tokens=64, messages=USER, tools=[FETCH]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["server_tool_use", "web_fetch_tool_result", "text"]
    assert final.content[1].content.content.source.data == "plain notes: 42 is the answer"  # type: ignore[union-attr]
    assert final.usage.server_tool_use is not None and final.usage.server_tool_use.web_fetch_requests == 1


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/doc.pdf", "unsupported_content_type"),
        ("/image.png", "unsupported_content_type"),
        ("/missing", "url_not_accessible"),
        ("/big", "content_too_large"),
    ],
)
def test_fetch_failures_are_result_errors(
    gw: LiveServer, upstream: ScriptedUpstream, site: WebSite, gateway_config: Any, path: str, code: str
) -> None:
    gateway_config(web_fetch__allowed_hosts=("127.0.0.1",), web_fetch__max_bytes=1000)
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": site.url + path})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("Sorry.")))
    r = post(gw, body([FETCH]))
    assert r.status_code == 200
    result = r.json()["content"][1]
    assert result == {
        "type": "web_fetch_tool_result",
        "tool_use_id": r.json()["content"][0]["id"],
        "content": {"type": "web_fetch_tool_result_error", "error_code": code},
    }
    tool_result = rounds(upstream)[1]["messages"][2]["content"][0]
    assert tool_result["is_error"] is True
    if code == "unsupported_content_type" and path.endswith(".pdf"):
        assert "PDF documents are not supported" in tool_result["content"]


def test_fetch_is_bounded_by_the_tools_call_timeout(
    gw: LiveServer, upstream: ScriptedUpstream, site: WebSite, gateway_config: Any
) -> None:
    gateway_config(web_fetch__allowed_hosts=("127.0.0.1",), tools__call_timeout_s=1.0)
    upstream.script(
        "/v1/messages",
        json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": f"{site.url}/slow"})])),
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("too slow")))
    r = post(gw, body([FETCH]))
    assert r.json()["content"][1]["content"]["type"] == "web_fetch_tool_result_error"
    assert r.json()["content"][2]["text"] == "too slow"
    assert site.paths == ["/slow"]
    tool_result = rounds(upstream)[1]["messages"][2]["content"][0]
    assert tool_result["is_error"] is True and "1 s" in tool_result["content"]


def test_fetch_max_content_tokens_cuts_the_text(
    gw: LiveServer, upstream: ScriptedUpstream, site: WebSite, gateway_config: Any
) -> None:
    gateway_config(web_fetch__allowed_hosts=("127.0.0.1",))
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": f"{site.url}/big"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    r = post(gw, body([{**FETCH, "max_content_tokens": 10}]))
    data = r.json()["content"][1]["content"]["content"]["source"]["data"]
    assert data == "x" * 40  # about four bytes a token


# --- SSRF -----------------------------------------------------------------------------------------


def test_fetch_refuses_loopback_unless_the_operator_allows_it(
    gw: LiveServer, upstream: ScriptedUpstream, site: WebSite
) -> None:
    upstream.script(
        "/v1/messages",
        json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": f"{site.url}/article"})])),
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("no")))
    r = post(gw, body([FETCH]))
    assert r.json()["content"][1]["content"] == {
        "type": "web_fetch_tool_result_error",
        "error_code": "url_not_allowed",
    }
    assert "loopback, private or link-local" in rounds(upstream)[1]["messages"][2]["content"][0]["content"]
    assert site.paths == []  # never contacted


def test_fetch_refuses_a_redirect_into_the_gateways_network(
    gw: LiveServer, upstream: ScriptedUpstream, site: WebSite, gateway_config: Any
) -> None:
    """127.0.0.1 is allowed by the operator; the redirect to ``localhost`` (not listed) is refused,
    so the site sees the first request only."""
    gateway_config(web_fetch__allowed_hosts=("127.0.0.1",))
    target = f"http://localhost:{site.port}/article"
    url = f"{site.url}/redirect?to={target}"
    upstream.script("/v1/messages", json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": url})])))
    upstream.script("/v1/messages", json_answer(anthropic_message("no")))
    r = post(gw, body([FETCH]))
    assert r.json()["content"][1]["content"]["error_code"] == "url_not_allowed"
    assert site.paths == [f"/redirect?to={target}"]


def test_fetch_checks_the_addresses_the_connection_resolves(
    gateway_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name whose DNS answer is loopback is refused at connection time too (the outbound client's
    ``connect_check`` sees what the connection really resolves, not only the pre-check)."""
    import asyncio

    from gateway.core import outbound
    from gateway.core.config import get_config
    from inference_app.tools import web_fetch
    from inference_app.tools.web_fetch import FetchError

    gateway_config()
    # The pre-check passes here, as it would for a name whose answer changed since it was checked.
    monkeypatch.setattr(web_fetch, "_check_target", _no_check)

    async def go() -> None:
        with pytest.raises(FetchError) as refused:
            await web_fetch.fetch_page("http://localhost:9/page", web_fetch.domain_filter({}), get_config())
        assert refused.value.code == "url_not_allowed"
        assert str(refused.value) == (
            "host 'localhost' resolves to a loopback, private or link-local address; "
            "the gateway does not fetch from its own network"
        )
        async with outbound.Client(timeout_s=5, connect_check=web_fetch._public_only(())) as client:
            with pytest.raises(outbound.OutboundRefused):
                await client.fetch("GET", "http://localhost:9/", max_bytes=10)
        assert web_fetch._public_only(("localhost",))("localhost", ["127.0.0.1"])
        assert not web_fetch._public_only(("*.localhost",))("localhost", ["127.0.0.1"])
        assert web_fetch._public_only(())("example.com", ["93.184.216.34"])

    asyncio.run(go())


async def _no_check(*args: Any) -> None:
    return None


def test_fetch_refuses_a_name_whose_answer_turns_mixed_at_connect_time(
    gw: LiveServer, upstream: ScriptedUpstream, site: WebSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: ``site.test`` answers a public address to the pre-check, then a public and a
    private one (the site on 127.0.0.1, listed first) to the connection. One private address in the
    answer is enough to refuse: the site is never contacted."""
    import socket

    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "site.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        public = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", int(port)))
        private = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", int(port)))
        return [public] if len(asked) == 1 else [private, public]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    url = f"http://site.test:{site.port}/article"
    upstream.script("/v1/messages", json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": url})])))
    upstream.script("/v1/messages", json_answer(anthropic_message("no")))
    r = post(gw, body([FETCH]))
    assert r.json()["content"][1]["content"] == {
        "type": "web_fetch_tool_result_error",
        "error_code": "url_not_allowed",
    }
    told = rounds(upstream)[1]["messages"][2]["content"][0]["content"]
    assert "host 'site.test' resolves to a loopback, private or link-local address" in told
    assert len(asked) == 2  # the pre-check's answer, then the connection's own
    assert site.paths == []  # never contacted


# --- mixed tools, stop_reason, tool_choice -------------------------------------------------------


def test_mixed_client_and_gateway_calls(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider
) -> None:
    """A round that calls a gateway tool and a client tool: the gateway runs its own, the client
    gets its call and ``stop_reason: "tool_use"`` (vLLM said ``end_turn``); one upstream round."""
    upstream.script(
        "/v1/messages",
        json_answer(
            anthropic_tool_message(
                [("s1", "web_search", {"query": "weather"}), ("w1", "get_weather", {"city": "Paris"})],
                stop_reason="end_turn",
            )
        ),
    )
    message = sdk(gw).messages.create(
        model="test-model",
        max_tokens=64,
        messages=USER,
        tools=[SEARCH, WEATHER],  # type: ignore[list-item]
    )
    assert [b.type for b in message.content] == ["server_tool_use", "web_search_tool_result", "tool_use"]
    assert message.content[2].name == "get_weather"  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert len(rounds(upstream)) == 1
    assert [t["name"] for t in rounds(upstream)[0]["tools"]] == ["get_weather", "web_search"]
    assert len(provider.requests) == 1


def test_end_turn_after_a_client_call_becomes_tool_use_in_json_and_sse(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "q"})]))
    )
    upstream.script(
        "/v1/messages",
        json_answer(
            anthropic_tool_message([("w1", "get_weather", {"city": "Oslo"})], stop_reason="end_turn")
        ),
    )
    r = post(gw, body([SEARCH, WEATHER]))
    assert r.json()["stop_reason"] == "tool_use"
    assert [b["type"] for b in r.json()["content"]] == [
        "server_tool_use",
        "web_search_tool_result",
        "tool_use",
    ]

    upstream.script("/v1/messages", sse(anthropic_tool_events([("s2", "web_search", {"query": "q"})])))
    upstream.script(
        "/v1/messages",
        sse(anthropic_tool_events([("w2", "get_weather", {"city": "Oslo"})], stop_reason="end_turn")),
    )
    events = stream(gw, body([SEARCH, WEATHER]))
    assert events[-2][0] == "message_delta" and events[-2][1]["delta"]["stop_reason"] == "tool_use"
    shown = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in shown] == ["server_tool_use", "web_search_tool_result", "tool_use"]
    assert shown[2]["name"] == "get_weather"


def test_forced_tool_choice_becomes_auto_after_round_one(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "q"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    post(
        gw,
        body([SEARCH], tool_choice={"type": "tool", "name": "web_search", "disable_parallel_tool_use": True}),
    )
    first, second = rounds(upstream)
    assert first["tool_choice"] == {"type": "tool", "name": "web_search", "disable_parallel_tool_use": True}
    assert second["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


# --- max_uses, domain filters, declarations ------------------------------------------------------


def test_max_uses_counts_across_the_request(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider
) -> None:
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "one"})]))
    )
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s2", "web_search", {"query": "two"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("done")))
    r = post(gw, body([{**SEARCH, "max_uses": 1}]))
    content = r.json()["content"]
    assert [b["type"] for b in content] == [
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert content[3]["content"] == {
        "type": "web_search_tool_result_error",
        "error_code": "max_uses_exceeded",
    }
    assert [q.query["q"] for q in provider.requests] == ["one"]
    assert r.json()["usage"]["server_tool_use"]["web_search_requests"] == 1
    third = rounds(upstream)[2]
    assert "tools" in third and third["tools"] == []  # the exhausted tool is no longer offered
    assert third["messages"][-1]["content"][0]["is_error"] is True


def test_domain_filters(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, site: WebSite
) -> None:
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "py"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    r = post(gw, body([{**SEARCH, "allowed_domains": ["docs.python.org"]}]))
    assert [h["url"] for h in r.json()["content"][1]["content"]] == ["https://docs.python.org/py/2"]

    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s2", "web_search", {"query": "py"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    r = post(gw, body([{**SEARCH, "blocked_domains": ["example.org"]}]))
    assert [h["url"] for h in r.json()["content"][1]["content"]] == [
        "https://example.com/py/1",
        "https://docs.python.org/py/2",
    ]

    upstream.script(
        "/v1/messages",
        json_answer(anthropic_tool_message([("f1", "web_fetch", {"url": f"{site.url}/article"})])),
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    r = post(gw, body([{**FETCH, "allowed_domains": ["example.com"]}]))
    assert r.json()["content"][1]["content"]["error_code"] == "url_not_allowed"
    assert site.paths == []


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (
            {**SEARCH, "allowed_domains": ["a.com"], "blocked_domains": ["b.com"]},
            "tools.0: allowed_domains and blocked_domains cannot be used together",
        ),
        (
            {"type": "web_search_20260209", "name": "web_search"},
            "tools.0: server tool type 'web_search_20260209' is not supported by this gateway: use "
            'web_search_20250305, or a later version whose allowed_callers includes "direct"',
        ),
        (
            {"type": "web_fetch_20240101", "name": "web_fetch", "allowed_callers": ["direct"]},
            "tools.0: server tool type 'web_fetch_20240101' is not supported by this gateway: use "
            'web_fetch_20250910, or a later version whose allowed_callers includes "direct"',
        ),
        ({**SEARCH, "max_uses": 0}, "tools.0.max_uses: must be a positive integer"),
    ],
)
def test_bad_declarations_are_anthropic_400s(
    gw: LiveServer, upstream: ScriptedUpstream, tool: dict[str, Any], message: str
) -> None:
    r = post(gw, body([tool]))
    assert r.status_code == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"] == {"type": "invalid_request_error", "message": message}
    assert rounds(upstream) == []


def test_later_version_with_direct_caller_runs(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "new"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    tool = {"type": "web_search_20260209", "name": "web_search", "allowed_callers": ["direct"]}
    r = post(gw, body([tool]))
    assert [b["type"] for b in r.json()["content"]] == ["server_tool_use", "web_search_tool_result", "text"]


def test_alias_lets_a_plain_function_opt_in(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any
) -> None:
    gateway_config(messages__tool_aliases=("WebSearch=web_search",))
    plain = {"name": "WebSearch", "description": "old client", "input_schema": {"type": "object"}}
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "WebSearch", {"query": "alias"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    r = post(gw, body([plain]))
    content = r.json()["content"]
    assert SRVTOOLU.match(content[0]["id"])
    assert content[0] == {
        "type": "server_tool_use",
        "id": content[0]["id"],
        "name": "web_search",
        "input": {"query": "alias"},
    }
    assert content[1]["type"] == "web_search_tool_result"
    assert [q.query["q"] for q in provider.requests] == ["alias"]
    assert rounds(upstream)[0]["tools"][0]["name"] == "WebSearch"


def test_user_location_goes_to_the_provider(
    gw: LiveServer,
    upstream: ScriptedUpstream,
    provider: SearchProvider,
    gateway_config: Any,
    monkeypatch: Any,
) -> None:
    gateway_config(web_search__provider="brave", web_search_api_key="brave-key")
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "rain"})]))
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    post(gw, body([{**SEARCH, "user_location": {"type": "approximate", "country": "de", "city": "Berlin"}}]))
    assert provider.requests[0].query["country"] == "DE"


def test_history_blocks_go_upstream_as_the_models_turns(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    history = [
        {"role": "user", "content": "Find it."},
        {
            "role": "assistant",
            "content": [
                {"type": "server_tool_use", "id": "s0", "name": "web_search", "input": {"query": "it"}},
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "s0",
                    "content": [
                        {
                            "type": "web_search_result",
                            "title": "It",
                            "url": "https://it.example/",
                            "encrypted_content": "It is here.",
                        }
                    ],
                },
                {"type": "text", "text": "Found it."},
            ],
        },
        {"role": "user", "content": "Thanks"},
    ]
    upstream.script("/v1/messages", json_answer(anthropic_message("welcome")))
    r = post(gw, {**body([SEARCH]), "messages": history})
    assert r.json()["content"] == [{"type": "text", "text": "welcome"}]
    sent = rounds(upstream)[0]["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "s0", "name": "web_search", "input": {"query": "it"}}],
    }
    assert sent[2]["role"] == "user" and sent[2]["content"][0]["tool_use_id"] == "s0"
    assert (
        "https://it.example/" in sent[2]["content"][0]["content"]
        and "It is here." in sent[2]["content"][0]["content"]
    )
    assert sent[3] == {"role": "assistant", "content": [{"type": "text", "text": "Found it."}]}
    assert sent[4] == {"role": "user", "content": "Thanks"}


# --- usage ----------------------------------------------------------------------------------------


def test_usage_is_the_saturating_sum_over_rounds(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    usage1 = {
        "input_tokens": 10,
        "output_tokens": 4,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 1,
    }
    usage2 = {
        "input_tokens": 20,
        "output_tokens": 6,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 9,
    }
    upstream.script(
        "/v1/messages",
        json_answer(anthropic_tool_message([("s1", "web_search", {"query": "q"})], usage=usage1)),
    )
    answer = anthropic_message("ok")
    answer["usage"] = usage2
    upstream.script("/v1/messages", json_answer(answer))
    assert post(gw, body([SEARCH])).json()["usage"] == {
        "input_tokens": 30,
        "output_tokens": 10,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 10,
        "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
    }
    huge = {"input_tokens": USAGE_MAX - 5, "output_tokens": 1}
    upstream.script(
        "/v1/messages",
        json_answer(anthropic_tool_message([("s1", "web_search", {"query": "q"})], usage=huge)),
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
    assert post(gw, body([SEARCH])).json()["usage"]["input_tokens"] == USAGE_MAX


# --- stream validation and upstream errors ---------------------------------------------------------


def _start() -> bytes:
    message = anthropic_message("")
    message["content"] = []
    return anthropic_event("message_start", {"type": "message_start", "message": message})


def _tool_start(index: int = 0, call_id: str = "s1", name: str = "web_search") -> bytes:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return anthropic_event(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    )


def _tool_delta(index: int = 0) -> bytes:
    delta = {"type": "input_json_delta", "partial_json": '{"query":"q"}'}
    return anthropic_event(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def _stop(index: int = 0) -> bytes:
    return anthropic_event("content_block_stop", {"type": "content_block_stop", "index": index})


_END = [
    anthropic_event(
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 1}},
    ),
    anthropic_event("message_stop", {"type": "message_stop"}),
]


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([_start(), _tool_start(), _tool_delta(), _stop()], "the stream ended before message_stop"),
        (
            [_start(), _tool_start(), _tool_delta(), _stop(), b"data: [DONE]\n\n"],
            "[DONE] before message_stop",
        ),
        (
            [_start(), _tool_start(), b"event: content_block_delta\ndata: {not json\n\n"],
            "an event whose data is not valid JSON",
        ),
        (
            [_start(), _tool_start(), _tool_delta(), *_END],
            "message_stop with a content block not closed by content_block_stop",
        ),
        (
            [_start(), _tool_start(0), _tool_delta(0), _stop(0), _tool_start(0, "s2"), _stop(0), *_END],
            "content block index 0 used twice",
        ),
        (
            [_start(), _tool_start(-1), _tool_delta(-1), _stop(-1), *_END],
            "a content block index that is not a non-negative integer",
        ),
        ([_start(), _tool_start(0, ""), _tool_delta(), _stop(), *_END], "a tool_use block has an empty id"),
        (
            [
                _start(),
                _tool_start(0),
                _tool_delta(0),
                _stop(0),
                _tool_start(1),
                _tool_delta(1),
                _stop(1),
                *_END,
            ],
            "a tool_use id used twice",
        ),
        (
            [_start(), _tool_start(0, "s1", ""), _tool_delta(), _stop(), *_END],
            "a tool_use block has an empty name",
        ),
    ],
)
def test_a_broken_round_ends_with_api_error_and_runs_no_tool(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, events: list[bytes], reason: str
) -> None:
    upstream.script("/v1/messages", sse(events))
    got = stream(gw, body([SEARCH]))
    name, data = got[-1]
    assert name == "error"
    assert data == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": f"The upstream model server sent a malformed response: {reason}.",
        },
    }
    assert provider.requests == []  # no tool ran
    assert len(rounds(upstream)) == 1
    assert all(d.get("content_block", {}).get("type") != "server_tool_use" for _, d in got)


def test_a_json_answer_to_a_streamed_round_ends_with_api_error(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider
) -> None:
    """A 200 that is not an event stream is a malformed round: its hidden call never reaches the
    client and no tool runs; the client's stream ends with api_error, first round or later."""
    hidden = anthropic_tool_message([("s1", "web_search", {"query": "q"})], text="Looking.")
    upstream.script("/v1/messages", json_answer(hidden))
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/messages",
        json=body([SEARCH], stream=True),
        headers={"x-api-key": "k"},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read()
    assert b"tool_use" not in raw and b"Looking." not in raw
    got = events_of(raw)
    assert got == [("error", _api_error("a streamed round answered application/json"))]
    assert provider.requests == []
    # A later round answered the same way: the stream so far, then the same error event.
    upstream.script("/v1/messages", sse(anthropic_tool_events([("s1", "web_search", {"query": "q"})])))
    upstream.script("/v1/messages", json_answer(hidden))
    got = stream(gw, body([SEARCH]))
    assert got[-1] == ("error", _api_error("a streamed round answered application/json"))
    assert len(provider.requests) == 1  # the first round's call only


def _api_error(reason: str) -> dict[str, Any]:
    message = f"The upstream model server sent a malformed response: {reason}."
    return {"type": "error", "error": {"type": "api_error", "message": message}}


def test_a_broken_json_round_is_an_api_error(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider
) -> None:
    bad = anthropic_tool_message([("", "web_search", {"query": "q"})])
    upstream.script("/v1/messages", json_answer(bad))
    r = post(gw, body([SEARCH]))
    assert r.status_code == 502
    assert r.json()["error"] == {
        "type": "api_error",
        "message": "The upstream model server sent a malformed response: a tool_use block has an empty id.",
    }
    assert provider.requests == []


def test_count_tokens_sends_the_server_tools_as_the_loop_does(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    """vLLM refuses the server-tool declarations: count_tokens counts what the first round sends."""
    history = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_0",
                    "name": "web_search",
                    "input": {"query": "it"},
                },
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_0", "content": []},
                {"type": "text", "text": "Nothing found."},
            ],
        },
        {"role": "user", "content": "Try again."},
    ]
    upstream.script("/v1/messages/count_tokens", json_answer(b'{"input_tokens":  42}'))
    upstream.script("/v1/messages", json_answer(anthropic_message("unused")))
    counted = sdk(gw).messages.count_tokens(
        model="test-model",
        messages=history,
        tools=[{**SEARCH, "max_uses": 2}, FETCH, WEATHER],  # type: ignore[list-item]
    )
    assert counted.input_tokens == 42
    sent = upstream.last("/v1/messages/count_tokens").json()
    loop_round = post(gw, {**body([{**SEARCH, "max_uses": 2}, FETCH, WEATHER]), "messages": history})
    assert loop_round.status_code == 200
    first_round = rounds(upstream)[0]
    assert sent["tools"] == first_round["tools"]  # plain function tools, the client's tool kept
    assert [t["name"] for t in sent["tools"]] == ["get_weather", "web_search", "web_fetch"]
    assert all("type" not in t for t in sent["tools"])
    assert sent["messages"] == first_round["messages"]  # server blocks as the model's own turns
    assert sent["messages"][1]["content"][0]["type"] == "tool_use"
    # Without gateway tools the body still goes upstream byte for byte.
    raw = b'{"model":"test-model",  "messages":[{"role":"user","content":"hi"}]}'
    r = httpx.post(f"{gw.url}/v1/messages/count_tokens", content=raw, headers={"x-api-key": "k"})
    assert r.status_code == 200
    assert upstream.last("/v1/messages/count_tokens").body == raw
    # A bad declaration is the Messages route's 400.
    r = httpx.post(
        f"{gw.url}/v1/messages/count_tokens",
        json={"model": "m", "messages": USER, "tools": [{"type": "web_search_20250305", "name": "search"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_upstream_error_bodies_are_forwarded_unmodified(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    error = orjson.dumps(anthropic_error("prompt is too long: 300000 tokens > 200000 maximum"))
    upstream.script("/v1/messages", json_answer(error, status=400))
    r = post(gw, body([SEARCH]))
    assert r.status_code == 400 and r.content == error
    upstream.script("/v1/messages", json_answer(error, status=400))
    with httpx.stream(
        "POST", f"{gw.url}/v1/messages", json=body([SEARCH], stream=True), headers={"x-api-key": "k"}
    ) as s:
        assert s.status_code == 400 and s.read() == error
    # A later round's error, once the stream has begun: the stream's error event, same wording.
    overloaded = orjson.dumps(anthropic_error("Overloaded", "overloaded_error"))
    upstream.script("/v1/messages", sse(anthropic_tool_events([("s1", "web_search", {"query": "q"})])))
    upstream.script("/v1/messages", json_answer(overloaded, status=529))
    got = stream(gw, body([SEARCH]))
    assert got[-1] == ("error", orjson.loads(overloaded))
    # JSON: a later round's error is the answer, as the upstream sent it.
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "q"})]))
    )
    upstream.script("/v1/messages", json_answer(overloaded, status=529))
    r = post(gw, body([SEARCH]))
    assert r.status_code == 529 and r.content == overloaded


def test_round_cap_ends_with_pause_turn(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(responses__max_rounds=2)
    for n in range(2):
        upstream.script(
            "/v1/messages", json_answer(anthropic_tool_message([(f"s{n}", "web_search", {"query": "q"})]))
        )
    r = post(gw, body([SEARCH]))
    assert r.json()["stop_reason"] == "pause_turn"
    assert len(rounds(upstream)) == 2
    assert [b["type"] for b in r.json()["content"]].count("web_search_tool_result") == 2


# --- Claude Code end to end -----------------------------------------------------------------------


@pytest.mark.slow
def test_claude_code_web_search_end_to_end(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, tmp_path: Any
) -> None:
    """Claude Code (``claude -p``) asks for a web search: its WebSearch tool sends the
    ``web_search_20250305`` server tool, the gateway runs it against the local provider, and the
    answer Claude Code prints is built from the search result."""
    import re
    import subprocess

    from aiohttp import web

    from tests.clients import claude_code_cli

    seen: list[dict[str, Any]] = []

    async def model(request: web.Request, rec: Any) -> web.StreamResponse:
        """The scripted model: it searches when asked, and answers from what the search found."""
        data = rec.json()
        seen.append(data)
        names = [t.get("name") for t in data.get("tools") or []]
        last = data["messages"][-1]
        content = last["content"] if isinstance(last["content"], list) else []
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if "web_search" in names:  # Claude Code's WebSearch request, through the gateway's loop
            if not results:
                events = anthropic_tool_events([("toolu_s1", "web_search", {"query": "gateway news"})])
            else:
                found = re.search(r"https://[A-Za-z0-9./_-]+", str(results[0]["content"]))
                assert found is not None, results
                events = anthropic_events([f"The top result is {found.group(0)}"])
        elif not results:  # Claude Code's main turn: call its WebSearch tool
            events = anthropic_tool_events([("toolu_m1", "WebSearch", {"query": "gateway news"})])
        else:
            found = re.search(r"https://[A-Za-z0-9./_-]+", orjson.dumps(results[0]["content"]).decode())
            assert found is not None, results
            events = anthropic_events([f"Answer from the web: {found.group(0)}"])
        return await sse(events)(request, rec)

    for _ in range(8):
        upstream.script("/v1/messages", model)
    result = subprocess.run(
        [
            str(claude_code_cli()),
            "-p",
            "search the web for gateway news",
            "--model",
            "test-model",
            "--allowedTools",
            "WebSearch",
        ],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "ANTHROPIC_BASE_URL": gw.url,
            "ANTHROPIC_API_KEY": "sk-claude-code",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert [r.query["q"] for r in provider.requests] == ["gateway news"]
    assert result.stdout.strip() == "Answer from the web: https://example.com/gateway-news/1"
    server_tool_requests = [
        s for s in seen if any(t.get("name") == "web_search" for t in s.get("tools") or [])
    ]
    assert len(server_tool_requests) == 2  # the hidden search round and the answer round


# --- Celery ----------------------------------------------------------------------------------------


def test_calls_go_to_the_tools_queue_when_celery_is_configured(
    gw: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any
) -> None:
    """With a broker the loop's calls are tasks on the ``tools`` queue (the dispatch the Responses
    loop uses): with no worker consuming, the call times out although the provider is up; with a
    real worker it runs."""
    from celery.contrib.testing.worker import start_worker

    import inference_app.tools.tasks  # noqa: F401  (registers the tool task)
    from gateway.celery import app as celery_app
    from tests.celery_rebind import rebind

    redis_url = "redis://127.0.0.1:6379/11"  # a db of its own: no other test's worker reads it

    rebind(celery_app, gateway_config(redis_url=redis_url, tools__call_timeout_s=2.0))
    try:
        upstream.script(
            "/v1/messages", json_answer(anthropic_tool_message([("s1", "web_search", {"query": "q"})]))
        )
        upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
        r = post(gw, body([SEARCH]))
        assert r.json()["content"][1]["content"] == {
            "type": "web_search_tool_result_error",
            "error_code": "unavailable",
        }
        assert (
            "web_search call timed out after 2 s"
            in rounds(upstream)[1]["messages"][2]["content"][0]["content"]
        )
        assert provider.requests == []
        with start_worker(
            celery_app,
            queues=["tools"],
            pool="threads",
            concurrency=2,
            perform_ping_check=False,
            loglevel="WARNING",
        ):
            upstream.script(
                "/v1/messages", json_answer(anthropic_tool_message([("s2", "web_search", {"query": "q"})]))
            )
            upstream.script("/v1/messages", json_answer(anthropic_message("ok")))
            r = post(gw, body([SEARCH]))
        assert r.json()["content"][1]["content"][0]["url"] == "https://example.com/q/1"
        assert [q.query["q"] for q in provider.requests] == ["q"]
    finally:
        rebind(celery_app, gateway_config(redis_url=""))


# --- the decision and the history, directly ---------------------------------------------------------


def test_the_decision(gateway_config: Any) -> None:
    from messages_app.server_tools import declares_gateway_tools

    gateway_config(messages__tool_aliases=("WebFetch=web_fetch",))
    assert declares_gateway_tools(orjson.dumps(body([SEARCH])))
    assert declares_gateway_tools(orjson.dumps(body([{"type": "web_fetch_20990101", "name": "web_fetch"}])))
    assert declares_gateway_tools(orjson.dumps(body([{"name": "WebFetch", "input_schema": {}}])))
    assert not declares_gateway_tools(orjson.dumps(body([WEATHER])))
    assert not declares_gateway_tools(orjson.dumps(body([{"name": "WebSearch", "input_schema": {}}])))
    assert not declares_gateway_tools(b'{"messages": "web_search_20250305", "tools": "x"}')
    assert not declares_gateway_tools(b"web_search_20250305 not json")


def test_fetch_and_error_results_in_history_go_upstream_as_tool_results(gateway_config: Any) -> None:
    from gateway.core.config import get_config
    from messages_app.server_tools import plan_request, upstream_messages

    gateway_config()
    plan = plan_request(body([FETCH, SEARCH]), get_config())
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Body."}}
    history = [
        {"role": "user", "content": "Read it."},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "server_tool_use",
                    "id": "f0",
                    "name": "web_fetch",
                    "input": {"url": "https://a.example/"},
                },
                {"type": "server_tool_use", "id": "s0", "name": "web_search", "input": {"query": "a"}},
                {
                    "type": "web_fetch_tool_result",
                    "tool_use_id": "f0",
                    "content": {
                        "type": "web_fetch_result",
                        "url": "https://a.example/",
                        "content": {**document, "title": "A"},
                    },
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "s0",
                    "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
                },
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "And?"}]},
    ]
    assert upstream_messages(history, plan) == [
        {"role": "user", "content": "Read it."},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "f0", "name": "web_fetch", "input": {"url": "https://a.example/"}},
                {"type": "tool_use", "id": "s0", "name": "web_search", "input": {"query": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "f0",
                    "content": "Title: A\nURL: https://a.example/\n\nBody.",
                },
                {"type": "tool_result", "tool_use_id": "s0", "content": '{"error":"max_uses_exceeded"}'},
                {"type": "text", "text": "And?"},
            ],
        },
    ]
