"""The response object's shape where OpenAI fills in defaults: echoed tool declarations and the
built-in tools' usage."""

from __future__ import annotations

from typing import Any

from inference_app.tools.base import WEB_SEARCH_TYPES
from inference_app.tools.file_search import DEFAULT_MAX_NUM_RESULTS

WEB_SEARCH_LOCATION = {"type": "approximate", "city": None, "country": "US", "region": None, "timezone": None}


def echoed_tool(tool: Any) -> Any:
    """A declared tool as OpenAI echoes it: function tools with ``output_schema`` (null unless
    given), web search with its defaults filled in."""
    if not isinstance(tool, dict):
        return tool
    kind = tool.get("type")
    if kind == "function":
        return {**tool, "output_schema": tool.get("output_schema")}
    if kind == "namespace" and isinstance(tool.get("tools"), list):
        return {**tool, "tools": [echoed_tool(member) for member in tool["tools"]]}
    if kind in WEB_SEARCH_TYPES:
        location = tool.get("user_location")
        out = {**tool, "search_context_size": tool.get("search_context_size") or "medium"}
        if location is None:
            out["user_location"] = dict(WEB_SEARCH_LOCATION)
        elif isinstance(location, dict):
            out["user_location"] = {
                **{k: None for k in WEB_SEARCH_LOCATION},
                **location,
                "type": "approximate",
            }
        return out
    if kind == "file_search":
        ranking = tool.get("ranking_options")
        return {
            **tool,
            "filters": tool.get("filters"),
            "max_num_results": tool.get("max_num_results") or DEFAULT_MAX_NUM_RESULTS,
            "ranking_options": {
                "hybrid_search": None,
                "ranker": "auto",
                "score_threshold": 0.0,
                **(ranking if isinstance(ranking, dict) else {}),
            },
        }
    return tool


def tool_usage(output: list[dict[str, Any]]) -> dict[str, Any]:
    """Usage of the built-in tools OpenAI reports on every response; a fresh literal each time (cheaper
    than ``copy.deepcopy`` of a template)."""
    searches = sum(1 for i in output if i.get("type") == "web_search_call" and i.get("status") == "completed")
    return {
        "image_gen": {
            "input_tokens": 0,
            "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"image_tokens": 0, "text_tokens": 0},
            "total_tokens": 0,
        },
        "web_search": {"num_requests": searches},
    }
