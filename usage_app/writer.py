"""The ledger's batch writer: rows queued by :func:`usage_app.ledger.record`, written in batches.

PLACEHOLDER (issue 58, helper A replaces it): rows are kept in a list; :func:`flush` writes them."""

from __future__ import annotations

from typing import Any

_pending: list[Any] = []


def queue(entry: Any) -> None:
    _pending.append(entry)


async def flush() -> None:
    from gateway.core.db import run_orm
    from usage_app.ledger import rows
    from usage_app.models import UsageRecord

    batch, _pending[:] = list(_pending), []
    if batch:
        await run_orm(UsageRecord.objects.bulk_create, rows(batch))
