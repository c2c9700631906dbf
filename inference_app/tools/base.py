"""Gateway tools: classification, the function definitions the model sees, calls and results.

:func:`classify_tools` sorts a request's tools once; :meth:`ToolSet.model_functions` offers client
tools as declared plus one function per gateway tool; :func:`run_gateway_calls` runs a round. A
:class:`ToolResult` carries the model's text and the structured data of the public item; nothing
here knows the public item types or stream events.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.core.config import Config

# ``tool_search``: the Responses executor's own search of the request's deferred tools (it runs in
# the executor, never through :func:`run_gateway_calls`).
GatewayKind = Literal["web_search", "web_fetch", "code_interpreter", "mcp", "tool_search", "file_search"]
Owner = Literal["client", "gateway", "unknown"]

CLIENT_TOOL_TYPES = frozenset({"function", "custom", "namespace", "shell", "apply_patch", "local_shell"})
WEB_SEARCH_TYPES = frozenset(
    {"web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"}
)
GATEWAY_TOOL_TYPES = WEB_SEARCH_TYPES | {"code_interpreter", "mcp", "file_search"}

# Names the model sees for the built-in gateway tools.
WEB_SEARCH_FUNCTION = "web_search"
CODE_INTERPRETER_FUNCTION = "code_interpreter"
FILE_SEARCH_FUNCTION = "file_search"

_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class FunctionDef:
    """One gateway tool as the model sees it: a plain function tool."""

    name: str
    kind: GatewayKind
    description: str
    parameters: dict[str, Any]
    tool_index: int
    server_label: str | None = None
    mcp_tool_name: str | None = None
    # Discovery metadata of an MCP tool (its annotations decide ``read_only`` approval filters).
    read_only: bool | None = None

    def as_responses_tool(self) -> dict[str, Any]:
        """A Responses-API function tool (``/v1/responses`` upstream)."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": False,
        }

    def as_anthropic_tool(self) -> dict[str, Any]:
        """An Anthropic Messages custom tool (``/v1/messages`` upstream)."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}

    def as_chat_tool(self) -> dict[str, Any]:
        """A Chat Completions function tool (``/v1/chat/completions`` upstream)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class McpServer:
    """A resolved MCP server declaration: request-declared (``server_url``) or operator-configured."""

    label: str
    url: str
    tool_index: int
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    operator: bool = False
    # Request-scoped and operator credentials: used on the wire, never stored or returned.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    allowed_tools: tuple[str, ...] | None = None
    allowed_read_only: bool | None = None
    require_approval: Any = None
    description: str = ""

    def to_payload(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "url": self.url,
            "tool_index": self.tool_index,
            "transport": self.transport,
            "operator": self.operator,
            "headers": dict(self.headers),
        }

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> McpServer:
        return cls(
            label=data["label"],
            url=data["url"],
            tool_index=data["tool_index"],
            transport=data["transport"],
            operator=data["operator"],
            headers=dict(data["headers"]),
        )


@dataclass(frozen=True)
class ToolCall:
    """One model call of a gateway function, self-contained so a Celery worker can run it."""

    call_id: str
    name: str
    kind: GatewayKind
    arguments: str
    # The declaration the call needs: web_search filters, code_interpreter options, or the MCP
    # server (with its credentials; a ToolCall is never stored).
    tool: dict[str, Any] = field(default_factory=dict, repr=False)
    server_label: str | None = None
    mcp_tool_name: str | None = None
    # Whose stored objects the call may read (file_search: the principal's vector stores).
    owner: str = ""

    def to_payload(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(**data)

    def parsed_arguments(self) -> dict[str, Any]:
        """The model's arguments as an object; malformed JSON raises ``ValueError`` with a reason."""
        text = self.arguments.strip() or "{}"
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"arguments are not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object")
        return value


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one gateway call: ``output`` for the model, the other fields for the public item."""

    call_id: str
    kind: GatewayKind
    status: Literal["completed", "failed"]
    output: str
    error: str | None = None
    action: dict[str, Any] | None = None
    code: str | None = None
    outputs: list[dict[str, Any]] | None = None
    mcp_output: str | None = None
    server_label: str | None = None
    mcp_tool_name: str | None = None
    duration_s: float = 0.0
    # MCP only: "tool_execution" when the tool itself reported the error (``isError``); otherwise
    # the call failed on the way (connection, protocol, timeout, policy).
    error_type: str | None = None
    # What the Anthropic Messages result blocks show, and ``error_code`` on a failure.
    details: dict[str, Any] | None = None
    # file_search: the ``file_search_call`` item's ``queries`` and ``results`` ({file_id, filename,
    # score, attributes, text}).
    queries: list[str] | None = None
    results: list[dict[str, Any]] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def to_payload(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> ToolResult:
        return cls(**data)

    @classmethod
    def failure(cls, call: ToolCall, message: str, **extra: Any) -> ToolResult:
        """A failed call: the model receives ``{"error": message}`` as the tool output."""
        return cls(
            call_id=call.call_id,
            kind=call.kind,
            status="failed",
            output=error_output(message),
            error=message,
            server_label=call.server_label,
            mcp_tool_name=call.mcp_tool_name,
            **extra,
        )


def error_output(message: Any) -> str:
    """The tool output the model receives for a failed call: ``{"error": message}``."""
    return orjson.dumps({"error": message}).decode()


# --- the function definitions the model sees -------------------------------------------------


def web_search_function(tool: Mapping[str, Any], index: int, config: Config) -> FunctionDef:
    limit = config.web_search.max_queries_per_call
    return FunctionDef(
        name=WEB_SEARCH_FUNCTION,
        kind="web_search",
        description=(
            "Search the web. Give one or more short search queries (at most "
            f"{limit}); the results come back as titles, URLs and snippets to cite."
        ),
        parameters={
            "type": "object",
            "properties": {
                "queries": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": limit,
                    "description": "Search queries, run together.",
                }
            },
            "required": ["queries"],
        },
        tool_index=index,
    )


def single_query_web_search_function(name: str, index: int) -> FunctionDef:
    """Web search as Anthropic's server tool takes it: one ``query`` per call (Messages)."""
    return FunctionDef(
        name=name,
        kind="web_search",
        description=(
            "Search the web for current information. Give one short search query; the results come "
            "back as titles, URLs and snippets to cite."
        ),
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query."}},
            "required": ["query"],
        },
        tool_index=index,
    )


def web_fetch_function(name: str, index: int) -> FunctionDef:
    """Web fetch (Messages): the text of one http(s) page."""
    return FunctionDef(
        name=name,
        kind="web_fetch",
        description=(
            "Fetch the page at an http(s) URL and get its text (HTML is converted to text; PDF and "
            "binary types are not supported)."
        ),
        parameters={
            "type": "object",
            "properties": {"url": {"type": "string", "description": "The URL to fetch."}},
            "required": ["url"],
        },
        tool_index=index,
    )


def code_interpreter_function(tool: Mapping[str, Any], index: int, config: Config) -> FunctionDef:
    return FunctionDef(
        name=CODE_INTERPRETER_FUNCTION,
        kind="code_interpreter",
        description=(
            "Run Python 3 code in a fresh sandbox and get what it prints (stdout and stderr). "
            "No network access; the working directory is a private temporary directory; "
            f"limits: {config.code_interpreter.cpu_time_s} s CPU, "
            f"{config.code_interpreter.wall_time_s:g} s wall clock. Print the values you need."
        ),
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python program to run."}},
            "required": ["code"],
        },
        tool_index=index,
    )


def file_search_function(tool: Mapping[str, Any], index: int, config: Config) -> FunctionDef:
    return FunctionDef(
        name=FILE_SEARCH_FUNCTION,
        kind="file_search",
        description=(
            "Search the user's uploaded files. Give one or more short search queries; the results come "
            "back as passages with the file id and filename of each, to quote and cite."
        ),
        parameters={
            "type": "object",
            "properties": {
                "queries": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "description": "Search queries, run together.",
                }
            },
            "required": ["queries"],
        },
        tool_index=index,
    )


def mcp_function_name(label: str, tool_name: str) -> str:
    """``mcp__<label>__<tool>`` (never shadowing a built-in or client function), sanitized, and past 64
    characters kept distinct by a digest."""
    raw = f"mcp__{label}__{tool_name}"
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", raw)
    if safe == raw and len(raw) <= 64:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{safe[:55]}_{digest}"


# --- classification ------------------------------------------------------------------------------


@dataclass(frozen=True)
class McpListing:
    """One server's discovered tools (the public ``mcp_list_tools`` item), or its error."""

    server_label: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def item_fields(self) -> dict[str, Any]:
        """``server_label``, ``tools`` and ``error`` of the public ``mcp_list_tools`` item."""
        return {"server_label": self.server_label, "tools": self.tools, "error": self.error}

    @property
    def retained_bytes(self) -> int:
        """What this listing costs against ``[responses] max_retained_bytes``."""
        return len(orjson.dumps(self.item_fields()))


@dataclass(frozen=True)
class ToolSet:
    """A request's tools, classified once: ``client_tools`` go to the model as declared; ``functions``
    are the gateway functions it may call. ``ambiguous`` and ``unknown`` tools never run."""

    client_tools: tuple[dict[str, Any], ...] = ()
    client_names: frozenset[str] = frozenset()
    functions: Mapping[str, FunctionDef] = field(default_factory=dict)
    mcp_servers: tuple[McpServer, ...] = ()
    unknown: tuple[int, ...] = ()
    ambiguous: frozenset[str] = frozenset()
    declarations: tuple[dict[str, Any], ...] = ()
    caller: str = ""  # the request's owner: whose stores a file_search call reads

    def owner(self, name: str) -> Owner:
        """Who runs a call of ``name``: the client, the gateway, or nobody (unknown/ambiguous)."""
        if name in self.ambiguous:
            return "unknown"
        if name in self.functions:
            return "gateway"
        if name in self.client_names:
            return "client"
        return "unknown"

    def model_functions(self) -> list[FunctionDef]:
        """The gateway functions to offer the model (after MCP discovery, MCP tools included)."""
        return [f for name, f in self.functions.items() if name not in self.ambiguous]

    def server(self, label: str) -> McpServer:
        for server in self.mcp_servers:
            if server.label == label:
                return server
        raise KeyError(label)

    def make_call(self, call_id: str, name: str, arguments: str) -> ToolCall:
        """The :class:`ToolCall` for a model call of gateway function ``name``."""
        if self.owner(name) != "gateway":
            raise KeyError(f"{name} is not a gateway tool of this request")
        fn = self.functions[name]
        tool: dict[str, Any]
        if fn.kind == "mcp":
            assert fn.server_label is not None
            tool = self.server(fn.server_label).to_payload()
        else:
            tool = dict(self.declarations[fn.tool_index])
        return ToolCall(
            call_id=call_id,
            name=name,
            kind=fn.kind,
            arguments=arguments,
            tool=tool,
            server_label=fn.server_label,
            mcp_tool_name=fn.mcp_tool_name,
            owner=self.caller,
        )

    def with_mcp_tools(self, listings: Sequence[McpListing]) -> ToolSet:
        """A copy offering every discovered MCP tool as ``mcp__<label>__<tool>``."""
        functions = dict(self.functions)
        ambiguous = set(self.ambiguous)
        for listing in listings:
            server = self.server(listing.server_label)
            for tool in listing.tools:
                fn = FunctionDef(
                    name=mcp_function_name(listing.server_label, tool["name"]),
                    kind="mcp",
                    description=tool.get("description") or "",
                    parameters=tool.get("input_schema") or {"type": "object", "properties": {}},
                    tool_index=server.tool_index,
                    server_label=listing.server_label,
                    mcp_tool_name=tool["name"],
                    read_only=(tool.get("annotations") or {}).get("readOnlyHint"),
                )
                if fn.name in functions or fn.name in self.client_names:
                    ambiguous.add(fn.name)
                functions[fn.name] = fn
        return dataclasses.replace(self, functions=functions, ambiguous=frozenset(ambiguous))


def is_valid_label(label: str) -> bool:
    return bool(_LABEL.match(label))
