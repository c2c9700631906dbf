"""The Response object carries every field the ``openai`` SDK's ``Response`` declares, and nothing
else, with OpenAI's defaults: in JSON, in the stored snapshot and in every response-bearing event."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai.types.responses import Response as SDKResponse

from tests.responses.conftest import Gateway, check_sdk_response
from tests.responses.scripts import text

SDK_FIELDS = {info.alias or name for name, info in SDKResponse.model_fields.items()}
# OpenAI's API sends ``store`` on every response although the SDK does not declare it.
SENT_BY_OPENAI = {"store"}
FN = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def _strict(response: dict[str, Any]) -> None:
    """Every SDK field present, no field the SDK does not declare, and the SDK parses it."""
    assert set(response) - SDK_FIELDS - SENT_BY_OPENAI == set(), "extra fields"
    assert SDK_FIELDS - set(response) == set(), "missing fields"
    check_sdk_response(response)


def _defaults(response: dict[str, Any]) -> None:
    assert response["access_programs"] is None
    assert response["moderation"] is None
    assert response["prompt_cache_key"] is None
    assert response["prompt_cache_retention"] is None
    assert response["top_logprobs"] == 0
    assert response["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert response["reasoning"] == {"context": None, "effort": None, "summary": None}
    assert response["tool_usage"] == {
        "image_gen": {
            "input_tokens": 0,
            "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"image_tokens": 0, "text_tokens": 0},
            "total_tokens": 0,
        },
        "web_search": {"num_requests": 0},
    }
    assert response["parallel_tool_calls"] is False


@pytest.mark.django_db(transaction=True)
def test_json_and_stored_snapshot_carry_every_sdk_field(gw: Gateway) -> None:
    gw.script(text("Hello"), service_tier="default")
    r = gw.post({"model": "m", "input": "hi", "tools": [FN]})
    assert r.status_code == 200, r.text
    body = r.json()
    _strict(body)
    _defaults(body)
    assert body["service_tier"] == "default"  # the tier that served the terminal round
    assert body["tools"] == [{**FN, "output_schema": None}]
    stored = httpx.get(f"{gw.url}/v1/responses/{body['id']}", timeout=10).json()
    _strict(stored)
    assert stored == body


@pytest.mark.django_db(transaction=True)
def test_every_response_bearing_event_carries_every_sdk_field(gw: Gateway) -> None:
    gw.script(text("Hello"), service_tier="flex")
    events = gw.stream({"model": "m", "input": "hi"})
    bearing = [e for e in events if "response" in e]
    assert [e["type"] for e in bearing] == ["response.created", "response.in_progress", "response.completed"]
    for event in bearing:
        _strict(event["response"])
        _defaults(event["response"])
    assert [e["response"]["service_tier"] for e in bearing] == ["auto", "auto", "flex"]


@pytest.mark.django_db(transaction=True)
def test_requested_values_are_echoed_over_the_defaults(gw: Gateway) -> None:
    gw.script(text("Hello"))
    body = gw.post(
        {
            "model": "m",
            "input": "hi",
            "top_logprobs": 3,
            "text": {"verbosity": "low"},
            "reasoning": {"effort": "low"},
            "prompt_cache_retention": "24h",
            "parallel_tool_calls": True,
        }
    ).json()
    _strict(body)
    assert body["top_logprobs"] == 3
    assert body["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert body["reasoning"] == {"context": None, "effort": "low", "summary": None}
    assert body["prompt_cache_retention"] == "24h"
    assert body["parallel_tool_calls"] is True


@pytest.mark.django_db(transaction=True)
def test_parallel_tool_calls_is_false_upstream_unless_asked(gw: Gateway) -> None:
    gw.script(text("a"))
    gw.post({"model": "m", "input": "hi", "tools": [FN]})
    assert gw.upstream_bodies()[-1]["parallel_tool_calls"] is False
    gw.script(text("b"))
    gw.post({"model": "m", "input": "hi", "tools": [FN], "parallel_tool_calls": True})
    assert gw.upstream_bodies()[-1]["parallel_tool_calls"] is True


@pytest.mark.django_db(transaction=True)
def test_web_search_tool_is_echoed_with_its_defaults(gw: Gateway) -> None:
    gw.script(text("no search needed"))
    declared = {"type": "web_search", "user_location": {"type": "approximate", "city": "Paris"}}
    body = gw.post({"model": "m", "input": "hi", "tools": [declared]}).json()
    _strict(body)
    assert body["tools"] == [
        {
            "type": "web_search",
            "search_context_size": "medium",
            "user_location": {
                "type": "approximate",
                "city": "Paris",
                "country": None,
                "region": None,
                "timezone": None,
            },
        }
    ]
