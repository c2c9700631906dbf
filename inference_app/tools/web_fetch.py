"""The ``web_fetch`` gateway tool (Anthropic's ``web_fetch_20250910``): one ``http(s)`` URL as text.

Domains are filtered by the declaration and by the host policy (:mod:`inference_app.tools.hosts`),
at every redirect hop and on the connection's own DNS answers. Reads at most ``[web_fetch]
max_bytes``; HTML becomes text with ``trafilatura``, other text types are kept, the rest fails. The
model gets title, URL and text cut to ``max_content_tokens``; failures carry Anthropic's error code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

from gateway.core import outbound
from gateway.core.config import Config
from inference_app.tools.base import ToolCall, ToolResult
from inference_app.tools.hosts import HostRefused, check_public_host, host_listed, is_public_address
from inference_app.tools.web_search import DomainFilter, normalize_domain

USER_AGENT = "agentic-gateway-web-fetch/1"
BYTES_PER_TOKEN = 4
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = frozenset({"application/json", "application/xml", "application/javascript"})
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


class FetchError(Exception):
    """The fetch failed; ``code`` is Anthropic's ``web_fetch_tool_result_error`` code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Page:
    url: str
    media_type: str
    body: bytes
    charset: str | None


def _public_only(exempt: tuple[str, ...]) -> outbound.ConnectCheck:
    """The connection's own check (``outbound.Client(connect_check=…)``): the addresses it really
    uses must be public, unless the operator listed the host exactly."""

    def check(host: str, addresses: Sequence[str]) -> bool:
        return host_listed(host, exempt)[1] or all(is_public_address(a) for a in addresses)

    return check


def domain_filter(tool: Mapping[str, Any]) -> DomainFilter:
    """The declaration's ``allowed_domains`` / ``blocked_domains`` (Anthropic's top-level fields)."""
    allowed = tool.get("allowed_domains") or ()
    blocked = tool.get("blocked_domains") or ()
    return DomainFilter(
        allowed=tuple(normalize_domain(d) for d in allowed if isinstance(d, str)),
        blocked=tuple(normalize_domain(d) for d in blocked if isinstance(d, str)),
    )


async def _check_target(url: str, flt: DomainFilter, config: Config) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError("url_not_allowed", f"only http and https URLs can be fetched, not {url!r}")
    if not flt.admits(url):
        raise FetchError("url_not_allowed", f"{parts.hostname} is not allowed by the domain filters")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise FetchError("invalid_tool_input", f"{url!r} has an invalid port") from None
    try:
        await check_public_host(parts.hostname, port, config.web_fetch.allowed_hosts)
    except HostRefused as exc:
        code = "url_not_accessible" if exc.unresolvable else "url_not_allowed"
        raise FetchError(code, f"{exc}; the gateway does not fetch from its own network") from None


def _wanted(status: int) -> bool:
    return status not in _REDIRECTS and status < 400


async def _get(client: outbound.Client, url: str, max_bytes: int) -> tuple[int, str | None, Page]:
    """One GET, redirects not followed: (status, Location, page)."""
    try:
        fetched = await client.fetch("GET", url, max_bytes=max_bytes, read_body=_wanted)
    except outbound.OutboundTooLarge as exc:
        if exc.declared is not None:
            raise FetchError(
                "content_too_large", f"the page is {exc.declared} bytes; the limit is {max_bytes}"
            ) from None
        raise FetchError("content_too_large", f"the page is over the limit of {max_bytes} bytes") from None
    location = fetched.headers.get("Location")
    if not _wanted(fetched.status):
        return fetched.status, location, Page(url, "", b"", None)
    media_type = fetched.content_type or "application/octet-stream"  # as aiohttp reads a missing type
    return fetched.status, location, Page(url, media_type, fetched.body, fetched.charset)


async def fetch_page(url: str, flt: DomainFilter, config: Config) -> Page:
    """The page at ``url``, following redirects with every hop checked."""
    wf = config.web_fetch
    try:
        async with outbound.Client(
            timeout_s=config.tools.call_timeout_s,
            headers={"User-Agent": USER_AGENT},
            connect_check=_public_only(wf.allowed_hosts),
        ) as client:
            for _hop in range(wf.max_redirects + 1):
                await _check_target(url, flt, config)
                status, location, page = await _get(client, url, wf.max_bytes)
                if status in _REDIRECTS:
                    if not location:
                        raise FetchError("url_not_accessible", f"{url} answered {status} without a Location")
                    url = urljoin(url, location)
                    continue
                if status >= 400:
                    raise FetchError("url_not_accessible", f"{url} answered HTTP {status}")
                return page
            raise FetchError("url_not_accessible", f"more than {wf.max_redirects} redirects")
    except outbound.OutboundRefused as exc:
        raise FetchError(
            "url_not_allowed",
            f"host {exc.host!r} resolves to a loopback, private or link-local address; "
            "the gateway does not fetch from its own network",
        ) from None
    except outbound.OutboundUnreachable as exc:
        raise FetchError("url_not_accessible", f"{url} could not be fetched: {exc.reason}") from None
    except outbound.OutboundTimeout:
        raise FetchError(
            "url_not_accessible", f"{url} did not answer within {config.tools.call_timeout_s:g} s"
        ) from None


def _html_to_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML page, by trafilatura (CPU work: run in a thread)."""
    import trafilatura

    text = trafilatura.extract(html, output_format="txt", favor_recall=True) or ""
    meta = trafilatura.extract_metadata(html)
    return (meta.title or "" if meta is not None else ""), text


async def page_text(page: Page) -> tuple[str, str]:
    """(title, text) of a fetched page, or :class:`FetchError` for a type that is not text."""
    kind = page.media_type
    if kind == "application/pdf":
        raise FetchError(
            "unsupported_content_type", "PDF documents are not supported by this gateway's web fetch"
        )
    if (
        kind not in _HTML_TYPES
        and not kind.startswith("text/")
        and kind not in _TEXT_TYPES
        and not kind.endswith("+json")
    ):
        raise FetchError(
            "unsupported_content_type",
            f"content type {kind or 'unknown'!r} is not supported (text and HTML only)",
        )
    decoded = page.body.decode(page.charset or "utf-8", "replace")
    if kind in _HTML_TYPES:
        return await asyncio.to_thread(_html_to_text, decoded)
    return "", decoded


async def run_web_fetch(call: ToolCall, config: Config) -> ToolResult:
    started = time.monotonic()
    wf = config.web_fetch
    try:
        url = call.parsed_arguments().get("url")
    except ValueError as exc:
        return ToolResult.failure(call, str(exc), details={"error_code": "invalid_tool_input"})
    if not isinstance(url, str) or not url.strip():
        return ToolResult.failure(
            call, "web_fetch needs 'url': the URL to fetch", details={"error_code": "invalid_tool_input"}
        )
    url = url.strip()
    if len(url) > wf.max_url_chars:
        return ToolResult.failure(
            call,
            f"the URL is {len(url)} characters; the limit is {wf.max_url_chars}",
            details={"error_code": "url_too_long", "url": url},
        )
    limit = call.tool.get("max_content_tokens")
    max_tokens = (
        limit
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
        else wf.max_content_tokens
    )
    try:
        page = await fetch_page(url, domain_filter(call.tool), config)
        title, text = await page_text(page)
    except FetchError as exc:
        return ToolResult.failure(
            call,
            str(exc),
            duration_s=time.monotonic() - started,
            details={"error_code": exc.code, "url": url},
        )
    max_chars = max_tokens * BYTES_PER_TOKEN
    truncated = len(text) > max_chars
    if truncated:
        text = text[:max_chars]
    retrieved_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    header = f"Title: {title}\nURL: {page.url}\n\n" if title else f"URL: {page.url}\n\n"
    note = f"\n\n[truncated to about {max_tokens} tokens]" if truncated else ""
    return ToolResult(
        call_id=call.call_id,
        kind="web_fetch",
        status="completed",
        output=header + text + note,
        duration_s=time.monotonic() - started,
        details={"url": page.url, "title": title, "text": text, "retrieved_at": retrieved_at},
    )
