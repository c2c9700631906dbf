"""web_search against real provider servers on loopback (SearXNG, Brave and Tavily JSON APIs), and
the in-process round runner: concurrency, timeout, order."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.config import Config, load_config, replace
from inference_app.tools import ToolCall, classify_tools, run_gateway_calls
from inference_app.tools.web_search import normalize_domain
from tests.tools.tools_servers import SearchProvider


def searxng(url: str, **changes: Any) -> Config:
    return replace(load_config({}), web_search__provider="searxng", web_search__base_url=url, **changes)


def search_call(call_id: str, queries: list[str], decl: dict[str, Any] | None = None) -> ToolCall:
    ts = classify_tools([decl or {"type": "web_search"}], config=load_config({}))
    return ts.make_call(call_id, "web_search", orjson.dumps({"queries": queries}).decode())


async def test_searxng_results_reach_the_model_as_text_with_sources(provider: SearchProvider) -> None:
    [result] = await run_gateway_calls([search_call("c1", ["python asyncio"])], config=searxng(provider.url))
    assert result.status == "completed" and result.error is None
    assert result.call_id == "c1" and result.kind == "web_search"
    assert provider.requests[0].path == "/search"
    assert provider.requests[0].query == {"q": "python asyncio", "format": "json"}
    assert result.output.startswith(
        'Search results for "python asyncio":\n[1] python asyncio result 1\n'
        "    URL: https://example.com/python-asyncio/1\n"
        "    About python asyncio: fact number 1."
    )
    assert result.action == {
        "type": "search",
        "query": "python asyncio",
        "queries": ["python asyncio"],
        "sources": [
            {"type": "url", "url": "https://example.com/python-asyncio/1"},
            {"type": "url", "url": "https://docs.python.org/python-asyncio/2"},
            {"type": "url", "url": "https://blocked.example.org/python-asyncio/3"},
        ],
    }


async def test_queries_are_batched_in_one_call(provider: SearchProvider) -> None:
    queries = ["a", "b", "c", "d", "e"]
    provider.hold_until = 5  # each query waits at the provider until all five are there
    [result] = await run_gateway_calls([search_call("c1", queries)], config=searxng(provider.url))
    assert result.ok
    assert sorted(r.query["q"] for r in provider.requests) == queries
    assert [line for line in result.output.splitlines() if line.startswith("Search results")] == [
        f'Search results for "{q}":' for q in queries
    ]
    assert provider.peak_in_flight == 5, "the 5 queries of one call ran one after another"


async def test_more_than_five_queries_fail_the_call(provider: SearchProvider) -> None:
    [result] = await run_gateway_calls([search_call("c1", list("abcdef"))], config=searxng(provider.url))
    assert result.status == "failed"
    assert result.error == "web_search takes at most 5 queries per call, got 6"
    assert orjson.loads(result.output) == {"error": "web_search takes at most 5 queries per call, got 6"}
    assert provider.requests == []


@pytest.mark.parametrize("arguments", ["not json", '["a"]', '{"queries": []}', '{"queries": [1]}'])
async def test_malformed_arguments_fail_the_call(provider: SearchProvider, arguments: str) -> None:
    ts = classify_tools([{"type": "web_search"}], config=load_config({}))
    [result] = await run_gateway_calls(
        [ts.make_call("c", "web_search", arguments)], config=searxng(provider.url)
    )
    assert result.status == "failed" and result.error
    assert provider.requests == []


async def test_single_query_argument_is_accepted(provider: SearchProvider) -> None:
    ts = classify_tools([{"type": "web_search"}], config=load_config({}))
    call = ts.make_call("c", "web_search", '{"query": "solo"}')
    [result] = await run_gateway_calls([call], config=searxng(provider.url))
    assert result.ok and result.action is not None and result.action["queries"] == ["solo"]


async def test_provider_429_fails_the_call_with_its_message_and_no_retry(provider: SearchProvider) -> None:
    provider.error = (
        429,
        {"error": {"code": "RATE_LIMITED", "detail": "Request rate limit exceeded for plan."}},
    )
    [result] = await run_gateway_calls([search_call("c1", ["x"])], config=searxng(provider.url))
    assert result.status == "failed"
    assert result.error == "searxng answered 429: Request rate limit exceeded for plan."
    assert orjson.loads(result.output) == {
        "error": "searxng answered 429: Request rate limit exceeded for plan."
    }
    assert len(provider.requests) == 1  # no hidden retry


async def test_plain_text_provider_error_is_relayed(provider: SearchProvider) -> None:
    provider.error = (429, "Too Many Requests")
    [result] = await run_gateway_calls([search_call("c1", ["x"])], config=searxng(provider.url))
    assert result.error == "searxng answered 429: Too Many Requests"


async def test_allowed_domains_filter_keeps_those_domains_and_subdomains(provider: SearchProvider) -> None:
    decl = {"type": "web_search", "filters": {"allowed_domains": ["https://python.org", "example.com"]}}
    [result] = await run_gateway_calls([search_call("c1", ["q"], decl)], config=searxng(provider.url))
    assert result.action is not None
    assert [s["url"] for s in result.action["sources"]] == [
        "https://example.com/q/1",
        "https://docs.python.org/q/2",  # a subdomain of python.org
    ]
    assert "blocked.example.org" not in result.output


async def test_blocked_domains_from_operator_and_request(provider: SearchProvider) -> None:
    config = searxng(provider.url, web_search__blocked_domains=("example.org",))
    [result] = await run_gateway_calls([search_call("c1", ["q"])], config=config)
    assert result.action is not None
    assert [s["url"] for s in result.action["sources"]] == [
        "https://example.com/q/1",
        "https://docs.python.org/q/2",
    ]
    decl = {"type": "web_search", "filters": {"blocked_domains": ["python.org"]}}
    [result] = await run_gateway_calls([search_call("c2", ["q"], decl)], config=config)
    assert result.action is not None
    assert [s["url"] for s in result.action["sources"]] == ["https://example.com/q/1"]


async def test_operator_allow_list_cannot_be_widened_by_a_request(provider: SearchProvider) -> None:
    config = searxng(provider.url, web_search__allowed_domains=("python.org",))
    decl = {"type": "web_search", "filters": {"allowed_domains": ["example.com"]}}
    [result] = await run_gateway_calls([search_call("c1", ["q"], decl)], config=config)
    assert result.ok and result.action is not None
    assert result.action["sources"] == []
    assert result.output.startswith('No results for "q".')


def test_normalize_domain() -> None:
    assert normalize_domain("https://www.Example.com/path") == "example.com"
    assert normalize_domain("docs.python.org.") == "docs.python.org"


async def test_brave_provider(provider: SearchProvider) -> None:
    config = replace(
        load_config({"WEB_SEARCH_PROVIDER": "brave", "BRAVE_API_KEY": "brave-key"}),
        web_search__base_url=provider.url,  # the base URL: the gateway appends /res/v1/web/search
    )
    [result] = await run_gateway_calls([search_call("c1", ["rust"])], config=config)
    assert result.ok, result.error
    request = provider.requests[0]
    assert request.headers["X-Subscription-Token"] == "brave-key"
    assert request.query["q"] == "rust"
    assert result.action is not None and len(result.action["sources"]) == 3


async def test_brave_error_detail_is_relayed(provider: SearchProvider) -> None:
    config = replace(
        load_config({"WEB_SEARCH_PROVIDER": "brave", "BRAVE_API_KEY": "wrong"}),
        web_search__base_url=provider.url,  # the base URL: the gateway appends /res/v1/web/search
    )
    [result] = await run_gateway_calls([search_call("c1", ["rust"])], config=config)
    assert result.error == "brave answered 422: The provided subscription token is invalid."


async def test_tavily_provider_sends_key_and_domain_filters(provider: SearchProvider) -> None:
    config = replace(
        load_config({"WEB_SEARCH_PROVIDER": "tavily", "TAVILY_API_KEY": "tavily-key"}),
        web_search__base_url=provider.url,  # the base URL: the gateway appends /search
        web_search__blocked_domains=("blocked.example.org",),
    )
    decl = {"type": "web_search", "filters": {"allowed_domains": ["example.com", "python.org"]}}
    [result] = await run_gateway_calls([search_call("c1", ["go"], decl)], config=config)
    assert result.ok, result.error
    body = provider.requests[0].body
    assert body["api_key"] == "tavily-key" and body["query"] == "go" and body["max_results"] == 5
    assert body["include_domains"] == ["example.com", "python.org"]
    assert body["exclude_domains"] == ["blocked.example.org"]


async def test_tavily_error_is_relayed(provider: SearchProvider) -> None:
    config = replace(
        load_config({"WEB_SEARCH_PROVIDER": "tavily", "TAVILY_API_KEY": "nope"}),
        web_search__base_url=provider.url,  # the base URL: the gateway appends /search
    )
    [result] = await run_gateway_calls([search_call("c1", ["go"])], config=config)
    assert result.error == "tavily answered 401: Unauthorized: missing or invalid API key."


async def test_keyed_provider_without_key_fails_clearly() -> None:
    config = load_config({"WEB_SEARCH_PROVIDER": "brave"})
    [result] = await run_gateway_calls([search_call("c1", ["x"])], config=config)
    assert result.error == "web search provider brave has no API key: set BRAVE_API_KEY"


async def test_unconfigured_searxng_fails_clearly() -> None:
    [result] = await run_gateway_calls([search_call("c1", ["x"])], config=load_config({}))
    assert result.error == "web search is not configured: set [web_search] base_url (WEB_SEARCH_BASE_URL)"


async def test_unreachable_provider_fails_the_call() -> None:
    from tests.servers import free_port

    [result] = await run_gateway_calls(
        [search_call("c1", ["x"])], config=searxng(f"http://127.0.0.1:{free_port()}")
    )
    assert result.status == "failed" and result.error is not None
    assert result.error.startswith("searxng could not be reached: ")


# --- the round runner, in-process ------------------------------------------------------------------


async def test_five_calls_run_concurrently(provider: SearchProvider) -> None:
    """The 5 calls of a round are at the provider at the same time."""
    provider.hold_until = 5  # each call waits at the provider until all five are there
    calls = [search_call(f"c{i}", [f"q{i}"]) for i in range(5)]
    results = await run_gateway_calls(calls, config=searxng(provider.url))
    assert all(r.ok for r in results)
    assert provider.peak_in_flight == 5, "the 5 calls of a round ran one after another"


async def test_concurrency_is_capped_by_config(provider: SearchProvider) -> None:
    # Each call waits (up to 1 s) for a third to join it: with the cap at 2 none ever does.
    provider.hold_until, provider.hold_s = 3, 1.0
    calls = [search_call(f"c{i}", [f"q{i}"]) for i in range(4)]
    config = searxng(provider.url, tools__max_concurrent_gateway_calls=2)
    results = await run_gateway_calls(calls, config=config)
    assert all(r.ok for r in results)
    assert provider.peak_in_flight == 2, f"{provider.peak_in_flight} calls at once with a cap of 2"


async def test_results_keep_call_order(provider: SearchProvider) -> None:
    # The first call is the slowest: order must still be the model's call order.
    provider.delay_s = 0.05
    calls = [search_call(f"c{i}", [f"q{i}"] * (5 - i)) for i in range(5)]
    results = await run_gateway_calls(calls, config=searxng(provider.url))
    assert [r.call_id for r in results] == ["c0", "c1", "c2", "c3", "c4"]
    assert [r.action["queries"][0] for r in results if r.action] == ["q0", "q1", "q2", "q3", "q4"]


async def test_a_timeout_becomes_a_failed_result_and_others_complete(provider: SearchProvider) -> None:
    provider.slow_delay_s = 2.0
    config = searxng(provider.url, tools__call_timeout_s=0.3)
    results = await run_gateway_calls(
        [search_call("c0", ["slow one"]), search_call("c1", ["fast one"])], config=config
    )
    # The round ended while the provider was still answering the slow call: it did not wait for it.
    assert provider.in_flight == 1
    assert [r.call_id for r in results] == ["c0", "c1"]
    assert results[0].status == "failed"
    assert results[0].error == "web_search call timed out after 0.3 s"
    assert orjson.loads(results[0].output) == {"error": "web_search call timed out after 0.3 s"}
    assert results[1].ok


async def test_empty_round() -> None:
    assert await run_gateway_calls([], config=load_config({})) == []
