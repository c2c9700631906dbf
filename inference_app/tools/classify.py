"""Sorting a request's ``tools`` into client tools and the gateway's own: :func:`classify_tools`.
Its own module so that ``base`` imports none of the tools that use it (no import cycle)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.core.config import Config, get_config
from gateway.core.errors import BadRequest
from inference_app.tools.base import (
    CLIENT_TOOL_TYPES,
    WEB_SEARCH_TYPES,
    FunctionDef,
    McpServer,
    ToolSet,
    code_interpreter_function,
    file_search_function,
    web_search_function,
)
from inference_app.tools.mcp import resolve_mcp_declaration


def _tool_type(tool: Any) -> str | None:
    if isinstance(tool, Mapping) and isinstance(tool.get("type"), str):
        return str(tool["type"])
    return None


def _client_names(tool: Mapping[str, Any]) -> list[str]:
    kind = tool["type"]
    if kind in ("function", "custom"):
        name = tool.get("name")
        return [name] if isinstance(name, str) else []
    if kind == "namespace":
        members = tool.get("tools")
        names: list[str] = []
        if isinstance(members, list):
            for member in members:
                if isinstance(member, Mapping) and isinstance(member.get("name"), str):
                    names.append(member["name"])
        return names
    if kind in ("shell", "apply_patch", "local_shell"):
        return [kind]  # the function the model sees (responses_app.engine.translate.FIXED_FUNCTIONS)
    return []


def classify_tools(tools: Sequence[Any] | None, *, config: Config | None = None, owner: str = "") -> ToolSet:
    """Classify the request's ``tools`` into client and gateway tools, validating MCP declarations (a 400
    naming ``tools[<i>]…``); network checks come later, before any connection."""
    config = config or get_config()
    tools = list(tools or [])
    client_tools: list[dict[str, Any]] = []
    client_names: list[str] = []
    functions: dict[str, FunctionDef] = {}
    ambiguous: set[str] = set()
    unknown: list[int] = []
    servers: list[McpServer] = []
    declarations: list[dict[str, Any]] = []

    mcp_count = sum(1 for t in tools if _tool_type(t) == "mcp")
    if mcp_count > config.mcp.max_servers:
        raise BadRequest(
            f"Too many MCP servers: {mcp_count} declared, at most {config.mcp.max_servers} are allowed.",
            param="tools",
            code="array_above_max_length",
        )

    def claim(fn: FunctionDef) -> None:
        if fn.name in functions:
            ambiguous.add(fn.name)
        functions[fn.name] = fn

    for index, tool in enumerate(tools):
        kind = _tool_type(tool)
        declarations.append(dict(tool) if isinstance(tool, Mapping) else {})
        if kind in CLIENT_TOOL_TYPES:
            client_tools.append(dict(tool))
            client_names.extend(_client_names(tool))
        elif kind in WEB_SEARCH_TYPES:
            claim(web_search_function(tool, index, config))
        elif kind == "code_interpreter":
            claim(code_interpreter_function(tool, index, config))
        elif kind == "file_search":
            claim(file_search_function(tool, index, config))
        elif kind == "mcp":
            server = resolve_mcp_declaration(tool, index, config)
            if any(s.label == server.label for s in servers):
                raise BadRequest(
                    f"Duplicate MCP server_label {server.label!r}: each MCP server needs its own label.",
                    param=f"tools[{index}].server_label",
                    code="invalid_value",
                )
            servers.append(server)
        else:
            unknown.append(index)

    names = set(client_names)
    duplicates = {n for n in client_names if client_names.count(n) > 1}
    ambiguous |= duplicates | (names & set(functions))
    return ToolSet(
        client_tools=tuple(client_tools),
        client_names=frozenset(names),
        functions=functions,
        mcp_servers=tuple(servers),
        unknown=tuple(unknown),
        ambiguous=frozenset(ambiguous),
        declarations=tuple(declarations),
        caller=owner,
    )
