"""One mapping from pydantic's ValidationError to the OpenAI 400, used by Responses and Conversations."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import orjson
import pytest

from conversations_app.schemas import validate_item
from gateway.core import errors
from responses_app.protocol.schemas import parse_create_request

ROOT = Path(__file__).resolve().parents[2]


def responses_refusal(body: dict[str, Any]) -> errors.BadRequest:
    with pytest.raises(errors.BadRequest) as info:
        parse_create_request(orjson.dumps({"model": "m", "input": "hi", **body}))
    return info.value


def conversations_refusal(item: Any) -> errors.BadRequest:
    with pytest.raises(errors.BadRequest) as info:
        validate_item(item, "items[0]")
    return info.value


def test_literal_refusals_read_the_same_in_both_apps() -> None:
    r = responses_refusal({"truncation": "sometimes"})
    assert (r.message, r.param, r.code) == (
        "Invalid value: 'sometimes'. Supported values are: 'auto' and 'disabled'.",
        "truncation",
        "invalid_value",
    )
    c = conversations_refusal({"type": "message", "role": "user", "content": "x", "status": "done"})
    assert c.code == "invalid_value" and c.param == "items[0].status"
    assert c.message.startswith("Invalid value: 'done'. Supported values are: 'in_progress', ")


def test_param_is_the_json_path_and_bounds_and_types_are_named() -> None:
    r = responses_refusal({"top_logprobs": 21})
    assert (r.message, r.param, r.code) == (
        "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 instead.",
        "top_logprobs",
        "integer_above_max_value",
    )
    r = responses_refusal({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]})
    assert (r.message, r.param, r.code) == (
        "Invalid type for 'input[0].content[0].text': expected a string, but got an integer instead.",
        "input[0].content[0].text",
        "invalid_type",
    )
    c = conversations_refusal({"type": "message", "role": "user", "content": [{"type": "input_text"}]})
    assert (c.message, c.param, c.code) == (
        "Missing required parameter: 'items[0].content[0].text'.",
        "items[0].content[0].text",
        "missing_required_parameter",
    )


def _handlers_of_validation_error(path: Path) -> list[ast.ExceptHandler]:
    tree = ast.parse(path.read_text())
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ExceptHandler)
        and isinstance(node.type, ast.Name)
        and node.type.id == "ValidationError"
    ]


@pytest.mark.parametrize("app", ["responses_app", "conversations_app"])
def test_every_client_validation_error_goes_through_the_one_mapping(app: str) -> None:
    """No second copy: each ``except ValidationError`` in the apps raises ``errors.validation_error(...)``."""
    # upstream_events: the upstream's malformed stream is a StreamFailure, not a client's 400.
    modules = [p for p in sorted((ROOT / app).rglob("*.py")) if p.name != "upstream_events.py"]
    handlers = [h for p in modules for h in _handlers_of_validation_error(p)]
    assert len(handlers) >= 2
    for handler in handlers:
        raised = [n for n in ast.walk(handler) if isinstance(n, ast.Raise)]
        assert raised and all(
            isinstance(r.exc, ast.Call) and ast.unparse(r.exc.func) == "errors.validation_error"
            for r in raised
        ), ast.unparse(handler)
