"""The ``web_search`` gateway tool: SearXNG, Brave or Tavily (``[web_search] provider``).

Up to ``max_queries_per_call`` queries at once, filtered by domain, returned as text with sources.
A provider error, a 429 included, fails the call with its own message: no hidden retry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from gateway.core import outbound
from gateway.core.config import Config
from inference_app.tools.base import ToolCall, ToolResult

USER_AGENT = "agentic-gateway-web-search/1"
# A provider answer larger than this is refused rather than read (a page of results is ~100 KiB).
MAX_PROVIDER_RESPONSE_BYTES = 8 * 1024 * 1024


class SearchError(Exception):
    """A provider answered with an error, or could not be reached; the message names it."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


def normalize_domain(domain: str) -> str:
    """``https://www.Example.com/x`` -> ``example.com`` (filters name hosts, not URLs)."""
    d = domain.strip().lower()
    if "://" in d:
        d = urlsplit(d).hostname or ""
    d = d.split("/", 1)[0].split(":", 1)[0].strip(".")
    return d.removeprefix("www.")


def host_matches(host: str, domains: Iterable[str]) -> bool:
    """A host matches a domain when it is the domain or one of its subdomains."""
    host = host.lower().strip(".")
    bare = host.removeprefix("www.")
    return any(bare == d or host == d or host.endswith("." + d) for d in domains if d)


@dataclass(frozen=True)
class DomainFilter:
    allowed: tuple[str, ...] = ()  # request allow-list (empty: any)
    operator_allowed: tuple[str, ...] = ()  # operator allow-list (empty: any)
    blocked: tuple[str, ...] = ()

    @classmethod
    def build(cls, tool: Mapping[str, Any], config: Config) -> DomainFilter:
        filters = tool.get("filters") or {}
        allowed = filters.get("allowed_domains") or () if isinstance(filters, Mapping) else ()
        blocked = filters.get("blocked_domains") or () if isinstance(filters, Mapping) else ()
        return cls(
            allowed=tuple(normalize_domain(d) for d in allowed if isinstance(d, str)),
            operator_allowed=tuple(normalize_domain(d) for d in config.web_search.allowed_domains),
            blocked=tuple(
                normalize_domain(d)
                for d in (*config.web_search.blocked_domains, *blocked)
                if isinstance(d, str)
            ),
        )

    def admits(self, url: str) -> bool:
        host = urlsplit(url).hostname or ""
        if not host or urlsplit(url).scheme not in ("http", "https"):
            return False
        if self.blocked and host_matches(host, self.blocked):
            return False
        if self.allowed and not host_matches(host, self.allowed):
            return False
        return not (self.operator_allowed and not host_matches(host, self.operator_allowed))


def _provider_message(status: int, body: bytes) -> str:
    """The provider's own error text from its JSON (Brave, Tavily, SearXNG) or plain body."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    candidates: list[Any] = []
    if isinstance(data, Mapping):
        err = data.get("error")
        detail = data.get("detail")
        if isinstance(err, Mapping):
            candidates += [err.get("detail"), err.get("message"), err.get("code")]
        candidates.append(err)
        if isinstance(detail, Mapping):
            candidates += [detail.get("error"), detail.get("message")]
        candidates += [detail, data.get("message")]
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()[:500]
    return (text or "no message")[:500]


async def _fetch(client: outbound.Client, method: str, url: str, provider: str, **kwargs: Any) -> Any:
    try:
        resp = await client.fetch(method, url, max_bytes=MAX_PROVIDER_RESPONSE_BYTES, **kwargs)
    except outbound.OutboundTimeout:
        raise SearchError(f"{provider} did not answer in time") from None
    except outbound.OutboundError as exc:
        raise SearchError(f"{provider} could not be reached: {exc}") from None
    if resp.status != 200:
        message = _provider_message(resp.status, resp.body)
        raise SearchError(f"{provider} answered {resp.status}: {message}", status=resp.status)
    try:
        return orjson.loads(resp.body)
    except orjson.JSONDecodeError:
        raise SearchError(f"{provider} answered with invalid JSON") from None


def user_location(tool: Mapping[str, Any]) -> dict[str, str]:
    """The declaration's ``user_location`` (Responses and Anthropic share its shape: ``country`` as
    ISO 3166-1 alpha-2, ``region``, ``city``, ``timezone``), as the fields that are strings."""
    raw = tool.get("user_location")
    if not isinstance(raw, Mapping):
        return {}
    return {k: v.strip() for k, v in raw.items() if k != "type" and isinstance(v, str) and v.strip()}


async def _search_one(
    client: outbound.Client,
    query: str,
    config: Config,
    api_key: str,
    flt: DomainFilter,
    location: Mapping[str, str],
) -> list[SearchHit]:
    ws = config.web_search
    provider = ws.provider
    endpoint = ws.endpoint
    hits: list[SearchHit] = []
    # The location goes where the provider takes one: Brave's ``country``. SearXNG has no location
    # parameter and Tavily's ``country`` wants a full country name, so theirs is not sent.
    if provider == "searxng":
        data = await _fetch(client, "GET", endpoint, "searxng", params={"q": query, "format": "json"})
        for r in data.get("results") or []:
            hits.append(
                SearchHit(str(r.get("title") or ""), str(r.get("url") or ""), str(r.get("content") or ""))
            )
    elif provider == "brave":
        data = await _fetch(
            client,
            "GET",
            endpoint,
            "brave",
            params={
                "q": query,
                "count": str(min(20, ws.max_results * 2)),
                **({"country": location["country"].upper()} if "country" in location else {}),
            },
            headers={"X-Subscription-Token": api_key, "Accept": "application/json"},
        )
        for r in (data.get("web") or {}).get("results") or []:
            hits.append(
                SearchHit(str(r.get("title") or ""), str(r.get("url") or ""), str(r.get("description") or ""))
            )
    else:  # tavily
        payload: dict[str, Any] = {"api_key": api_key, "query": query, "max_results": ws.max_results}
        allowed = tuple(d for d in (*flt.allowed, *flt.operator_allowed) if d)
        if allowed:
            payload["include_domains"] = list(allowed)
        if flt.blocked:
            payload["exclude_domains"] = list(flt.blocked)
        data = await _fetch(
            client,
            "POST",
            endpoint,
            "tavily",
            data=orjson.dumps(payload),
            headers={"Content-Type": "application/json"},
        )
        for r in data.get("results") or []:
            hits.append(
                SearchHit(str(r.get("title") or ""), str(r.get("url") or ""), str(r.get("content") or ""))
            )
    kept = [h for h in hits if flt.admits(h.url)]
    return kept[: ws.max_results]


def parse_queries(call: ToolCall, limit: int) -> list[str]:
    """The queries of a call: ``queries`` (a list) or ``query`` (one string)."""
    args = call.parsed_arguments()
    raw = args.get("queries")
    if raw is None and "query" in args:
        raw = [args["query"]]
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(q, str) for q in raw):
        raise ValueError("web_search needs 'queries': a list of search strings")
    queries = [q.strip() for q in raw if q.strip()]
    if not queries:
        raise ValueError("web_search needs at least one non-empty query")
    if len(queries) > limit:
        raise ValueError(f"web_search takes at most {limit} queries per call, got {len(queries)}")
    return queries


def format_results(queries: Sequence[str], results: Sequence[Sequence[SearchHit]], snippet_chars: int) -> str:
    parts: list[str] = []
    for query, hits in zip(queries, results, strict=True):
        if not hits:
            parts.append(f'No results for "{query}".')
            continue
        lines = [f'Search results for "{query}":']
        for n, hit in enumerate(hits, 1):
            snippet = " ".join(hit.snippet.split())
            if len(snippet) > snippet_chars:
                snippet = snippet[:snippet_chars].rstrip() + "…"
            lines.append(f"[{n}] {hit.title or hit.url}\n    URL: {hit.url}")
            if snippet:
                lines.append(f"    {snippet}")
        parts.append("\n".join(lines))
    parts.append("Cite the URLs of the results you use.")
    return "\n\n".join(parts)


async def run_web_search(call: ToolCall, config: Config) -> ToolResult:
    started = time.monotonic()
    ws = config.web_search
    try:
        queries = parse_queries(call, ws.max_queries_per_call)
    except ValueError as exc:
        return ToolResult.failure(call, str(exc), details={"error_code": "invalid_tool_input"})
    action: dict[str, Any] = {"type": "search", "query": queries[0], "queries": queries}
    if not ws.endpoint:
        return ToolResult.failure(
            call,
            "web search is not configured: set [web_search] base_url (WEB_SEARCH_BASE_URL)",
            action=action,
            details={"error_code": "unavailable"},
        )
    api_key = config.web_search_api_key.get_secret_value()
    if ws.provider in ("brave", "tavily") and not api_key:
        return ToolResult.failure(
            call,
            f"web search provider {ws.provider} has no API key: set {ws.key_env}",
            action=action,
            details={"error_code": "unavailable"},
        )
    flt = DomainFilter.build(call.tool, config)
    location = user_location(call.tool)
    try:
        async with outbound.Client(
            timeout_s=ws.request_timeout_s, headers={"User-Agent": USER_AGENT}
        ) as client:
            results = await asyncio.gather(
                *(_search_one(client, q, config, api_key, flt, location) for q in queries)
            )
    except SearchError as exc:
        code = "too_many_requests" if exc.status == 429 else "unavailable"
        return ToolResult.failure(
            call,
            str(exc),
            action=action,
            duration_s=time.monotonic() - started,
            details={"error_code": code},
        )
    sources: list[dict[str, str]] = []
    found: list[dict[str, str]] = []
    seen: set[str] = set()
    for hits in results:
        for hit in hits:
            if hit.url not in seen:
                seen.add(hit.url)
                sources.append({"type": "url", "url": hit.url})
                found.append({"title": hit.title, "url": hit.url, "snippet": hit.snippet})
    action["sources"] = sources
    return ToolResult(
        call_id=call.call_id,
        kind="web_search",
        status="completed",
        output=format_results(queries, results, ws.max_snippet_chars),
        action=action,
        duration_s=time.monotonic() - started,
        details={"results": found},
    )
