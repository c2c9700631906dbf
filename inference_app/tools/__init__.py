"""Gateway-executed tools (web search, web fetch, code interpreter, file search, MCP), re-exported for the
Responses executor and the Messages server-tool loop (``docs/tools.md``)."""

from inference_app.tools.base import (
    CLIENT_TOOL_TYPES,
    GATEWAY_TOOL_TYPES,
    FunctionDef,
    McpServer,
    ToolCall,
    ToolResult,
    ToolSet,
    single_query_web_search_function,
    web_fetch_function,
)
from inference_app.tools.classify import classify_tools
from inference_app.tools.dispatch import run_gateway_calls
from inference_app.tools.limits import ToolCallBudget, limit_output, validate_max_tool_calls
from inference_app.tools.mcp import (
    McpListing,
    call_requires_approval,
    discover_mcp_tools,
    listings_from_items,
    requires_approval,
    strip_credentials,
    strip_tools_credentials,
)

__all__ = [
    "CLIENT_TOOL_TYPES",
    "GATEWAY_TOOL_TYPES",
    "FunctionDef",
    "McpListing",
    "McpServer",
    "ToolCall",
    "ToolCallBudget",
    "ToolResult",
    "ToolSet",
    "call_requires_approval",
    "classify_tools",
    "discover_mcp_tools",
    "limit_output",
    "listings_from_items",
    "requires_approval",
    "run_gateway_calls",
    "single_query_web_search_function",
    "strip_credentials",
    "strip_tools_credentials",
    "validate_max_tool_calls",
    "web_fetch_function",
]
