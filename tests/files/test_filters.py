"""OpenAI's attribute filters (files_app.filters): every operator, compounds, and wrong shapes."""

from __future__ import annotations

from typing import Any

import pytest

from files_app.filters import MAX_DEPTH, parse_filters
from gateway.core.errors import BadRequest

ATTRS: dict[str, Any] = {"author": "ada", "year": 2021, "score": 0.5, "draft": False, "date": "2024-03-01"}


def match(raw: dict[str, Any], attributes: dict[str, Any] = ATTRS) -> bool:
    parsed = parse_filters(raw)
    assert parsed is not None
    return parsed.matches(attributes)


@pytest.mark.parametrize(
    ("kind", "key", "value", "expected"),
    [
        ("eq", "author", "ada", True),
        ("eq", "author", "bob", False),
        ("eq", "year", 2021.0, True),
        ("eq", "draft", False, True),
        ("eq", "draft", 0, False),  # a boolean never equals a number
        ("eq", "year", "2021", False),  # nor a string a number
        ("ne", "author", "bob", True),
        ("ne", "author", "ada", False),
        ("ne", "draft", 0, True),
        ("gt", "year", 2020, True),
        ("gt", "year", 2021, False),
        ("gte", "year", 2021, True),
        ("gte", "score", 0.6, False),
        ("lt", "score", 0.6, True),
        ("lt", "year", 2021, False),
        ("lte", "year", 2021, True),
        ("lte", "year", 2020.5, False),
        ("gte", "date", "2024-01-01", True),  # ISO dates order as strings
        ("lt", "date", "2024-01-01", False),
        ("gt", "author", 1, False),  # a string and a number do not order
        ("gt", "draft", 0, False),  # nor does a boolean
        ("in", "author", ["bob", "ada"], True),
        ("in", "author", ["bob"], False),
        ("in", "year", [2020, 2021], True),
        ("in", "year", ["2021"], False),
        ("nin", "author", ["bob"], True),
        ("nin", "author", ["ada", "bob"], False),
    ],
)
def test_comparison(kind: str, key: str, value: Any, expected: bool) -> None:
    assert match({"type": kind, "key": key, "value": value}) is expected


@pytest.mark.parametrize(
    ("kind", "expected"), [("eq", False), ("gt", False), ("in", False), ("ne", True), ("nin", True)]
)
def test_missing_attribute_matches_only_the_negations(kind: str, expected: bool) -> None:
    value: Any = ["x"] if kind in ("in", "nin") else "x"
    assert match({"type": kind, "key": "absent", "value": value}) is expected


def test_compound_filters_nest() -> None:
    ada_recent = {
        "type": "and",
        "filters": [
            {"type": "eq", "key": "author", "value": "ada"},
            {
                "type": "or",
                "filters": [
                    {"type": "gte", "key": "year", "value": 2022},
                    {"type": "eq", "key": "draft", "value": False},
                ],
            },
        ],
    }
    assert match(ada_recent)
    assert not match(ada_recent, {**ATTRS, "draft": True})
    assert match(ada_recent, {**ATTRS, "draft": True, "year": 2023})
    assert not match(ada_recent, {**ATTRS, "author": "bob"})
    either = {
        "type": "or",
        "filters": [
            {"type": "eq", "key": "author", "value": "bob"},
            {"type": "lt", "key": "year", "value": 2000},
        ],
    }
    assert not match(either)
    assert match(either, {"author": "bob"})
    assert parse_filters(None) is None


@pytest.mark.parametrize(
    ("raw", "param", "code"),
    [
        ("eq", "filters", "invalid_type"),
        ({"key": "a", "value": 1}, "filters.type", "missing_required_parameter"),
        ({"type": "like", "key": "a", "value": 1}, "filters.type", "invalid_value"),
        ({"type": 3, "key": "a", "value": 1}, "filters.type", "invalid_type"),
        ({"type": "eq", "value": 1}, "filters.key", "missing_required_parameter"),
        ({"type": "eq", "key": 5, "value": 1}, "filters.key", "invalid_type"),
        ({"type": "eq", "key": "k" * 65, "value": 1}, "filters.key", "string_above_max_length"),
        ({"type": "eq", "key": "a"}, "filters.value", "missing_required_parameter"),
        ({"type": "eq", "key": "a", "value": None}, "filters.value", "invalid_type"),
        ({"type": "eq", "key": "a", "value": {"x": 1}}, "filters.value", "invalid_type"),
        ({"type": "eq", "key": "a", "value": ["x"]}, "filters.value", "invalid_type"),
        ({"type": "gt", "key": "a", "value": True}, "filters.value", "invalid_type"),
        ({"type": "in", "key": "a", "value": "x"}, "filters.value", "invalid_type"),
        ({"type": "in", "key": "a", "value": []}, "filters.value", "empty_array"),
        ({"type": "nin", "key": "a", "value": ["x", True]}, "filters.value[1]", "invalid_type"),
        ({"type": "eq", "key": "a", "value": 1, "extra": 2}, "filters.extra", "unknown_parameter"),
        ({"type": "and"}, "filters.filters", "missing_required_parameter"),
        ({"type": "or", "filters": {}}, "filters.filters", "invalid_type"),
        ({"type": "or", "filters": []}, "filters.filters", "empty_array"),
        ({"type": "and", "filters": [], "key": "a"}, "filters.key", "unknown_parameter"),
        (
            {
                "type": "and",
                "filters": [{"type": "eq", "key": "a", "value": 1}, {"type": "xor", "filters": []}],
            },
            "filters.filters[1].type",
            "invalid_value",
        ),
        (
            {
                "type": "or",
                "filters": [{"type": "and", "filters": [{"type": "eq", "key": "a", "value": "x\x00"}]}],
            },
            "filters.filters[0].filters[0].value",
            "invalid_value",
        ),
    ],
)
def test_wrong_shapes_are_400_naming_the_member(raw: Any, param: str, code: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse_filters(raw)
    assert (exc.value.param, exc.value.code, exc.value.status) == (param, code, 400)


def test_wrong_type_message_and_prefix() -> None:
    with pytest.raises(BadRequest) as exc:
        parse_filters({"type": "like", "key": "a", "value": 1}, "tools[0].filters")
    assert exc.value.param == "tools[0].filters.type"
    assert exc.value.message == (
        "Invalid value: 'like'. Supported values are: 'eq', 'ne', 'gt', 'gte', 'lt', 'lte', 'in', 'nin', 'and', and 'or'."
    )


def test_nesting_is_bounded() -> None:
    raw: dict[str, Any] = {"type": "eq", "key": "a", "value": 1}
    for _ in range(MAX_DEPTH):
        raw = {"type": "and", "filters": [raw]}
    assert match(raw, {"a": 1})
    with pytest.raises(BadRequest) as exc:
        parse_filters({"type": "and", "filters": [raw]})
    assert exc.value.code == "invalid_value"
    assert exc.value.param is not None and exc.value.param.startswith("filters.filters[0]")
