"""Request-parameter rules several apps share, with OpenAI's wording: metadata and attribute maps."""

from __future__ import annotations

from typing import Any

from gateway.core import errors

METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY_LENGTH = 64
METADATA_MAX_VALUE_LENGTH = 512


def validate_metadata(raw: Any, *, param: str = "metadata") -> dict[str, str]:
    """Up to 16 string pairs, keys ≤ 64 and values ≤ 512 characters, no NUL; ``null`` clears."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise errors.invalid_type(param, "an object", raw)
    refuse_too_many_properties(param, raw, METADATA_MAX_PAIRS)
    for key, value in raw.items():
        field = f"{param}.{key}"
        refuse_long_key(param, key, METADATA_MAX_KEY_LENGTH)
        if not isinstance(value, str):
            raise errors.invalid_type(field, "a string", value)
        errors.refuse_too_long(value, field, METADATA_MAX_VALUE_LENGTH)
        errors.refuse_nul({key: value}, param)
    return dict(raw)


def refuse_too_many_properties(param: str, raw: dict[str, Any], limit: int) -> None:
    if len(raw) > limit:
        raise errors.BadRequest(
            f"Invalid '{param}': too many properties. Expected an object with at most {limit} properties, "
            f"but got an object with {len(raw)} properties instead.",
            param=param,
            code="object_above_max_properties",
        )


def refuse_long_key(param: str, key: str, limit: int) -> None:
    if len(key) > limit:
        raise errors.BadRequest(
            f"Invalid property name in '{param}': '{_short_name(key)}' is too long. Expected a string with "
            f"maximum length {limit}, but got a string with length {len(key)} instead.",
            param=f"{param}.{key}",
            code="property_name_above_max_length",
        )


def _short_name(name: str) -> str:
    """OpenAI prints a long property name as its first and last three characters."""
    return name if len(name) <= 12 else f"{name[:3]}...{name[-3:]}"
