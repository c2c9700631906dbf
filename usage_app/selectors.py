"""Reads of the usage ledger: the Usage API's pages and the admin's report, aggregated in SQL.

Rows are summed per UTC bucket (``Trunc``) and group in the database, never row by row in Python;
a token count the upstream did not report adds 0. A principal sees its own rows; an admin principal
(``Principal.is_admin``) sees everyone's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import BigIntegerField, Count, F, QuerySet, Sum
from django.db.models.functions import Coalesce, Trunc

from gateway.core.principal import Principal
from usage_app import schemas
from usage_app.models import UsageRecord

TRUNC_KIND = {"1m": "minute", "1h": "hour", "1d": "day"}


def _at(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _total(field: str) -> Coalesce:
    return Coalesce(Sum(field), 0, output_field=BigIntegerField())


def totals() -> dict[str, Any]:
    """The sums every usage read annotates: tokens (unreported counts add 0) and requests."""
    return {
        "input_tokens": _total("input_tokens"),
        "output_tokens": _total("output_tokens"),
        "cached_tokens": _total("cached_tokens"),
        "requests": Count("id"),
    }


def usage_records_visible(*, principal: Principal) -> QuerySet[UsageRecord]:
    """The ledger rows ``principal`` may read: its own, or every row for an admin."""
    records = UsageRecord.objects.all()
    return records if principal.is_admin else records.filter(owner=principal.owner)


def usage_page(*, query: schemas.UsageQuery, kind: str, principal: Principal) -> dict[str, Any]:
    """One page of the Usage API (``kind``: ``completions`` or ``embeddings``): ``query.limit``
    buckets from ``query.page_start``, empty ones included, each clipped to the query's range."""
    width = query.width
    page_end = min(query.page_start + query.limit * width, query.end_time)
    records = usage_records_visible(principal=principal).filter(
        kind=kind,
        created_at__gte=_at(max(query.page_start, query.start_time)),
        created_at__lt=_at(page_end),
    )
    if query.models:
        records = records.filter(model__in=query.models)
    if query.api_key_ids:
        records = records.filter(api_key_id__in=query.api_key_ids)
    groups = list(query.group_by)
    rows = (
        records.annotate(bucket=Trunc("created_at", TRUNC_KIND[query.bucket_width], tzinfo=UTC))
        .values("bucket", *groups)
        .annotate(**totals())
        .order_by("bucket", *(F(name).asc(nulls_first=True) for name in groups))
    )
    by_bucket: dict[int, list[dict[str, Any]]] = {}
    render = schemas.RESULTS[kind]
    for row in rows:
        key_id = schemas.api_key_public_id(row["api_key_id"]) if "api_key_id" in groups else None
        model = (row["model"] or None) if "model" in groups else None
        start = int(row["bucket"].timestamp())
        by_bucket.setdefault(start, []).append(render(row, api_key_id=key_id, model=model))

    buckets = []
    boundary = query.page_start
    while boundary < page_end:
        buckets.append(
            {
                "object": "bucket",
                "start_time": max(boundary, query.start_time),
                "end_time": min(boundary + width, query.end_time),
                "results": by_bucket.get(boundary, []),
            }
        )
        boundary += width
    has_more = page_end < query.end_time
    return {
        "object": "page",
        "data": buckets,
        "has_more": has_more,
        "next_page": schemas.encode_cursor(page_end) if has_more else None,
    }


# -- the admin's report ----------------------------------------------------------------------------

REPORT_GROUPS = ("owner", "api_key_id", "model")


def usage_totals(*, since: datetime, until: datetime, by: str) -> list[dict[str, Any]]:
    """Every principal's (``by="owner"``), key's or model's totals in ``[since, until)``."""
    return list(
        UsageRecord.objects.filter(created_at__gte=since, created_at__lt=until)
        .values(by)
        .annotate(**totals())
        .order_by(by)
    )


def usage_daily(*, since: datetime, until: datetime, by: str) -> list[dict[str, Any]]:
    """Tokens (input + output) and requests per UTC day and key or model in ``[since, until)``."""
    return list(
        UsageRecord.objects.filter(created_at__gte=since, created_at__lt=until)
        .annotate(day=Trunc("created_at", "day", tzinfo=UTC))
        .values("day", by)
        .annotate(**totals())
        .order_by("day", by)
    )
