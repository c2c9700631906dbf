"""MCP with a real server built with the ``mcp`` SDK on loopback: host policy (allowed_hosts, SSRF),
discovery with pagination and allowed_tools, limits, calls over streamable HTTP and SSE, credentials."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.core.config import Config, McpServerConfig, load_config, replace
from gateway.core.errors import BadRequest
from inference_app.tools import classify_tools, discover_mcp_tools, run_gateway_calls
from inference_app.tools.base import McpServer
from inference_app.tools.mcp import check_server_allowed, listings_from_items
from tests.servers import LiveServer, free_port
from tests.tools.tools_servers import McpRecord, start_mcp_server


@pytest.fixture
def mcp_server() -> Iterator[tuple[LiveServer, McpRecord, str]]:
    live, record, url = start_mcp_server(5, page_size=2)
    yield live, record, url
    live.stop()


def allow_loopback(**changes: Any) -> Config:
    return replace(load_config({"MCP_ALLOWED_HOSTS": "127.0.0.1"}), **changes)


def decl(url: str, label: str = "local", **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "server_url": url, "require_approval": "never", **extra}


# --- host policy ---------------------------------------------------------------------------------


async def test_request_declared_server_needs_an_allowed_host(mcp_server: Any) -> None:
    _, record, url = mcp_server
    config = load_config({})  # allowed_hosts empty: request-declared servers are refused
    ts = classify_tools([decl(url)], config=config)
    with pytest.raises(BadRequest) as info:
        await discover_mcp_tools(ts, config=config)
    err = info.value
    assert (err.status, err.param, err.code) == (400, "tools[0].server_url", "invalid_value")
    assert err.message == (
        "MCP server host '127.0.0.1' is not allowed: the gateway operator lists permitted hosts in "
        "[mcp] allowed_hosts (MCP_ALLOWED_HOSTS)."
    )
    assert record.headers == []  # refused before any connection


async def test_one_disallowed_server_refuses_the_request_before_any_connection(mcp_server: Any) -> None:
    _, record, url = mcp_server
    config = allow_loopback()
    ts = classify_tools([decl(url, "ok"), decl("http://evil.example.net/mcp", "bad")], config=config)
    with pytest.raises(BadRequest) as info:
        await discover_mcp_tools(ts, config=config)
    assert info.value.param == "tools[1].server_url"
    assert record.headers == []  # the allowed server was not contacted either


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "localhost",
        "10.1.2.3",
        "192.168.0.10",
        "172.16.5.5",
        "169.254.169.254",
        "[::1]",
        "[fe80::1]",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
        "100.64.0.1",
    ],
)
async def test_private_addresses_are_refused_under_a_wildcard(host: str) -> None:
    config = load_config({"MCP_ALLOWED_HOSTS": "*"})
    server = McpServer(label="x", url=f"http://{host}:8080/mcp", tool_index=3)
    with pytest.raises(BadRequest) as info:
        await check_server_allowed(server, config)
    assert info.value.param == "tools[3].server_url"
    assert "resolves to a loopback, private or link-local address" in info.value.message


async def test_a_public_address_passes_a_wildcard() -> None:
    config = load_config({"MCP_ALLOWED_HOSTS": "*"})
    await check_server_allowed(McpServer(label="x", url="https://93.184.215.14/mcp", tool_index=0), config)
    config = load_config({"MCP_ALLOWED_HOSTS": "*.example.com"})
    with pytest.raises(BadRequest) as info:  # not under the wildcard
        await check_server_allowed(McpServer(label="x", url="https://other.test/mcp", tool_index=0), config)
    assert info.value.message.startswith("MCP server host 'other.test' is not allowed")


async def test_a_name_resolving_to_loopback_is_refused_under_a_wildcard() -> None:
    # "localhost" resolves to 127.0.0.1: a DNS name is judged by the addresses it resolves to.
    config = load_config({"MCP_ALLOWED_HOSTS": "*"})
    with pytest.raises(BadRequest) as info:
        await check_server_allowed(McpServer(label="x", url="http://localhost:1/mcp", tool_index=0), config)
    assert info.value.message.startswith("MCP server host 'localhost' resolves to a loopback")


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> None:
    """Answer name lookups of the running event loop (the gateway's resolver seam) from ``answers``."""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in answers:
            return await real(host, port, *args, **kwargs)
        return [
            (
                socket.AF_INET6 if ":" in address else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (address, port, 0, 0) if ":" in address else (address, port),
            )
            for address in answers[host]
        ]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize("private", ["10.0.0.5", "127.0.0.1", "169.254.169.254", "fd00::1"])
async def test_a_name_resolving_to_public_and_private_addresses_is_refused(
    monkeypatch: pytest.MonkeyPatch, private: str
) -> None:
    """One private answer among public ones is enough: the connection could go to any of them."""
    fake_dns(
        monkeypatch,
        {"mixed.example.com": ["93.184.215.14", private], "public.example.com": ["93.184.215.14"]},
    )
    config = load_config({"MCP_ALLOWED_HOSTS": "*.example.com"})
    await check_server_allowed(
        McpServer(label="x", url="https://public.example.com/mcp", tool_index=0), config
    )
    with pytest.raises(BadRequest) as info:
        await check_server_allowed(
            McpServer(label="x", url="https://mixed.example.com/mcp", tool_index=2), config
        )
    assert (info.value.status, info.value.param, info.value.code) == (
        400,
        "tools[2].server_url",
        "invalid_value",
    )
    assert info.value.message == (
        "MCP server host 'mixed.example.com' resolves to a loopback, private or link-local address; "
        "only hosts listed exactly in [mcp] allowed_hosts may do so."
    )


async def test_an_exact_entry_allows_a_private_host() -> None:
    config = load_config({"MCP_ALLOWED_HOSTS": "10.1.2.3, localhost"})
    await check_server_allowed(McpServer(label="x", url="http://10.1.2.3/mcp", tool_index=0), config)
    await check_server_allowed(McpServer(label="x", url="http://LOCALHOST:9/mcp", tool_index=0), config)


async def test_operator_servers_are_trusted_as_configured() -> None:
    await check_server_allowed(
        McpServer(label="x", url="http://10.0.0.1/mcp", tool_index=0, operator=True), load_config({})
    )


# --- discovery -----------------------------------------------------------------------------------


async def test_discovery_follows_pagination(mcp_server: Any) -> None:
    _, record, url = mcp_server
    config = allow_loopback()
    ts = classify_tools([decl(url)], config=config)
    [listing] = await discover_mcp_tools(ts, config=config)
    assert listing.ok and listing.server_label == "local"
    assert [t["name"] for t in listing.tools] == ["tool_0", "tool_1", "tool_2", "tool_3", "tool_4"]
    assert record.cursors == [None, "2", "4"]
    assert listing.tools[0] == {
        "name": "tool_0",
        "description": "Test tool number 0.",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "annotations": None,
    }
    assert listing.item_fields()["server_label"] == "local"
    assert listing.retained_bytes == len(orjson.dumps(listing.item_fields()))


async def test_allowed_tools_filters_discovery(mcp_server: Any) -> None:
    _, _, url = mcp_server
    config = allow_loopback()
    ts = classify_tools([decl(url, allowed_tools=["tool_1", "tool_4", "missing"])], config=config)
    [listing] = await discover_mcp_tools(ts, config=config)
    assert [t["name"] for t in listing.tools] == ["tool_1", "tool_4"]
    ts2 = ts.with_mcp_tools([listing])
    assert [f.name for f in ts2.model_functions()] == ["mcp__local__tool_1", "mcp__local__tool_4"]


async def test_allowed_tools_read_only_filter() -> None:
    live, _, url = start_mcp_server(4, read_only={"tool_0", "tool_2"})
    try:
        config = allow_loopback()
        ts = classify_tools([decl(url, allowed_tools={"read_only": True})], config=config)
        [listing] = await discover_mcp_tools(ts, config=config)
        assert [t["name"] for t in listing.tools] == ["tool_0", "tool_2"]
        assert listing.tools[0]["annotations"] == {"readOnlyHint": True}
    finally:
        live.stop()


async def test_at_most_128_discovered_tools() -> None:
    live, _, url = start_mcp_server(129, page_size=50)
    try:
        config = allow_loopback()
        ts = classify_tools([decl(url)], config=config)
        with pytest.raises(BadRequest) as info:
            await discover_mcp_tools(ts, config=config)
        err = info.value
        assert (err.status, err.param, err.code) == (400, "tools", "array_above_max_length")
        assert err.message == (
            "Too many MCP tools: the declared servers offer 129, at most 128 are allowed per request. "
            "Narrow them with allowed_tools."
        )
        # Exactly 128 is fine, and allowed_tools brings a big server under the limit.
        narrowed = classify_tools([decl(url, allowed_tools=[f"tool_{n}" for n in range(128)])], config=config)
        [listing] = await discover_mcp_tools(narrowed, config=config)
        assert len(listing.tools) == 128
    finally:
        live.stop()


async def test_the_tool_limit_counts_across_servers() -> None:
    live, _, url = start_mcp_server(65, page_size=100)
    try:
        config = allow_loopback()
        ts = classify_tools([decl(url, "a"), decl(url, "b")], config=config)
        with pytest.raises(BadRequest) as info:
            await discover_mcp_tools(ts, config=config)
        assert "offer 130" in info.value.message
    finally:
        live.stop()


async def test_an_unreachable_server_is_a_failed_listing_not_an_error() -> None:
    config = allow_loopback(mcp__discovery_timeout_s=5.0)
    ts = classify_tools([decl(f"http://127.0.0.1:{free_port()}/mcp")], config=config)
    [listing] = await discover_mcp_tools(ts, config=config)
    assert not listing.ok and listing.tools == []
    assert listing.error is not None and listing.error.startswith("could not list tools: ")


async def test_skip_labels_and_listings_from_items(mcp_server: Any) -> None:
    _, record, url = mcp_server
    config = allow_loopback()
    ts = classify_tools([decl(url)], config=config)
    assert await discover_mcp_tools(ts, config=config, skip_labels=["local"]) == []
    assert record.cursors == []
    items = [
        {
            "type": "mcp_list_tools",
            "id": "mcpl_1",
            "server_label": "local",
            "tools": [{"name": "tool_0", "input_schema": {}}],
            "error": None,
        }
    ]
    [listing] = listings_from_items(items)
    assert ts.with_mcp_tools([listing]).owner("mcp__local__tool_0") == "gateway"


# --- calls ---------------------------------------------------------------------------------------


async def discovered(url: str, config: Config, **extra: Any) -> Any:
    ts = classify_tools([decl(url, **extra)], config=config)
    listings = await discover_mcp_tools(ts, config=config)
    return ts.with_mcp_tools(listings)


async def test_calls_run_and_return_output(mcp_server: Any) -> None:
    _, record, url = mcp_server
    config = allow_loopback()
    ts = await discovered(url, config)
    calls = [
        ts.make_call(f"c{i}", f"mcp__local__tool_{i}", orjson.dumps({"text": f"hi {i}"}).decode())
        for i in range(3)
    ]
    results = await run_gateway_calls(calls, config=config)
    assert [r.call_id for r in results] == ["c0", "c1", "c2"]
    assert [r.mcp_output for r in results] == ["tool_0 got hi 0", "tool_1 got hi 1", "tool_2 got hi 2"]
    assert all(r.status == "completed" and r.kind == "mcp" and r.server_label == "local" for r in results)
    assert results[1].mcp_tool_name == "tool_1" and results[1].output == "tool_1 got hi 1"
    assert sorted(record.calls) == [
        ("tool_0", {"text": "hi 0"}),
        ("tool_1", {"text": "hi 1"}),
        ("tool_2", {"text": "hi 2"}),
    ]


async def test_each_call_checks_the_servers_addresses_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding between discovery and call: ``mcp.example.com`` (allowed by a wildcard, so it
    must resolve to public addresses) answers a public address to discovery's check, then the
    server's loopback address. The call checks again before connecting: a failed call, and the
    server never sees it."""
    answers = [["93.184.215.14"], ["127.0.0.1"]]  # the first lookup's, then every later one's
    lookups: list[list[str]] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in ("mcp.example.com", b"mcp.example.com"):
            return real(host, port, *args, **kwargs)
        lookups.append(answers[min(len(lookups), len(answers) - 1)])
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port))) for a in lookups[-1]
        ]

    # Every lookup (the event loop's resolver and the MCP client's connections) goes through here.
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    config = load_config({"MCP_ALLOWED_HOSTS": "*.example.com"})
    live, record, _ = start_mcp_server(1, also_named="mcp.example.com")
    try:
        ts = await discovered(f"http://mcp.example.com:{live.port}/mcp", config)
        assert "mcp__local__tool_0" in ts.functions  # discovered (its connection went where DNS said)
        seen = len(lookups)
        call = ts.make_call("c", "mcp__local__tool_0", '{"text": "hi"}')
        [result] = await run_gateway_calls([call], config=config)
    finally:
        live.stop()
    assert result.status == "failed"
    assert result.error == (
        "MCP server host 'mcp.example.com' resolves to a loopback, private or link-local address; "
        "only hosts listed exactly in [mcp] allowed_hosts may do so."
    )
    assert len(lookups) == seen + 1  # the call's check, and no connection after it
    assert record.calls == []


async def test_a_tool_error_is_a_failed_call(mcp_server: Any) -> None:
    _, _, url = mcp_server
    config = allow_loopback()
    ts = await discovered(url, config)
    [result] = await run_gateway_calls(
        [ts.make_call("c", "mcp__local__tool_0", '{"mode": "fail"}')], config=config
    )
    assert result.status == "failed" and result.error == "the tool broke"
    assert orjson.loads(result.output) == {"error": "the tool broke"}


async def test_a_slow_tool_times_out(mcp_server: Any) -> None:
    _, _, url = mcp_server
    config = allow_loopback(tools__call_timeout_s=0.5)
    ts = await discovered(url, config)
    [result] = await run_gateway_calls(
        [ts.make_call("c", "mcp__local__tool_0", '{"mode": "slow", "seconds": 3}')], config=config
    )
    assert result.error == "mcp call timed out after 0.5 s"


async def test_request_credentials_reach_the_server_and_nothing_else(mcp_server: Any) -> None:
    _, record, url = mcp_server
    config = allow_loopback()
    tool = decl(url, headers={"X-Api-Key": "k-123"}, authorization="oauth-token")
    ts = classify_tools([tool], config=config)
    ts = ts.with_mcp_tools(await discover_mcp_tools(ts, config=config))
    [result] = await run_gateway_calls([ts.make_call("c", "mcp__local__tool_0", "{}")], config=config)
    assert result.ok
    assert record.headers and all(
        h.get("authorization") == "Bearer oauth-token" and h.get("x-api-key") == "k-123"
        for h in record.headers
    )
    serialized = orjson.dumps(result.to_payload()).decode()
    assert "oauth-token" not in serialized and "k-123" not in serialized


async def test_operator_configured_server_by_label(mcp_server: Any) -> None:
    _, record, url = mcp_server
    config = replace(
        load_config({}),  # no allowed hosts: the operator's server is used by label
        mcp_servers={
            "corp": McpServerConfig(
                url=url,
                headers={"X-Team": "search"},
                secret_headers={"Authorization": "Bearer operator-secret"},
                allowed_tools=("tool_2", "tool_3"),
            )
        },
    )
    ts = classify_tools([{"type": "mcp", "server_label": "corp", "require_approval": "never"}], config=config)
    [listing] = await discover_mcp_tools(ts, config=config)
    assert [t["name"] for t in listing.tools] == ["tool_2", "tool_3"]
    ts = ts.with_mcp_tools([listing])
    [result] = await run_gateway_calls(
        [ts.make_call("c", "mcp__corp__tool_3", '{"text": "x"}')], config=config
    )
    assert result.mcp_output == "tool_3 got x"
    assert all(
        h.get("authorization") == "Bearer operator-secret" and h.get("x-team") == "search"
        for h in record.headers
    )


async def test_sse_transport() -> None:
    live, record, url = start_mcp_server(3, page_size=2, transport="sse")
    try:
        config = allow_loopback()
        ts = classify_tools([decl(url, authorization="sse-token")], config=config)
        assert ts.server("local").transport == "sse"
        [listing] = await discover_mcp_tools(ts, config=config)
        assert [t["name"] for t in listing.tools] == ["tool_0", "tool_1", "tool_2"]
        ts = ts.with_mcp_tools([listing])
        [result] = await run_gateway_calls(
            [ts.make_call("c", "mcp__local__tool_2", '{"text": "sse"}')], config=config
        )
        assert result.mcp_output == "tool_2 got sse"
        assert any(h.get("authorization") == "Bearer sse-token" for h in record.headers)
    finally:
        live.stop()
