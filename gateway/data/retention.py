"""The retention purge: stored responses, conversations and usage rows past ``[retention]``'s ages
are deleted in bounded batches, and the items nothing kept references go with them.

Each batch is one short transaction that finds at most ``batch_size`` expired rows through an index
(responses and usage by ``created_at``, conversations by ``updated_at``), so no statement reads the
whole table or holds its locks for long. Items are checked only when the response or conversation
that listed them is purged: an item survives while a conversation lists it (the indexed
``ConversationItem.item``) or any remaining response's checkpoint names it (on PostgreSQL a GIN index
over ``history_item_ids``; SQLite indexes no JSON array, there the remaining responses are read).
See docs/operations.md, "Retention".
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connection, models, transaction
from django.db.models import Subquery
from django.utils import timezone

from conversations_app.models import Conversation, ConversationItem, Item
from gateway.core.config import Config, RetentionConfig, get_config
from gateway.core.db import run_orm
from responses_app.models import Response, ResponseEvent
from responses_app.storage import rawsql
from responses_app.storage.history_cache import history_cache
from usage_app.models import UsageRecord

log = logging.getLogger("gateway.retention")

_UNFINISHED = (Response.Status.QUEUED, Response.Status.IN_PROGRESS)
# Item ids per reference query (parameters stay far below SQLite's limit).
_CHECK_CHUNK = 500
# One purge at a time across the deployment (PostgreSQL advisory lock; an arbitrary constant).
_ADVISORY_KEY = 0x6761_7465_7079  # "gatepy"


@dataclasses.dataclass
class PurgeReport:
    """What a purge deleted (or, in a dry run, would delete: ``items`` is then ``None``, as whether
    an item goes is decided only when what lists it is deleted)."""

    responses: int = 0
    response_events: int = 0
    conversations: int = 0
    items: int | None = 0
    usage: int = 0
    batches: int = 0
    dry_run: bool = False
    skipped: bool = False  # another process was purging

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def cutoffs(retention: RetentionConfig, now: dt.datetime | None = None) -> dict[str, dt.datetime | None]:
    """Rows older than these are expired (``None``: that kind is kept forever)."""
    now = now or timezone.now()

    def cut(days: float | None) -> dt.datetime | None:
        return None if days is None else now - dt.timedelta(days=days)

    return {
        "responses": cut(retention.responses_days),
        "conversations": cut(retention.conversations_days),
        "usage": cut(retention.usage_days),
    }


def enabled(retention: RetentionConfig) -> bool:
    return any(
        days is not None
        for days in (retention.responses_days, retention.conversations_days, retention.usage_days)
    )


def purge(
    *, config: Config | None = None, dry_run: bool = False, now: dt.datetime | None = None
) -> PurgeReport:
    """Delete (or count, ``dry_run``) every expired row, batch by batch."""
    retention = (config or get_config()).retention
    limits = cutoffs(retention, now)
    report = PurgeReport(dry_run=dry_run)
    if dry_run:
        if (cutoff := limits["responses"]) is not None:
            report.responses = _expired_responses(cutoff).count()
            report.response_events = ResponseEvent.objects.filter(
                response_id__in=_expired_responses(cutoff).values("pk")
            ).count()
        if (cutoff := limits["conversations"]) is not None:
            report.conversations = Conversation.objects.filter(updated_at__lt=cutoff).count()
        if (cutoff := limits["usage"]) is not None:
            report.usage = UsageRecord.objects.filter(created_at__lt=cutoff).count()
        report.items = None
        return report
    with _one_purger() as alone:
        if not alone:
            report.skipped = True
            return report
        size, pause = retention.batch_size, retention.batch_pause_s
        if (cutoff := limits["responses"]) is not None:
            _drain(lambda: _responses_batch(cutoff, size, report), report, pause)
        if (cutoff := limits["conversations"]) is not None:
            kept_since = limits["responses"]
            _drain(lambda: _conversations_batch(cutoff, size, report, kept_since), report, pause)
        if (cutoff := limits["usage"]) is not None:
            _drain(lambda: _usage_batch(cutoff, size, report), report, pause)
    return report


def _drain(batch: Any, report: PurgeReport, pause: float) -> None:
    """Run ``batch`` (one transaction, returns how many rows it took) until it takes none."""
    while True:
        with rawsql.writing():  # SQLite: queued with the response writers, as one of them
            taken = batch()
        if not taken:
            return
        report.batches += 1
        # At least a moment: a writer waiting for SQLite's write lock gets it between two batches
        # (the lock is not fair; without a pause this loop would take it again at once).
        time.sleep(pause or 0.001)


@contextmanager
def _one_purger() -> Iterator[bool]:
    """PostgreSQL: a session advisory lock, so server processes that each run the timer do not purge
    side by side; elsewhere every purge runs (its batches are serialized with the other writers)."""
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_ADVISORY_KEY])
        taken = bool(cursor.fetchone()[0])
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [_ADVISORY_KEY])


def _expired_responses(cutoff: dt.datetime) -> models.QuerySet[Response]:
    # A response still running (a long background one) is never purged under its runner.
    return Response.objects.filter(created_at__lt=cutoff).exclude(status__in=_UNFINISHED)


def _responses_batch(cutoff: dt.datetime, size: int, report: PurgeReport) -> int:
    rows = list(
        _expired_responses(cutoff)
        .select_for_update(skip_locked=True)  # PostgreSQL: a row a writer holds waits for the next run
        .order_by("created_at")
        .values_list("id", "owner", "history_item_ids")[:size]
    )
    if not rows:
        return 0
    ids = [row[0] for row in rows]
    report.response_events += ResponseEvent.objects.filter(response_id__in=ids).delete()[0]
    # The model's on_delete=SET_NULL, done here as one indexed UPDATE (response_previous_idx).
    Response.objects.filter(previous_response_id__in=ids).update(previous_response=None)
    report.responses += delete_pks(Response, ids)
    report.items = (report.items or 0) + _delete_unreferenced_items(
        ((item_id, owner) for _, owner, history in rows for item_id in rawsql.loads(history) or ()), cutoff
    )
    transaction.on_commit(lambda: forget_checkpoints(ids))
    return len(rows)


def _conversations_batch(
    cutoff: dt.datetime, size: int, report: PurgeReport, responses_cutoff: dt.datetime | None
) -> int:
    """Up to ``size`` conversations, or fewer whose items add up to about ``size`` (at least one)."""
    candidates = (
        Conversation.objects.select_for_update(skip_locked=True)
        .filter(updated_at__lt=cutoff)
        .order_by("updated_at")
        .values_list("id", "owner", "item_count")[:size]
    )
    taken: list[tuple[str, str]] = []
    entries = 0
    for conversation_id, owner, item_count in candidates:
        if taken and entries + item_count > size:
            break
        taken.append((conversation_id, owner))
        entries += item_count
    if not taken:
        return 0
    owners = dict(taken)
    listed = list(
        ConversationItem.objects.filter(conversation_id__in=owners).values_list("conversation_id", "item_id")
    )
    ConversationItem.objects.filter(conversation_id__in=owners).delete()
    report.conversations += delete_pks(Conversation, list(owners))
    report.items = (report.items or 0) + _delete_unreferenced_items(
        ((item_id, owners[conversation_id]) for conversation_id, item_id in listed), responses_cutoff
    )
    return len(taken)


def _usage_batch(cutoff: dt.datetime, size: int, report: PurgeReport) -> int:
    oldest = UsageRecord.objects.filter(created_at__lt=cutoff).order_by("created_at").values("pk")[:size]
    deleted = UsageRecord.objects.filter(pk__in=Subquery(oldest)).delete()[0]  # one statement
    report.usage += deleted
    return deleted


def forget_checkpoints(ids: list[str]) -> None:
    """Drop deleted responses' checkpoints from this process's cache (a continuation of one is
    refused anyway: it reads the parent's row first)."""
    for response_id in ids:
        history_cache.discard(response_id)


def delete_pks(model: type[models.Model], pks: list[Any]) -> int:
    """``DELETE … WHERE pk IN (…)``: the rows that referenced these are handled by the caller, so
    Django's collector (which would load every row, JSON and all) is not needed."""
    if not pks:
        return 0
    quote = connection.ops.quote_name
    table, pk = quote(str(model._meta.db_table)), quote(str(model._meta.pk.column))
    placeholders = ", ".join(["%s"] * len(pks))
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {pk} IN ({placeholders})", pks)
        return int(cursor.rowcount)


def _delete_unreferenced_items(
    listed: Iterable[tuple[str, str]], responses_cutoff: dt.datetime | None
) -> int:
    """Delete those of ``listed`` (item id, the owner of what listed it) that no conversation lists
    and no kept response's checkpoint names (kept: created since ``responses_cutoff``, or unfinished;
    ``None``: every response); call after deleting what listed them."""
    owners: dict[str, str] = {}
    for item_id, owner in listed:
        owners.setdefault(item_id, owner)
    deleted = 0
    ids = list(owners)
    if ids and connection.vendor == "postgresql":
        _merge_pending_entries()
    for start in range(0, len(ids), _CHECK_CHUNK):
        chunk = ids[start : start + _CHECK_CHUNK]
        kept = set(ConversationItem.objects.filter(item_id__in=chunk).values_list("item_id", flat=True))
        kept |= _named_by_responses([i for i in chunk if i not in kept], responses_cutoff)
        # Items are owned per principal: only the owner's own items ever go with its rows.
        doomed = [
            item_id
            for item_id, owner in Item.objects.filter(id__in=[i for i in chunk if i not in kept]).values_list(
                "id", "owner"
            )
            if owner == owners[item_id]
        ]
        deleted += delete_pks(Item, doomed)
    return deleted


def _merge_pending_entries() -> None:
    """Merge the GIN index's pending list (entries of responses stored since the last merge) into the
    index: every probe reads that whole list otherwise, up to 4 MB (measured: 2.7 ms a probe, 185
    responses purged a second while responses were being stored). Only the index's owner may; if the
    gateway's role is not, the probes read the list (autovacuum merges it)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:  # a savepoint: a refusal ends here
            cursor.execute("SELECT gin_clean_pending_list('response_history_items_gin'::regclass)")
    except DatabaseError:
        log.debug("could not merge the GIN pending list", exc_info=True)


def _named_by_responses(item_ids: list[str], since: dt.datetime | None) -> set[str]:
    """Those of ``item_ids`` that a response kept by retention names in its ``history_item_ids``:
    one created since ``since`` (``None``: every response is kept) or still running.

    Expired responses not deleted yet are not asked: they go in a later batch of the same run, and an
    item only they list may go a moment before them."""
    if not item_ids:
        return set()
    q = connection.ops.quote_name
    table = q(Response._meta.db_table)
    unfinished = ", ".join(f"'{status}'" for status in _UNFINISHED)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One GIN probe per id (response_history_items_gin): jsonb containment, never the table.
            # The planner cannot estimate a containment whose value comes from the outer row: left to
            # itself it read the whole table for each id (171 s a batch of 500 ids, a million rows),
            # or every kept row by created_at (OFFSET 0 keeps the age out of the probe). So sequential
            # scans are off for this one statement of the batch's transaction.
            kept = "" if since is None else f"WHERE m.created_at >= %s OR m.status IN ({unfinished})"
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(
                f"SELECT c.id FROM unnest(%s::text[]) AS c(id) WHERE EXISTS (SELECT 1 FROM (SELECT "
                f"r.created_at, r.status FROM {table} r WHERE r.history_item_ids @> jsonb_build_array(c.id) "
                f"OFFSET 0) m {kept})",
                [item_ids] if since is None else [item_ids, since],
            )
            found = {row[0] for row in cursor.fetchall()}
            cursor.execute("SET LOCAL enable_seqscan = on")
            return found
        else:
            # No index over JSON array elements: read the kept responses' ids (created_at's index,
            # and the partial index of unfinished ones), or every response if all are kept.
            placeholders = ", ".join(["%s"] * len(item_ids))
            select = f"SELECT j.value FROM {table} r, json_each(r.history_item_ids) j WHERE j.value IN ({placeholders})"
            if since is None:
                cursor.execute(select, item_ids)
            else:
                cursor.execute(
                    f"{select} AND r.created_at >= %s UNION {select} AND r.status IN ({unfinished})",
                    [*item_ids, connection.ops.adapt_datetimefield_value(since), *item_ids],
                )
        return {row[0] for row in cursor.fetchall()}


# --- running it periodically --------------------------------------------------------------------


def purge_logged(*, config: Config | None = None) -> PurgeReport:
    """One periodic purge, its result logged (the Celery beat task and the in-process timer)."""
    config = config or get_config()
    if not enabled(config.retention):
        return PurgeReport()
    started = time.monotonic()
    report = purge(config=config)
    if report.skipped:
        log.info("retention purge skipped: another process is purging")
    elif report.batches:
        log.info(
            "retention purge: %d responses, %d conversations, %s items, %d usage rows in %.1f s",
            report.responses,
            report.conversations,
            report.items,
            report.usage,
            time.monotonic() - started,
        )
    return report


async def purge_forever() -> None:
    """The in-process timer of a gateway without a broker (with one, Celery beat runs the purge)."""
    config = get_config()
    if config.broker_enabled or not enabled(config.retention):
        return
    interval = config.retention.interval_s
    while True:
        try:
            await run_orm(purge_logged, config=config)
        except Exception:
            log.exception("retention purge failed; next try in %g s", interval)
        await asyncio.sleep(interval)
