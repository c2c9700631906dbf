"""Real servers on loopback for the gateway-tool tests.

``SearchProvider``: an aiohttp server speaking the JSON APIs of SearXNG (``GET /search?format=json``),
Brave (``GET /res/v1/web/search`` with ``X-Subscription-Token``) and Tavily (``POST /search`` with
``api_key``), answering after ``delay_s`` with results derived from the query, or with the error a
test sets. ``mcp_app``: a real MCP server built with the ``mcp`` SDK (low-level ``Server``),
paginating ``tools/list``, served over streamable HTTP and SSE by uvicorn (``LiveServer``).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.servers import LiveServer, free_port, wait_port


@dataclass
class SearchRequest:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class SearchProvider:
    """A search API on 127.0.0.1 answering every query with ``results_per_query`` results."""

    delay_s: float = 0.0
    results_per_query: int = 3
    # (status, body) to answer every request with, e.g. (429, {...}) for a rate limit.
    error: tuple[int, Any] | None = None
    # Extra hosts mixed into the results, to exercise domain filters.
    hosts: tuple[str, ...] = ("example.com", "docs.python.org", "blocked.example.org")
    requests: list[SearchRequest] = field(default_factory=list)
    # Queries containing "slow" answer after this long (one slow call in a fast round).
    slow_delay_s: float = 5.0
    # Concurrency, counted here rather than timed: requests being answered now, and the most at once.
    in_flight: int = 0
    peak_in_flight: int = 0
    # Hold each request until this many are in flight (or ``hold_s`` passed): concurrent callers
    # then meet here however slowly they start, and serial ones cannot raise the peak.
    hold_until: int = 0
    hold_s: float = 5.0

    def __post_init__(self) -> None:
        self.port = free_port()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._released = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _results(self, query: str) -> list[dict[str, str]]:
        out = []
        for n in range(self.results_per_query):
            host = self.hosts[n % len(self.hosts)]
            slug = query.replace(" ", "-")
            out.append(
                {
                    "title": f"{query} result {n + 1}",
                    "url": f"https://{host}/{slug}/{n + 1}",
                    "snippet": f"About {query}: fact number {n + 1}.",
                }
            )
        return out

    async def _handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.in_flight >= self.hold_until:
                self._released = True  # the meeting happened: let everyone held go
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.hold_s
            while self.hold_until and not self._released and loop.time() < deadline:
                await asyncio.sleep(0.005)
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.Response:
        body: Any = None
        if request.method == "POST":
            body = orjson.loads(await request.read())
        self.requests.append(SearchRequest(request.path, dict(request.query), dict(request.headers), body))
        query = request.query.get("q", "") or (body or {}).get("query", "")
        if "slow" in query:
            await asyncio.sleep(self.slow_delay_s)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            status, payload = self.error
            text = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
            return web.Response(status=status, text=text, content_type="application/json")
        if request.path == "/search" and request.method == "GET":  # SearXNG
            if request.query.get("format") != "json":
                return web.Response(status=403, text="format not allowed")
            q = request.query["q"]
            results = [
                {"title": r["title"], "url": r["url"], "content": r["snippet"], "engine": "test"}
                for r in self._results(q)
            ]
            return web.json_response({"query": q, "number_of_results": len(results), "results": results})
        if request.path == "/res/v1/web/search":  # Brave
            if request.headers.get("X-Subscription-Token") != "brave-key":
                return web.json_response(
                    {
                        "type": "ErrorResponse",
                        "error": {
                            "code": "SUBSCRIPTION_TOKEN_INVALID",
                            "detail": "The provided subscription token is invalid.",
                            "status": 422,
                        },
                    },
                    status=422,
                )
            q = request.query["q"]
            results = [
                {"title": r["title"], "url": r["url"], "description": r["snippet"]} for r in self._results(q)
            ]
            return web.json_response({"type": "search", "web": {"type": "search", "results": results}})
        if request.path == "/search" and request.method == "POST":  # Tavily
            if body.get("api_key") != "tavily-key":
                return web.json_response(
                    {"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401
                )
            results = [
                {"title": r["title"], "url": r["url"], "content": r["snippet"], "score": 0.9}
                for r in self._results(body["query"])
            ]
            return web.json_response({"query": body["query"], "results": results})
        return web.Response(status=404)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self._runner.setup())
        self.loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self.loop.run_forever()

    def start(self) -> SearchProvider:
        self._thread.start()
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


# --- a web site (web fetch) ---------------------------------------------------------------------

ARTICLE_HTML = """<!doctype html><html><head><title>The Gateway Gazette</title></head><body>
<nav><a href="/">Home</a> <a href="/about">About</a></nav>
<article><h1>Tool loops</h1>
<p>The gateway runs web fetch for Claude Code. The secret number of this page is 7319.</p>
<p>Server tools run in hidden rounds; the client sees server_tool_use blocks.</p></article>
<footer>Copyright nobody</footer></body></html>"""


@dataclass
class WebSite:
    """A small site on 127.0.0.1 for web fetch: ``/article`` (HTML), ``/notes.txt``, ``/doc.pdf``,
    ``/image.png``, ``/big`` (``big_bytes`` of text), ``/missing`` (404), ``/slow`` (no answer for
    30 s) and ``/redirect?to=URL`` (302). ``paths`` records every request path."""

    big_bytes: int = 64 * 1024
    paths: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port = free_port()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path_qs)
        if request.path == "/article":
            return web.Response(text=ARTICLE_HTML, content_type="text/html")
        if request.path == "/notes.txt":
            return web.Response(text="plain notes: 42 is the answer", content_type="text/plain")
        if request.path == "/doc.pdf":
            return web.Response(body=b"%PDF-1.4 fake", content_type="application/pdf")
        if request.path == "/image.png":
            return web.Response(body=b"\x89PNG fake", content_type="image/png")
        if request.path == "/big":
            return web.Response(text="x" * self.big_bytes, content_type="text/plain")
        if request.path == "/redirect":
            raise web.HTTPFound(request.query["to"])
        if request.path == "/slow":
            await asyncio.sleep(30)
        return web.Response(status=404, text="not found")

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        self.loop.run_until_complete(self._runner.setup())
        self.loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self.loop.run_forever()

    def start(self) -> WebSite:
        self._thread.start()
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


# --- MCP ---------------------------------------------------------------------------------------


@dataclass
class McpRecord:
    """What the MCP test server saw: HTTP headers per request, tools/list cursors, calls."""

    headers: list[dict[str, str]] = field(default_factory=list)
    cursors: list[str | None] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def mcp_tools(count: int, *, read_only: set[str] | None = None) -> list[Any]:
    import mcp_types as types

    tools = []
    for n in range(count):
        name = f"tool_{n}"
        annotations = (
            types.ToolAnnotations(read_only_hint=name in (read_only or set())) if read_only else None
        )
        tools.append(
            types.Tool(
                name=name,
                description=f"Test tool number {n}.",
                input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
                annotations=annotations,
            )
        )
    return tools


def build_mcp_server(tools: list[Any], record: McpRecord, *, page_size: int = 2) -> Any:
    """A low-level ``mcp`` SDK server: paginated tools/list; tools echo, ``fail`` errors, ``slow`` sleeps."""
    import mcp_types as types
    from mcp.server import Server

    async def list_tools(ctx: Any, params: Any) -> Any:
        cursor = params.cursor if params else None
        record.cursors.append(cursor)
        start = int(cursor) if cursor else 0
        page = tools[start : start + page_size]
        nxt = str(start + page_size) if start + page_size < len(tools) else None
        return types.ListToolsResult(tools=page, next_cursor=nxt)

    async def call_tool(ctx: Any, params: Any) -> Any:
        args = dict(params.arguments or {})
        record.calls.append((params.name, args))
        if args.get("mode") == "fail":
            return types.CallToolResult(content=[types.TextContent(text="the tool broke")], is_error=True)
        if args.get("mode") == "slow":
            await asyncio.sleep(float(args.get("seconds", 5)))
        return types.CallToolResult(
            content=[types.TextContent(text=f"{params.name} got {args.get('text', '')}")]
        )

    return Server("gateway-test-mcp", on_list_tools=list_tools, on_call_tool=call_tool)


class _RecordHeaders:
    def __init__(self, app: Any, record: McpRecord) -> None:
        self.app = app
        self.record = record

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.record.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


def start_mcp_server(
    tool_count: int = 5,
    *,
    page_size: int = 2,
    transport: str = "streamable_http",
    read_only: set[str] | None = None,
    also_named: str | None = None,
) -> tuple[LiveServer, McpRecord, str]:
    """A live MCP server on loopback; returns (server, record, endpoint URL). ``also_named``: a
    host name its DNS-rebinding protection accepts besides loopback (streamable HTTP)."""
    record = McpRecord()
    server = build_mcp_server(mcp_tools(tool_count, read_only=read_only), record, page_size=page_size)
    if transport == "sse":
        from mcp.server.sse import SseServerTransport
        from starlette.applications import Starlette
        from starlette.routing import Mount, Route

        sse = SseServerTransport("/messages/")

        async def handle_sse(request: Any) -> Any:
            from starlette.responses import Response

            async with sse.connect_sse(request.scope, request.receive, request._send) as streams:
                await server.run(streams[0], streams[1], server.create_initialization_options())
            return Response()

        app = Starlette(
            routes=[Route("/sse", endpoint=handle_sse), Mount("/messages/", app=sse.handle_post_message)]
        )
        live = LiveServer(_RecordHeaders(app, record)).start()
        return live, record, f"{live.url}/sse"
    security = None
    if also_named is not None:
        from mcp.server.transport_security import TransportSecuritySettings

        names = ("127.0.0.1", "localhost", also_named)
        security = TransportSecuritySettings(allowed_hosts=[f"{name}:*" for name in names])
    app = server.streamable_http_app(transport_security=security)
    live = LiveServer(_RecordHeaders(app, record), lifespan="on").start()
    return live, record, f"{live.url}/mcp"
