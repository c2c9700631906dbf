"""OpenAI's attribute filters for vector store search and the ``file_search`` tool.

A filter is a ``ComparisonFilter`` (``{"type": "eq"|"ne"|"gt"|"gte"|"lt"|"lte"|"in"|"nin", "key",
"value"}``) or a ``CompoundFilter`` (``{"type": "and"|"or", "filters": [...]}``, nested), as in
``openai.types.shared``. :func:`parse_filters` checks the shape (a 400 whose ``param`` is the path of
the first wrong member, e.g. ``filters.filters[1].type``) and returns a :class:`Filter` whose
:meth:`~Filter.matches` tests a file's ``attributes``.

Semantics (docs/file-search.md "Filters"): ``eq``/``ne`` compare values of the same JSON type (a
boolean never equals a number); ``gt``/``gte``/``lt``/``lte`` order two numbers or two strings (ISO
dates order as strings) and are false for any other pair; ``in``/``nin`` test membership in an array
of strings and numbers. A missing attribute matches only ``ne`` and ``nin``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core import errors

COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin")
COMPOUNDS = ("and", "or")
MAX_DEPTH = 16  # nesting of compound filters; deeper is a 400, never a recursion error
MAX_FILTERS = 256  # comparison filters in one request
MAX_KEY_LENGTH = 64  # as attribute keys

_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}

Scalar = str | int | float | bool


def _kind(value: Any) -> str:
    """The JSON type a comparison sees: booleans and numbers never compare equal."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


class Filter:
    """A parsed filter; :meth:`matches` tells whether a file's attributes pass it."""

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Comparison(Filter):
    type: str
    key: str
    value: Scalar | tuple[Scalar, ...]

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        if self.key not in attributes:
            return self.type in ("ne", "nin")
        found = attributes[self.key]
        kind = _kind(found)
        if self.type in ("eq", "ne"):
            equal = kind == _kind(self.value) and found == self.value
            return equal if self.type == "eq" else not equal
        if self.type in ("in", "nin"):
            assert isinstance(self.value, tuple)
            member = any(kind == _kind(v) and found == v for v in self.value)
            return member if self.type == "in" else not member
        if kind in ("number", "string") and kind == _kind(self.value):
            return _ORDERINGS[self.type](found, self.value)
        return False


@dataclass(frozen=True)
class Compound(Filter):
    type: str
    filters: tuple[Filter, ...]

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        if self.type == "and":
            return all(f.matches(attributes) for f in self.filters)
        return any(f.matches(attributes) for f in self.filters)


def _unknown(raw: dict[str, Any], allowed: tuple[str, ...], param: str) -> None:
    for key in raw:
        if key not in allowed:
            raise errors.BadRequest(
                f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}", code="unknown_parameter"
            )


def _scalar(value: Any, param: str, *, allow_bool: bool = True) -> Scalar:
    expected = "a string, number or boolean" if allow_bool else "a string or number"
    if isinstance(value, bool) and not allow_bool:
        raise errors.invalid_type(param, expected, value)
    if isinstance(value, str | int | float):
        return value
    raise errors.invalid_type(param, expected, value)


def _comparison(raw: dict[str, Any], param: str) -> Comparison:
    _unknown(raw, ("type", "key", "value"), param)
    kind = raw["type"]
    if "key" not in raw:
        raise errors.missing_parameter(f"{param}.key")
    key = raw["key"]
    if not isinstance(key, str):
        raise errors.invalid_type(f"{param}.key", "a string", key)
    errors.refuse_too_long(key, f"{param}.key", MAX_KEY_LENGTH)
    if "value" not in raw:
        raise errors.missing_parameter(f"{param}.value")
    value = raw["value"]
    if kind in ("in", "nin"):
        if not isinstance(value, list):
            raise errors.invalid_type(f"{param}.value", "an array", value)
        if not value:
            raise errors.BadRequest(
                f"Invalid '{param}.value': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.",
                param=f"{param}.value",
                code="empty_array",
            )
        members = tuple(_scalar(v, f"{param}.value[{i}]", allow_bool=False) for i, v in enumerate(value))
        return Comparison(type=kind, key=key, value=members)
    if kind in _ORDERINGS:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise errors.invalid_type(f"{param}.value", "a number or string", value)
        return Comparison(type=kind, key=key, value=value)
    return Comparison(type=kind, key=key, value=_scalar(value, f"{param}.value"))


def _parse(raw: Any, param: str, depth: int, count: list[int]) -> Filter:
    if not isinstance(raw, dict):
        raise errors.invalid_type(param, "an object", raw)
    if "type" not in raw:
        raise errors.missing_parameter(f"{param}.type")
    kind = raw["type"]
    if not isinstance(kind, str):
        raise errors.invalid_type(f"{param}.type", "a string", kind)
    if kind in COMPARISONS:
        count[0] += 1
        if count[0] > MAX_FILTERS:
            raise errors.BadRequest(
                f"Invalid '{param}': a filter may hold at most {MAX_FILTERS} comparisons.",
                param=param,
                code="invalid_value",
            )
        return _comparison(raw, param)
    if kind not in COMPOUNDS:
        raise errors.invalid_value(f"{param}.type", kind, COMPARISONS + COMPOUNDS)
    _unknown(raw, ("type", "filters"), param)
    if depth >= MAX_DEPTH:
        raise errors.BadRequest(
            f"Invalid '{param}': compound filters nest at most {MAX_DEPTH} deep.",
            param=param,
            code="invalid_value",
        )
    if "filters" not in raw:
        raise errors.missing_parameter(f"{param}.filters")
    members = raw["filters"]
    if not isinstance(members, list):
        raise errors.invalid_type(f"{param}.filters", "an array", members)
    if not members:
        raise errors.BadRequest(
            f"Invalid '{param}.filters': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param=f"{param}.filters",
            code="empty_array",
        )
    parsed = tuple(_parse(m, f"{param}.filters[{i}]", depth + 1, count) for i, m in enumerate(members))
    return Compound(type=kind, filters=parsed)


def parse_filters(raw: Any, param: str = "filters") -> Filter | None:
    """``raw`` (a request's ``filters``, ``None`` for none) as a :class:`Filter`; a wrong shape is a
    400 (:class:`gateway.core.errors.BadRequest`) whose ``param`` is the path below ``param``."""
    if raw is None:
        return None
    errors.refuse_nul(raw, param)
    return _parse(raw, param, 0, [0])
