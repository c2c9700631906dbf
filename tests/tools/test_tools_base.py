"""Classification of a request's tools, the functions the model sees, max_tool_calls, approvals,
credential stripping: the pure parts of the gateway-tool library."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.config import McpServerConfig, load_config, replace
from gateway.core.errors import BadRequest
from inference_app.tools import (
    ToolCallBudget,
    ToolResult,
    classify_tools,
    limit_output,
    requires_approval,
    strip_credentials,
    strip_tools_credentials,
    validate_max_tool_calls,
)
from inference_app.tools.base import ToolCall, mcp_function_name
from inference_app.tools.mcp import McpListing, call_requires_approval

CONFIG = load_config({})


def fn(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}


def mcp(label: str, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "server_url": f"https://{label}.example.com/mcp", **extra}


# --- classification -------------------------------------------------------------------------------


def test_client_and_gateway_tools_are_told_apart() -> None:
    tools = [
        fn("get_weather"),
        {"type": "custom", "name": "apply_diff"},
        {"type": "namespace", "name": "crm", "description": "CRM", "tools": [fn("find_customer")]},
        {"type": "shell"},
        {"type": "web_search"},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        mcp("docs"),
    ]
    ts = classify_tools(tools, config=CONFIG)
    assert [t["type"] for t in ts.client_tools] == ["function", "custom", "namespace", "shell"]
    assert ts.client_names == {"get_weather", "apply_diff", "find_customer", "shell"}
    assert set(ts.functions) == {"web_search", "code_interpreter"}
    assert [s.label for s in ts.mcp_servers] == ["docs"]
    for name in ("get_weather", "apply_diff", "find_customer", "shell"):
        assert ts.owner(name) == "client"
    assert ts.owner("web_search") == "gateway"
    assert ts.owner("code_interpreter") == "gateway"
    assert ts.owner("nope") == "unknown"
    assert ts.unknown == ()


@pytest.mark.parametrize(
    "kind", ["web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"]
)
def test_every_web_search_variant_is_gateway_owned(kind: str) -> None:
    ts = classify_tools([{"type": kind}], config=CONFIG)
    assert ts.owner("web_search") == "gateway"
    assert ts.functions["web_search"].kind == "web_search"


def test_unknown_tools_are_never_executed() -> None:
    ts = classify_tools(
        [
            {"type": "computer_use_preview"},
            {"type": "image_generation"},
            {"name": "x"},
            "bogus",
        ],
        config=CONFIG,
    )
    assert ts.unknown == (0, 1, 2, 3)
    assert ts.client_tools == () and dict(ts.functions) == {}
    assert ts.owner("computer_use_preview") == "unknown"
    with pytest.raises(KeyError):
        ts.make_call("call_1", "computer_use_preview", "{}")


def test_a_name_claimed_twice_is_ambiguous_and_never_executed() -> None:
    # A client function named like a gateway tool: nobody knows which one the model means.
    ts = classify_tools([fn("web_search"), {"type": "web_search"}, fn("dup"), fn("dup")], config=CONFIG)
    assert ts.ambiguous == {"web_search", "dup"}
    assert ts.owner("web_search") == "unknown"
    assert ts.owner("dup") == "unknown"
    assert ts.model_functions() == []
    with pytest.raises(KeyError):
        ts.make_call("call_1", "web_search", '{"queries": ["x"]}')


def test_gateway_tools_reach_the_model_as_plain_functions() -> None:
    ts = classify_tools([{"type": "web_search"}, {"type": "code_interpreter"}], config=CONFIG)
    by_name = {f.name: f for f in ts.model_functions()}
    ws = by_name["web_search"].as_responses_tool()
    assert ws["type"] == "function" and ws["name"] == "web_search"
    assert ws["parameters"]["required"] == ["queries"]
    assert ws["parameters"]["properties"]["queries"]["maxItems"] == 5
    ci = by_name["code_interpreter"].as_chat_tool()
    assert ci["type"] == "function"
    assert ci["function"]["name"] == "code_interpreter"
    assert ci["function"]["parameters"]["required"] == ["code"]


def test_make_call_carries_the_declaration_and_serializes() -> None:
    decl = {"type": "web_search", "filters": {"allowed_domains": ["python.org"]}}
    ts = classify_tools([fn("f"), decl], config=CONFIG)
    call = ts.make_call("call_9", "web_search", '{"queries": ["asyncio"]}')
    assert call.kind == "web_search" and call.tool == decl
    again = ToolCall.from_payload(orjson.loads(orjson.dumps(call.to_payload())))
    assert again == call


def test_mcp_tools_join_after_discovery_with_prefixed_names() -> None:
    ts = classify_tools([mcp("docs", require_approval="never"), fn("mcp__docs__clash")], config=CONFIG)
    listing = McpListing(
        "docs",
        tools=[
            {
                "name": "search",
                "description": "Search docs",
                "input_schema": {"type": "object"},
                "annotations": None,
            },
            {"name": "clash", "description": "", "input_schema": {"type": "object"}, "annotations": None},
        ],
    )
    ts2 = ts.with_mcp_tools([listing])
    assert ts2.owner("mcp__docs__search") == "gateway"
    assert ts2.owner("mcp__docs__clash") == "unknown"  # the client declared that name too
    call = ts2.make_call("c1", "mcp__docs__search", '{"q": "x"}')
    assert (call.kind, call.server_label, call.mcp_tool_name) == ("mcp", "docs", "search")
    assert call.tool["url"] == "https://docs.example.com/mcp"
    assert [f.name for f in ts2.model_functions()] == ["mcp__docs__search"]


def test_mcp_function_names_stay_valid_and_distinct() -> None:
    assert mcp_function_name("docs", "search") == "mcp__docs__search"
    odd = mcp_function_name("docs", "files.read")
    assert odd.startswith("mcp__docs__files_read_") and len(odd) <= 64
    assert odd != mcp_function_name("docs", "files_read")
    long = mcp_function_name("l" * 64, "t" * 64)
    assert len(long) == 64
    assert long != mcp_function_name("l" * 64, "t" * 63)


# --- MCP declarations ------------------------------------------------------------------------------


def test_at_most_64_mcp_servers() -> None:
    classify_tools([mcp(f"s{i}") for i in range(64)], config=CONFIG)
    with pytest.raises(BadRequest) as info:
        classify_tools([mcp(f"s{i}") for i in range(65)], config=CONFIG)
    err = info.value
    assert (err.status, err.param, err.code) == (400, "tools", "array_above_max_length")
    assert err.message == "Too many MCP servers: 65 declared, at most 64 are allowed."


@pytest.mark.parametrize(
    "decl, param, code",
    [
        (
            {"type": "mcp", "server_url": "https://a.example.com"},
            "tools[0].server_label",
            "missing_required_parameter",
        ),
        (
            {"type": "mcp", "server_label": "bad label", "server_url": "https://a.example.com"},
            "tools[0].server_label",
            "invalid_value",
        ),
        (
            {"type": "mcp", "server_label": "a", "server_url": "ftp://a.example.com"},
            "tools[0].server_url",
            "invalid_value",
        ),
        ({"type": "mcp", "server_label": "nolabel"}, "tools[0].server_label", "invalid_value"),
        (
            {"type": "mcp", "server_label": "a", "connector_id": "connector_gmail"},
            "tools[0].connector_id",
            "unsupported_parameter",
        ),
        (
            {"type": "mcp", "server_label": "a", "server_url": "https://a.example.com", "headers": {"X": 1}},
            "tools[0].headers",
            "invalid_type",
        ),
        (
            {
                "type": "mcp",
                "server_label": "a",
                "server_url": "https://a.example.com",
                "require_approval": "sometimes",
            },
            "tools[0].require_approval",
            "invalid_value",
        ),
        (
            {
                "type": "mcp",
                "server_label": "a",
                "server_url": "https://a.example.com",
                "require_approval": {"always": {"tool_names": "x"}},
            },
            "tools[0].require_approval.always.tool_names",
            "invalid_type",
        ),
        (
            {"type": "mcp", "server_label": "a", "server_url": "https://a.example.com", "allowed_tools": "x"},
            "tools[0].allowed_tools",
            "invalid_type",
        ),
    ],
)
def test_bad_mcp_declarations_are_400(decl: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(BadRequest) as info:
        classify_tools([decl], config=CONFIG)
    assert (info.value.param, info.value.code) == (param, code)


def test_duplicate_server_labels_are_400() -> None:
    with pytest.raises(BadRequest) as info:
        classify_tools([mcp("a"), fn("x"), mcp("a")], config=CONFIG)
    assert info.value.param == "tools[2].server_label"


def test_operator_server_by_label_merges_credentials_and_narrows_tools() -> None:
    config = replace(
        CONFIG,
        mcp_servers={
            "corp": McpServerConfig(
                url="http://10.0.0.5:9000/mcp",
                headers={"X-Team": "a"},
                secret_headers={"Authorization": "Bearer op-s3cret"},
                allowed_tools=("search", "fetch", "write"),
            )
        },
    )
    ts = classify_tools(
        [
            {
                "type": "mcp",
                "server_label": "corp",
                "allowed_tools": ["fetch", "delete"],
                "headers": {"Authorization": "Bearer user", "X-Trace": "1"},
            }
        ],
        config=config,
    )
    server = ts.server("corp")
    assert server.operator and server.url == "http://10.0.0.5:9000/mcp"
    assert server.allowed_tools == ("fetch",)  # the request narrows, never widens
    assert server.headers == {"Authorization": "Bearer op-s3cret", "X-Team": "a", "X-Trace": "1"}
    assert "s3cret" not in repr(server)  # credentials stay out of reprs (and logs)


def test_authorization_becomes_a_bearer_header() -> None:
    ts = classify_tools([mcp("a", authorization="tok123")], config=CONFIG)
    assert ts.server("a").headers == {"Authorization": "Bearer tok123"}


# --- credentials -----------------------------------------------------------------------------------


def test_strip_credentials_removes_request_scoped_secrets() -> None:
    decl = mcp(
        "docs", headers={"Authorization": "Bearer s3cret"}, authorization="tok", require_approval="never"
    )
    stripped = strip_credentials(decl)
    assert stripped == {
        "type": "mcp",
        "server_label": "docs",
        "server_url": "https://docs.example.com/mcp",
        "require_approval": "never",
    }
    assert "s3cret" not in orjson.dumps(stripped).decode() and "tok" not in orjson.dumps(stripped).decode()
    assert decl["headers"] == {"Authorization": "Bearer s3cret"}  # the original is untouched
    other = {"type": "function", "name": "f", "headers": "a parameter, not a credential"}
    assert strip_credentials(other) == other
    assert strip_tools_credentials([decl, other]) == [stripped, other]


# --- approvals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, tool, read_only, expected",
    [
        ("never", "search", None, False),
        ("always", "search", None, True),
        (None, "search", None, True),  # OpenAI's default: ask
        ({"never": {"tool_names": ["search"]}}, "search", None, False),
        ({"never": {"tool_names": ["search"]}}, "delete", None, True),
        ({"always": {"tool_names": ["delete"]}}, "delete", None, True),
        ({"always": {"tool_names": ["delete"]}}, "search", None, True),
        ({"always": {"tool_names": ["delete"]}, "never": {"tool_names": ["search"]}}, "search", None, False),
        ({"always": {"tool_names": ["delete"]}, "never": {"tool_names": ["search"]}}, "delete", None, True),
        ({"always": {"tool_names": ["x"]}, "never": {"tool_names": ["x"]}}, "x", None, True),
        ({"never": {"read_only": True}}, "search", True, False),
        ({"never": {"read_only": True}}, "write", False, True),
        ({"never": {"read_only": True}}, "write", None, True),
    ],
)
def test_require_approval(policy: Any, tool: str, read_only: bool | None, expected: bool) -> None:
    assert requires_approval(policy, tool, read_only=read_only) is expected


def test_call_requires_approval_reads_the_server_policy() -> None:
    ts = classify_tools(
        [mcp("docs", require_approval={"never": {"tool_names": ["search"]}}), {"type": "web_search"}],
        config=CONFIG,
    )
    ts = ts.with_mcp_tools(
        [
            McpListing(
                "docs",
                [
                    {"name": n, "description": "", "input_schema": {}, "annotations": None}
                    for n in ("search", "delete")
                ],
            )
        ]
    )
    assert call_requires_approval(ts, "mcp__docs__search") is False
    assert call_requires_approval(ts, "mcp__docs__delete") is True
    assert call_requires_approval(ts, "web_search") is False


# --- max_tool_calls --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 3, 2**31, 2**63 - 1])
def test_max_tool_calls_accepts_integers_in_range(value: int) -> None:
    assert validate_max_tool_calls(value) == value


def test_max_tool_calls_null_means_unset() -> None:
    assert validate_max_tool_calls(None) is None


@pytest.mark.parametrize(
    "value, code, message",
    [
        (
            0,
            "integer_below_min_value",
            "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, but got 0 instead.",
        ),
        (
            -1,
            "integer_below_min_value",
            "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, but got -1 instead.",
        ),
        (
            -(2**63),
            "integer_below_min_value",
            "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, "
            "but got -9223372036854775808 instead.",
        ),
        (
            2**63,
            "integer_above_max_value",
            "Invalid 'max_tool_calls': integer above maximum value. Expected a value <= 9223372036854775807, "
            "but got 9223372036854775808 instead.",
        ),
        (
            "3",
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a string instead.",
        ),
        (
            3.0,
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a decimal number instead.",
        ),
        (
            2.5,
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a decimal number instead.",
        ),
        (
            True,
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a boolean instead.",
        ),
        (
            False,
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a boolean instead.",
        ),
        (
            [1],
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got an array instead.",
        ),
        (
            {"n": 1},
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got an object instead.",
        ),
    ],
)
def test_max_tool_calls_refusals(value: Any, code: str, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        validate_max_tool_calls(value)
    err = info.value
    assert err.to_dict() == {
        "message": message,
        "type": "invalid_request_error",
        "param": "max_tool_calls",
        "code": code,
    }
    assert err.status == 400


def test_budget_counts_dispatched_calls_and_refuses_past_the_limit() -> None:
    budget = ToolCallBudget(limit=2)
    assert budget.admit() and not budget.refuse_next and budget.admit()
    assert budget.refuse_next
    assert budget.exhausted and budget.offer_gateway_tools  # reaching the limit refuses nothing yet
    assert budget.admit() is False
    assert (budget.dispatched, budget.refused) == (2, 1)
    assert budget.offer_gateway_tools is False  # later rounds offer no gateway tools
    assert budget.refusal_output == '{"error":"UserError: Reached tool call limit of 2"}'
    assert limit_output(7) == '{"error":"UserError: Reached tool call limit of 7"}'


def test_only_the_first_refused_search_or_interpreter_item_is_kept() -> None:
    budget = ToolCallBudget(limit=1)
    budget.admit()
    assert budget.keep_refused_item("mcp") is False  # refused MCP calls are omitted
    assert budget.keep_refused_item("web_search") is True
    assert budget.keep_refused_item("code_interpreter") is False
    assert budget.keep_refused_item("web_search") is False


def test_unlimited_budget_never_refuses() -> None:
    budget = ToolCallBudget(limit=None)
    assert all(budget.admit() for _ in range(1000))
    assert not budget.exhausted and budget.offer_gateway_tools


def test_failure_result_feeds_the_model_a_json_error() -> None:
    call = ToolCall(call_id="c", name="web_search", kind="web_search", arguments="{}")
    result = ToolResult.failure(call, 'provider said "no"')
    assert result.status == "failed" and not result.ok
    assert orjson.loads(result.output) == {"error": 'provider said "no"'}
    assert ToolResult.from_payload(result.to_payload()) == result
