"""Every 400 of the create route with its exact envelope, and the request-scoped fields."""

from __future__ import annotations

from typing import Any

import pytest

from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.scripts import call, text


@pytest.fixture
def wire() -> str:
    return "responses"


def _error(r: Any, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    return dict(body["error"])


def _nothing_happened(gw: Gateway) -> None:
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 0


def test_previous_response_id_with_conversation(gw: Gateway) -> None:
    r = gw.post({"model": "m", "input": "x", "previous_response_id": "resp_1", "conversation": "conv_1"})
    assert _error(r) == {
        "message": "Mutually exclusive parameters: Ensure you are only providing one of: "
        "'previous_response_id' or 'conversation'.",
        "type": "invalid_request_error",
        "param": None,
        "code": "mutually_exclusive_parameters",
    }
    _nothing_happened(gw)


def test_unknown_conversation_is_404(gw: Gateway) -> None:
    r = gw.post({"model": "m", "input": "x", "conversation": {"id": "conv_missing"}})
    assert _error(r, 404)["param"] == "conversation"
    _nothing_happened(gw)


def test_missing_model(gw: Gateway) -> None:
    r = gw.post({"input": "x"})
    assert _error(r) == {
        "message": "Missing required parameter: 'model'.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "missing_required_parameter",
    }


@pytest.mark.parametrize(
    ("value", "code", "message"),
    [
        (
            0,
            "integer_below_min_value",
            "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, but got 0 instead.",
        ),
        (
            9223372036854775808,
            "integer_above_max_value",
            "Invalid 'max_tool_calls': integer above maximum value. Expected a value <= 9223372036854775807, "
            "but got 9223372036854775808 instead.",
        ),
        (
            "3",
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a string instead.",
        ),
    ],
)
def test_max_tool_calls_validation(gw: Gateway, value: Any, code: str, message: str) -> None:
    for store in (True, False):  # executor and direct requests alike
        r = gw.post({"model": "m", "input": "x", "max_tool_calls": value, "store": store})
        assert _error(r) == {
            "message": message,
            "type": "invalid_request_error",
            "param": "max_tool_calls",
            "code": code,
        }
    _nothing_happened(gw)


def test_max_tool_calls_echoed_not_forwarded_not_inherited(gw: Gateway) -> None:
    gw.script(text("a"))
    first = gw.post({"model": "m", "input": "x", "max_tool_calls": 3}).json()
    assert first["max_tool_calls"] == 3
    assert "max_tool_calls" not in gw.upstream_bodies()[-1]
    gw.script(text("b"))
    second = gw.post({"model": "m", "input": "y", "previous_response_id": first["id"]}).json()
    assert second["max_tool_calls"] is None


def test_missing_tool_output(gw: Gateway) -> None:
    gw.script(call("f", "{}", call_id="call_abc"))
    first = gw.client.responses.create(
        model="m", input="x", tools=[{"type": "function", "name": "f", "parameters": {}}]
    )
    before = Response.objects.count()
    r = gw.post({"model": "m", "input": "no outputs", "previous_response_id": first.id})
    assert _error(r) == {
        "message": "No tool output found for function call call_abc.",
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }
    assert Response.objects.count() == before
    assert len(gw.upstream_bodies()) == 1


def test_output_without_call(gw: Gateway) -> None:
    r = gw.post(
        {"model": "m", "input": [{"type": "function_call_output", "call_id": "call_zzz", "output": "1"}]}
    )
    assert _error(r) == {
        "message": "No tool call found for function call output with call_id call_zzz.",
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }
    _nothing_happened(gw)


def test_unknown_and_cross_owner_previous_response(gw: Gateway) -> None:
    Response.objects.create(
        id="resp_other", owner="oidc:someone-else", status="completed", model="m", snapshot={}
    )
    for rid in ("resp_nope", "resp_other"):
        r = gw.post({"model": "m", "input": "x", "previous_response_id": rid})
        assert _error(r, 400) == {
            "message": f"Previous response with id '{rid}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    assert gw.upstream_bodies() == []


def test_background_requires_store(gw: Gateway) -> None:
    r = gw.post({"model": "m", "input": "x", "background": True, "store": False})
    assert _error(r)["param"] == "background"
    _nothing_happened(gw)


def test_invalid_retention(gw: Gateway) -> None:
    r = gw.post({"model": "m", "input": "x", "prompt_cache_retention": "forever"})
    err = _error(r)
    assert err["param"] == "prompt_cache_retention"
    assert err["code"] == "invalid_value"
    _nothing_happened(gw)


# --- prompt_cache_options ---------------------------------------------------------------------


def test_prompt_cache_options_refused_by_default(gw: Gateway) -> None:
    r = gw.post(
        {
            "model": "m",
            "input": "x",
            "prompt_cache_options": {"mode": "explicit"},
            "previous_response_id": "resp_unknown",
        }
    )
    err = _error(r)  # refused before the history lookup (which would be a 404)
    assert err["param"] == "prompt_cache_options"
    assert err["code"] == "unsupported_parameter"
    _nothing_happened(gw)


def test_prompt_cache_options_direct_route_untouched(gw: Gateway) -> None:
    gw.upstream.script("/v1/responses", _json_answer({"id": "resp_up", "object": "response"}))
    body = b'{"model":"m","input":"x","store":false,"prompt_cache_options":{"prewarm":true,"future":1},"prompt_cache_key":null}'
    import httpx

    r = httpx.post(f"{gw.url}/v1/responses", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert r.json() == {"id": "resp_up", "object": "response"}
    assert gw.upstream.last("/v1/responses").body == body  # byte for byte


@pytest.mark.parametrize(
    ("options", "param", "code"),
    [
        ({"prewarm": True}, "prompt_cache_options.prewarm", "unsupported_parameter"),
        (
            {"comparison_response_id": "resp_x"},
            "prompt_cache_options.comparison_response_id",
            "unsupported_parameter",
        ),
        ({"bogus": 1}, "prompt_cache_options.bogus", "unknown_parameter"),
        ({"ttl": "12h"}, "prompt_cache_options.ttl", "invalid_value"),
        ({"mode": None}, "prompt_cache_options.mode", "invalid_value"),
        ("explicit", "prompt_cache_options", "invalid_type"),
    ],
)
def test_prompt_cache_options_refusals_when_supported(
    gw: Gateway, gateway_config: Any, options: Any, param: str, code: str
) -> None:
    gateway_config(
        llm_api_base=gw.upstream.url, upstream_api="responses", responses__prompt_cache_options_supported=True
    )
    err = _error(gw.post({"model": "m", "input": "x", "prompt_cache_options": options}))
    assert (err["param"], err["code"]) == (param, code)
    _nothing_happened(gw)


def test_prompt_cache_options_forwarded_echoed_not_inherited(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(
        llm_api_base=gw.upstream.url, upstream_api="responses", responses__prompt_cache_options_supported=True
    )
    gw.script(text("a"))
    options = {"mode": "explicit", "ttl": "30m"}
    first = gw.post({"model": "m", "input": "x", "prompt_cache_options": options}).json()
    assert first["prompt_cache_options"] == options
    assert gw.upstream_bodies()[-1]["prompt_cache_options"] == options
    assert Response.objects.get(id=first["id"]).snapshot["prompt_cache_options"] == options
    gw.script(text("b"))
    empty = gw.post({"model": "m", "input": "x", "prompt_cache_options": {}}).json()
    assert empty["prompt_cache_options"] == {}
    assert gw.upstream_bodies()[-1]["prompt_cache_options"] == {}
    gw.script(text("c"))
    second = gw.post({"model": "m", "input": "y", "previous_response_id": first["id"]}).json()
    assert second["prompt_cache_options"] is None
    assert "prompt_cache_options" not in gw.upstream_bodies()[-1]


# --- other request-scoped fields --------------------------------------------------------------


def test_request_scoped_fields_forwarded_and_not_inherited(gw: Gateway) -> None:
    gw.script(text("a"), service_tier="flex")
    first = gw.post(
        {
            "model": "m",
            "input": "x",
            "prompt_cache_key": "group-1",
            "prompt_cache_retention": "24h",
            "service_tier": "priority",
            "cache_salt": "salt",
            "top_k": 5,
            "stream_options": {"include_obfuscation": False},
        }
    ).json()
    sent = gw.upstream_bodies()[-1]
    assert sent["prompt_cache_key"] == "group-1"
    assert sent["prompt_cache_retention"] == "24h"
    assert sent["service_tier"] == "priority"
    assert sent["cache_salt"] == "salt"
    assert sent["top_k"] == 5
    for gateway_owned in (
        "stream_options",
        "conversation",
        "previous_response_id",
        "background",
    ):
        assert gateway_owned not in sent
    assert first["service_tier"] == "flex"  # the tier the upstream reports, not the requested one
    assert Response.objects.get(id=first["id"]).snapshot["service_tier"] == "flex"
    assert first.get("prompt_cache_key") is None  # not echoed
    gw.script(text("b"))
    second = gw.post(
        {"model": "m", "input": "y", "previous_response_id": first["id"], "prompt_cache_key": None}
    ).json()
    sent = gw.upstream_bodies()[-1]
    for key in ("prompt_cache_key", "prompt_cache_retention", "service_tier", "cache_salt", "top_k"):
        assert key not in sent
    assert second["service_tier"] == "auto"  # vLLM reports "auto" when none was requested


def _json_answer(payload: dict[str, Any]) -> Any:
    from aiohttp import web

    async def answer(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response(payload)

    return answer


@pytest.mark.parametrize("wire", ["responses", "chat_completions"])
@pytest.mark.parametrize("tier", ["fast", "ultrafast"])
def test_any_service_tier_is_forwarded_unchanged_by_the_executor(gw: Gateway, tier: str) -> None:
    """The openai 3.57 SDK allows "fast" and "ultrafast"; the spec forwards an explicit tier as is."""
    gw.script(text("a"), service_tier=tier)
    r = gw.post({"model": "m", "input": "x", "service_tier": tier})
    assert r.status_code == 200, r.text
    assert gw.upstream_bodies()[-1]["service_tier"] == tier
    assert r.json()["service_tier"] == tier  # reported by the upstream, returned as it is
    gw.script(text("b"))
    events = gw.stream({"model": "m", "input": "y", "service_tier": tier})
    assert events[-1]["type"] == "response.completed"
    assert gw.upstream_bodies()[-1]["service_tier"] == tier


def test_a_service_tier_that_is_not_a_string_is_invalid_type(gw: Gateway) -> None:
    error = _error(gw.post({"model": "m", "input": "x", "service_tier": 5}))
    assert (error["param"], error["code"]) == ("service_tier", "invalid_type")
    _nothing_happened(gw)
