"""The ``mcp`` gateway tool, with the official ``mcp`` SDK (streamable HTTP and SSE transports).

Servers are named by ``server_url`` (hosts in ``[mcp] allowed_hosts``, checked before any
connection) or by an operator's ``server_label``. Discovery runs ``tools/list`` on every server at
once; more than ``[mcp] max_tools`` is a 400. Request ``headers``/``authorization`` go to the server
only and are stripped before a declaration is stored or echoed (:func:`strip_credentials`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson

from gateway.core.config import Config, McpServerConfig
from gateway.core.errors import BadRequest
from inference_app.tools.base import McpListing, McpServer, ToolCall, ToolResult, ToolSet, is_valid_label
from inference_app.tools.hosts import HostRefused, check_public_host, host_listed

CREDENTIAL_KEYS = ("headers", "authorization")
CLIENT_NAME = "agentic-gateway"


# --- declarations --------------------------------------------------------------------------------


def _allowed_tools(value: Any, param: str) -> tuple[tuple[str, ...] | None, bool | None]:
    """``allowed_tools``: a list of names or ``{"tool_names": [...], "read_only": bool}``."""
    if value is None:
        return None, None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value), None
    if isinstance(value, Mapping) and set(value) <= {"tool_names", "read_only"}:
        names = value.get("tool_names")
        read_only = value.get("read_only")
        if names is not None and not (isinstance(names, list) and all(isinstance(v, str) for v in names)):
            raise BadRequest(
                "allowed_tools.tool_names must be a list of strings.", param=param, code="invalid_type"
            )
        if read_only is not None and not isinstance(read_only, bool):
            raise BadRequest("allowed_tools.read_only must be a boolean.", param=param, code="invalid_type")
        return (tuple(names) if names is not None else None), read_only
    raise BadRequest(
        "allowed_tools must be a list of tool names or an object with tool_names / read_only.",
        param=param,
        code="invalid_type",
    )


def _check_filter(value: Any, param: str) -> None:
    if not isinstance(value, Mapping) or not set(value) <= {"tool_names", "read_only"}:
        raise BadRequest(
            "An approval filter is an object with tool_names and/or read_only.",
            param=param,
            code="invalid_type",
        )
    names = value.get("tool_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(v, str) for v in names)):
        raise BadRequest(
            "tool_names must be a list of strings.", param=param + ".tool_names", code="invalid_type"
        )
    if value.get("read_only") is not None and not isinstance(value.get("read_only"), bool):
        raise BadRequest("read_only must be a boolean.", param=param + ".read_only", code="invalid_type")


def validate_require_approval(value: Any, param: str) -> None:
    """``"always"``, ``"never"``, null, or ``{"always": filter, "never": filter}``."""
    if value is None or value in ("always", "never"):
        return
    if isinstance(value, Mapping) and value and set(value) <= {"always", "never"}:
        for key, flt in value.items():
            _check_filter(flt, f"{param}.{key}")
        return
    raise BadRequest(
        "require_approval must be 'always', 'never', or an object with 'always' / 'never' tool filters.",
        param=param,
        code="invalid_value",
    )


def resolve_mcp_declaration(tool: Mapping[str, Any], index: int, config: Config) -> McpServer:
    """The :class:`McpServer` for ``tools[index]``, or :class:`BadRequest` naming the field."""
    p = f"tools[{index}]"
    label = tool.get("server_label")
    if not isinstance(label, str) or not label:
        raise BadRequest(
            "Missing required parameter: 'server_label'.",
            param=f"{p}.server_label",
            code="missing_required_parameter",
        )
    if not is_valid_label(label):
        raise BadRequest(
            "server_label must be 1-64 letters, digits, '_' or '-'.",
            param=f"{p}.server_label",
            code="invalid_value",
        )
    for unsupported in ("connector_id", "tunnel_id"):
        if tool.get(unsupported) is not None:
            raise BadRequest(
                f"{unsupported} is not supported by this gateway: use server_url or a configured server_label.",
                param=f"{p}.{unsupported}",
                code="unsupported_parameter",
            )
    headers = tool.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise BadRequest("headers must be an object of strings.", param=f"{p}.headers", code="invalid_type")
    request_headers = dict(headers)
    authorization = tool.get("authorization")
    if authorization is not None:
        if not isinstance(authorization, str):
            raise BadRequest(
                "authorization must be a string.", param=f"{p}.authorization", code="invalid_type"
            )
        token = authorization.strip()
        request_headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    allowed, read_only = _allowed_tools(tool.get("allowed_tools"), f"{p}.allowed_tools")
    validate_require_approval(tool.get("require_approval"), f"{p}.require_approval")
    description = tool.get("server_description")
    description = description if isinstance(description, str) else ""

    url = tool.get("server_url")
    if url is not None:
        if not isinstance(url, str):
            raise BadRequest("server_url must be a string.", param=f"{p}.server_url", code="invalid_type")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadRequest(
                "server_url must be an http(s) URL.", param=f"{p}.server_url", code="invalid_value"
            )
        # OpenAI's convention: a URL ending in /sse is the SSE transport, anything else streamable HTTP.
        transport: Literal["streamable_http", "sse"] = (
            "sse" if parts.path.rstrip("/").endswith("/sse") else "streamable_http"
        )
        return McpServer(
            label=label,
            url=url,
            tool_index=index,
            transport=transport,
            headers=request_headers,
            allowed_tools=allowed,
            allowed_read_only=read_only,
            require_approval=tool.get("require_approval"),
            description=description,
        )

    configured: McpServerConfig | None = config.mcp_servers.get(label)
    if configured is None:
        raise BadRequest(
            f"Unknown MCP server_label {label!r}: give a server_url or use a server configured on the gateway.",
            param=f"{p}.server_label",
            code="invalid_value",
        )
    # The request may narrow the operator's allow-list, never widen it.
    if configured.allowed_tools is not None:
        allowed = tuple(t for t in configured.allowed_tools if allowed is None or t in allowed)
    # Operator credentials win over request headers of the same name.
    merged = {**request_headers, **configured.all_headers()}
    return McpServer(
        label=label,
        url=configured.url,
        tool_index=index,
        transport=configured.transport,
        operator=True,
        headers=merged,
        allowed_tools=allowed,
        allowed_read_only=read_only,
        require_approval=tool.get("require_approval"),
        description=description,
    )


def strip_credentials(tool_decl: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a tool declaration without request-scoped credentials (``headers``,
    ``authorization``), for anything stored or returned. Other tools come back unchanged."""
    decl = dict(tool_decl)
    if decl.get("type") == "mcp":
        for key in CREDENTIAL_KEYS:
            decl.pop(key, None)
    return decl


def strip_tools_credentials(tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [strip_credentials(t) for t in tools]


# --- approvals -----------------------------------------------------------------------------------


def _filter_matches(flt: Mapping[str, Any], tool_name: str, read_only: bool | None) -> bool:
    names = flt.get("tool_names")
    if names is not None and tool_name not in names:
        return False
    want = flt.get("read_only")
    if want is not None and bool(read_only) != want:
        return False
    return names is not None or want is not None


def requires_approval(require_approval: Any, tool_name: str, *, read_only: bool | None = None) -> bool:
    """Whether a call of ``tool_name`` needs an ``mcp_approval_request`` first: ``"never"`` no; unset or
    ``"always"`` yes (OpenAI's default); a filter: no only when the tool matches ``never`` alone."""
    if require_approval == "never":
        return False
    if require_approval is None or require_approval == "always":
        return True
    if isinstance(require_approval, Mapping):
        always = require_approval.get("always")
        never = require_approval.get("never")
        if isinstance(always, Mapping) and _filter_matches(always, tool_name, read_only):
            return True
        return not (isinstance(never, Mapping) and _filter_matches(never, tool_name, read_only))
    return True


def call_requires_approval(toolset: ToolSet, function_name: str) -> bool:
    """:func:`requires_approval` for a model call of an MCP function of ``toolset``."""
    fn = toolset.functions[function_name]
    if fn.kind != "mcp" or fn.server_label is None or fn.mcp_tool_name is None:
        return False
    server = toolset.server(fn.server_label)
    return requires_approval(server.require_approval, fn.mcp_tool_name, read_only=fn.read_only)


# --- host policy ---------------------------------------------------------------------------------


async def check_server_allowed(server: McpServer, config: Config) -> None:
    """Refuse (400) a request-declared server whose host is not allowed, before connecting; operator
    servers are trusted."""
    if server.operator:
        return
    param = f"tools[{server.tool_index}].server_url"
    parts = urlsplit(server.url)
    host = (parts.hostname or "").lower()
    allowed, _exact = host_listed(host, config.mcp.allowed_hosts)
    if not allowed:
        raise BadRequest(
            f"MCP server host {host!r} is not allowed: the gateway operator lists permitted hosts in "
            "[mcp] allowed_hosts (MCP_ALLOWED_HOSTS).",
            param=param,
            code="invalid_value",
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        await check_public_host(host, port, config.mcp.allowed_hosts)
    except HostRefused as exc:
        if exc.unresolvable:
            raise BadRequest(
                f"MCP server host {host!r} could not be resolved.", param=param, code="invalid_value"
            ) from None
        raise BadRequest(
            f"MCP server host {host!r} resolves to a loopback, private or link-local address; "
            "only hosts listed exactly in [mcp] allowed_hosts may do so.",
            param=param,
            code="invalid_value",
        ) from None


# --- connections ---------------------------------------------------------------------------------


@asynccontextmanager
async def open_session(server: McpServer, config: Config, *, read_timeout_s: float) -> AsyncIterator[Any]:
    """A connected ``mcp.Client`` for ``server`` over its transport."""
    import httpx2
    from mcp import Client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import Implementation

    async with AsyncExitStack() as stack:
        if server.transport == "sse":
            transport: Any = sse_client(
                server.url,
                headers=dict(server.headers),
                timeout=config.mcp.connect_timeout_s,
                sse_read_timeout=read_timeout_s,
            )
        else:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=dict(server.headers),
                    timeout=httpx2.Timeout(read_timeout_s, connect=config.mcp.connect_timeout_s),
                )
            )
            transport = streamable_http_client(server.url, http_client=http)
        client = await stack.enter_async_context(
            Client(
                transport,
                cache=None,
                read_timeout_seconds=read_timeout_s,
                client_info=Implementation(name=CLIENT_NAME, version="1"),
            )
        )
        yield client


def _describe_error(exc: BaseException) -> str:
    """One line for an exception, unwrapping anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


# --- discovery -----------------------------------------------------------------------------------


def _tool_entry(tool: Any) -> dict[str, Any]:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "annotations": annotations,
    }


def _admitted(server: McpServer, entry: Mapping[str, Any]) -> bool:
    if server.allowed_tools is not None and entry["name"] not in server.allowed_tools:
        return False
    if server.allowed_read_only is not None:
        read_only = bool((entry.get("annotations") or {}).get("readOnlyHint"))
        return read_only == server.allowed_read_only
    return True


async def list_server_tools(server: McpServer, config: Config) -> McpListing:
    """``tools/list`` on one server, every page, filtered by ``allowed_tools``; errors are data."""
    timeout = config.mcp.discovery_timeout_s

    async def walk() -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        async with open_session(server, config, read_timeout_s=timeout) as client:
            cursor: str | None = None
            for _ in range(config.mcp.max_list_pages):
                page = await client.list_tools(cursor=cursor)
                tools += [e for e in (_tool_entry(t) for t in page.tools) if _admitted(server, e)]
                cursor = page.next_cursor
                if not cursor:
                    return tools
                if len(tools) > config.mcp.max_tools:
                    return tools  # already over the request limit: no need for more pages
        raise RuntimeError(f"tools/list did not end within {config.mcp.max_list_pages} pages")

    try:
        async with asyncio.timeout(timeout):
            tools = await walk()
    except TimeoutError:
        return McpListing(server.label, error=f"tools/list timed out after {timeout:g} s")
    except Exception as exc:  # a server failure is reported in its mcp_list_tools item
        return McpListing(server.label, error=f"could not list tools: {_describe_error(exc)}")
    return McpListing(server.label, tools=tools)


async def discover_mcp_tools(
    toolset: ToolSet, *, config: Config, skip_labels: Iterable[str] = ()
) -> list[McpListing]:
    """Check every request-declared server, then list all at once; more than ``[mcp] max_tools`` is a
    400. ``skip_labels``: servers already listed in the history, listed again only when needed."""
    for server in toolset.mcp_servers:
        await check_server_allowed(server, config)
    skip = set(skip_labels)
    servers = [s for s in toolset.mcp_servers if s.label not in skip]
    listings = list(await asyncio.gather(*(list_server_tools(s, config) for s in servers)))
    total = sum(len(listing.tools) for listing in listings)
    if total > config.mcp.max_tools:
        raise BadRequest(
            f"Too many MCP tools: the declared servers offer {total}, at most {config.mcp.max_tools} "
            "are allowed per request. Narrow them with allowed_tools.",
            param="tools",
            code="array_above_max_length",
        )
    return listings


# --- calls ---------------------------------------------------------------------------------------


def _content_text(result: Any) -> str:
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        else:
            parts.append(
                orjson.dumps(block.model_dump(mode="json", by_alias=True, exclude_none=True)).decode()
            )
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content).decode())
    return "\n".join(parts)


async def call_mcp_tool(call: ToolCall, config: Config) -> ToolResult:
    """``tools/call`` of ``call.mcp_tool_name`` on the call's server; failures are results."""
    started = time.monotonic()
    server = McpServer.from_payload(call.tool)
    try:
        arguments = call.parsed_arguments()
    except ValueError as exc:
        return ToolResult.failure(call, str(exc))
    try:
        # Resolution may have changed since discovery (DNS rebinding): check again.
        await check_server_allowed(server, config)
    except BadRequest as exc:
        return ToolResult.failure(call, exc.message)
    assert call.mcp_tool_name is not None
    try:
        async with open_session(server, config, read_timeout_s=config.tools.call_timeout_s) as client:
            result = await client.call_tool(call.mcp_tool_name, arguments)
    except Exception as exc:
        return ToolResult.failure(call, f"MCP call failed: {_describe_error(exc)}")
    text = _content_text(result)
    duration = time.monotonic() - started
    if result.is_error:
        return ToolResult.failure(
            call, text or "the MCP tool reported an error", duration_s=duration, error_type="tool_execution"
        )
    return ToolResult(
        call_id=call.call_id,
        kind="mcp",
        status="completed",
        output=text,
        mcp_output=text,
        server_label=call.server_label,
        mcp_tool_name=call.mcp_tool_name,
        duration_s=duration,
    )


def listings_from_items(items: Sequence[Mapping[str, Any]]) -> list[McpListing]:
    """Rebuild listings from stored ``mcp_list_tools`` items (a continuation re-offers their tools)."""
    return [
        McpListing(str(i["server_label"]), list(i.get("tools") or []), i.get("error"))
        for i in items
        if i.get("type") == "mcp_list_tools"
    ]
