"""OpenAI's Usage API on the wire: the query of ``GET /v1/organization/usage/{completions,embeddings}``
(:func:`parse_usage_query`) and its answer (:class:`UsageCompletionsPage`, :class:`UsageEmbeddingsPage`).

Fields follow OpenAI's API reference in its order. What the gateway cannot serve (projects, users,
batches, service tiers) is refused with a 400 naming the parameter, never ignored. API keys are
named ``key_<id>`` (the ``ApiKey`` row's id; ``manage.py apikey list`` prints it).
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from gateway.core import errors

BUCKET_SECONDS = {"1m": 60, "1h": 3600, "1d": 86400}
# OpenAI's ``limit`` (buckets per page) for each bucket width: (default, maximum).
BUCKET_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
GROUP_BY = ("api_key_id", "model")  # what the ledger can group by
# OpenAI's parameters this gateway has nothing to answer with (no projects, users, batches).
UNSUPPORTED = ("project_ids", "user_ids", "batch")
LIST_PARAMS = ("group_by", "models", "api_key_ids")
MAX_TIME = 253402300799  # 9999-12-31T23:59:59Z: the last second a datetime holds, so a range's end
API_KEY_ID = re.compile(r"key_([1-9][0-9]{0,18})")
CURSOR_PREFIX = "page_"


def api_key_public_id(pk: int | None) -> str | None:
    """The Usage API's name of an ``ApiKey`` row (``key_<id>``); ``None`` for calls without a key."""
    return None if pk is None else f"key_{pk}"


# -- the query -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageQuery:
    """A parsed, checked query: the range ``[start_time, end_time)`` and the page asked for."""

    start_time: int
    end_time: int
    bucket_width: str
    group_by: tuple[str, ...]
    models: tuple[str, ...]
    api_key_ids: tuple[int, ...]
    limit: int
    page_start: int  # the first bucket's boundary (a cursor's, or ``start_time`` floored)

    @property
    def width(self) -> int:
        return BUCKET_SECONDS[self.bucket_width]


def query_list(query: Any, name: str) -> list[str]:
    """A list parameter as ``name=a&name=b`` or in the SDK's ``name[]=a`` form."""
    return [*query.getlist(name), *query.getlist(f"{name}[]")]


def _integer(param: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise errors.BadRequest(
            f"Invalid '{param}': expected an integer, but got '{raw[:64]}' instead.",
            param=param,
            code="invalid_type",
        ) from None
    return value


def _unix_time(param: str, raw: str) -> int:
    value = _integer(param, raw)
    if not 0 <= value <= MAX_TIME:
        raise errors.BadRequest(
            f"Invalid '{param}': expected Unix seconds between 0 and {MAX_TIME}, but got {value}.",
            param=param,
            code="invalid_value",
        )
    return value


def encode_cursor(bucket_start: int) -> str:
    return CURSOR_PREFIX + base64.urlsafe_b64encode(f"v1:{bucket_start}".encode()).decode()


def _decode_cursor(page: str) -> int | None:
    if not page.startswith(CURSOR_PREFIX):
        return None
    try:
        text = base64.urlsafe_b64decode(page.removeprefix(CURSOR_PREFIX).encode()).decode()
    except ValueError:
        return None
    version, _, value = text.partition(":")
    return int(value) if version == "v1" and value.isdigit() and len(value) <= 19 else None


def parse_usage_query(query: Any, *, now: float | None = None) -> UsageQuery:
    """The checked :class:`UsageQuery` of a request's query string; a 400 naming the parameter for
    anything wrong or anything this gateway cannot serve."""
    for name in UNSUPPORTED:
        if name in query or f"{name}[]" in query:
            raise errors.BadRequest(
                f"'{name}' is not supported: this gateway has no projects, users or batch jobs.",
                param=name,
                code="unsupported_parameter",
            )
    for name in (*LIST_PARAMS, "start_time", "end_time", "bucket_width", "limit", "page"):
        for value in query.getlist(name) + query.getlist(f"{name}[]"):
            errors.refuse_nul(value, name)

    raw_start = query.get("start_time")
    if raw_start in (None, ""):
        raise errors.missing_parameter("start_time")
    start = _unix_time("start_time", raw_start)

    width_name = query.get("bucket_width") or "1d"
    if width_name not in BUCKET_SECONDS:
        raise errors.invalid_value("bucket_width", width_name[:64], list(BUCKET_SECONDS))
    width = BUCKET_SECONDS[width_name]

    raw_end = query.get("end_time")
    if raw_end not in (None, ""):
        end = _unix_time("end_time", raw_end)
        if end <= start:
            raise errors.BadRequest(
                f"Invalid 'end_time': it must be after 'start_time' ({start}), but got {end}.",
                param="end_time",
                code="invalid_value",
            )
    else:  # up to the end of the bucket in progress
        current = int(time.time() if now is None else now)
        end = min(max(-(-current // width) * width, start // width * width + width), MAX_TIME)
        if end <= start:
            raise errors.BadRequest(
                f"Invalid 'start_time': it must be before {MAX_TIME}.",
                param="start_time",
                code="invalid_value",
            )

    default_limit, max_limit = BUCKET_LIMITS[width_name]
    raw_limit = query.get("limit")
    limit = default_limit if raw_limit in (None, "") else _integer("limit", raw_limit)
    if not 1 <= limit <= max_limit:
        raise errors.BadRequest(
            f"Invalid 'limit': with bucket_width '{width_name}' it must be between 1 and {max_limit}, "
            f"but got {limit}.",
            param="limit",
            code="invalid_value",
        )

    group_by: list[str] = []
    for value in query_list(query, "group_by"):
        if value not in GROUP_BY:
            raise errors.invalid_value("group_by", value[:64], GROUP_BY)
        if value not in group_by:
            group_by.append(value)

    key_ids: list[int] = []
    for value in query_list(query, "api_key_ids"):
        matched = API_KEY_ID.fullmatch(value)
        if matched is None:
            raise errors.BadRequest(
                f"Invalid 'api_key_ids': '{value[:64]}' is not an API key id of this gateway "
                "(they look like 'key_12').",
                param="api_key_ids",
                code="invalid_value",
            )
        key_ids.append(int(matched.group(1)))

    page_start = start // width * width
    raw_page = query.get("page")
    if raw_page not in (None, ""):
        cursor = _decode_cursor(raw_page)
        if cursor is None or cursor % width or not start < cursor < end:
            raise errors.BadRequest(
                "Invalid 'page': pass the 'next_page' of the previous answer to the same query.",
                param="page",
                code="invalid_value",
            )
        page_start = cursor

    return UsageQuery(
        start_time=start,
        end_time=end,
        bucket_width=width_name,
        group_by=tuple(group_by),
        models=tuple(query_list(query, "models")),
        api_key_ids=tuple(key_ids),
        limit=limit,
        page_start=page_start,
    )


# -- the answer ------------------------------------------------------------------------------------


class UsageCompletionsResult(BaseModel):
    """One group of a bucket's completions usage (a field is ``null`` unless grouped by it)."""

    object: Literal["organization.usage.completions.result"]
    input_tokens: int
    output_tokens: int
    input_cached_tokens: int
    input_audio_tokens: int
    output_audio_tokens: int
    num_model_requests: int
    project_id: None
    user_id: None
    api_key_id: str | None
    model: str | None
    batch: None
    service_tier: None


class UsageEmbeddingsResult(BaseModel):
    """One group of a bucket's embeddings usage."""

    object: Literal["organization.usage.embeddings.result"]
    input_tokens: int
    num_model_requests: int
    project_id: None
    user_id: None
    api_key_id: str | None
    model: str | None


class UsageCompletionsBucket(BaseModel):
    object: Literal["bucket"]
    start_time: int
    end_time: int
    results: list[UsageCompletionsResult]


class UsageEmbeddingsBucket(BaseModel):
    object: Literal["bucket"]
    start_time: int
    end_time: int
    results: list[UsageEmbeddingsResult]


class UsageCompletionsPage(BaseModel):
    """OpenAI's usage page: ``limit`` buckets, ``next_page`` to continue."""

    object: Literal["page"]
    data: list[UsageCompletionsBucket]
    has_more: bool
    next_page: str | None


class UsageEmbeddingsPage(BaseModel):
    object: Literal["page"]
    data: list[UsageEmbeddingsBucket]
    has_more: bool
    next_page: str | None


def completions_result(
    row: Mapping[str, Any], *, api_key_id: str | None, model: str | None
) -> dict[str, Any]:
    return {
        "object": "organization.usage.completions.result",
        "input_tokens": row["input_tokens"],
        "output_tokens": row["output_tokens"],
        "input_cached_tokens": row["cached_tokens"],
        "input_audio_tokens": 0,
        "output_audio_tokens": 0,
        "num_model_requests": row["requests"],
        "project_id": None,
        "user_id": None,
        "api_key_id": api_key_id,
        "model": model,
        "batch": None,
        "service_tier": None,
    }


def embeddings_result(row: Mapping[str, Any], *, api_key_id: str | None, model: str | None) -> dict[str, Any]:
    return {
        "object": "organization.usage.embeddings.result",
        "input_tokens": row["input_tokens"],
        "num_model_requests": row["requests"],
        "project_id": None,
        "user_id": None,
        "api_key_id": api_key_id,
        "model": model,
    }


RESULTS = {"completions": completions_result, "embeddings": embeddings_result}
