"""The write path of a stored response: its final row and items, and a stream's ``in_progress`` row.

Both go through :data:`final_writes`, their group commit; a response with more to write (its
conversation, a background response's terminal event) runs in its own transaction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from conversations_app import services as conversation_services
from responses_app.engine.domain import Prepared, strip_credentials
from responses_app.models import Response, ResponseEvent
from responses_app.storage import rawsql
from responses_app.storage.group_commit import GroupWriter
from responses_app.storage.history_cache import history_cache
from usage_app import ledger, writer
from usage_app.ledger import UsageEntry

log = logging.getLogger("responses.storage")


def lease_until(lease_s: float) -> Any:
    """When a lease taken now for ``lease_s`` seconds expires."""
    return timezone.now() + datetime.timedelta(seconds=lease_s)


@dataclass(frozen=True)
class Outcome:
    """How a response ended: what :func:`response_store_final` stores with its checkpoint."""

    status: str
    snapshot: dict[str, Any] | None  # None: a history-only record (a /compact checkpoint)
    output_items: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    # A background response's terminal event (sequence number, JSON), stored with it.
    terminal_event: tuple[int, bytes] | None = None
    # The history a continuation starts from when it is not history + input + output: a response
    # that compacted (responses_app.features.compaction) continues from its window.
    window: list[dict[str, Any]] | None = None
    agent_tree: dict[str, Any] | None = None  # a multi-agent response's tree snapshot
    # The usage-ledger rows of the response's upstream calls, written in the same transaction
    # (queued for the batch writer instead when the response is not stored: cancelled meanwhile).
    usage_entries: list[UsageEntry] = dataclasses.field(default_factory=list)


@dataclass
class FinalWrite:
    """A finished response to store (:func:`response_store_final`)."""

    prepared: Prepared
    outcome: Outcome


@dataclass
class InProgressWrite:
    """The ``in_progress`` row of a stored stream (:func:`response_create_in_progress`)."""

    prepared: Prepared
    snapshot: dict[str, Any]
    lease_owner: str
    lease_s: float


def response_store_rows(writes: list[FinalWrite | InProgressWrite]) -> list[bool]:
    """Store ``writes`` that touch nothing but their items and row, all in one statement
    (:func:`rawsql.store_responses`): a batch of :data:`final_writes`. One answer per write (False:
    a finished response cancelled meanwhile); a stored final write's checkpoint is cached once
    committed."""
    built = [
        _final_rows(write.prepared, write.outcome)
        if isinstance(write, FinalWrite)
        else _in_progress_rows(write)
        for write in writes
    ]
    stored = rawsql.store_responses(built, [_usage_rows(write) for write in writes])
    finals = [(write, ok) for write, ok in zip(writes, stored, strict=True) if isinstance(write, FinalWrite)]
    _cache_on_commit([write for write, ok in finals if ok])
    _queue_usage_on_commit([write for write, ok in finals if not ok])
    return stored


# The group commit of the stored-response writes: a plain finished response and a stream's
# ``in_progress`` row are combined into one statement with the others of their batch (put); a
# response with more to write (its conversation, a background response's terminal event) runs its
# own function in the batch's transaction (run). ``store_final`` chooses.
final_writes = GroupWriter(rawsql.writing, combine=response_store_rows)


async def store_final(prepared: Prepared, outcome: Outcome) -> bool:
    """Store a finished response through :data:`final_writes` (from async code)."""
    if _writes_alone(prepared, outcome):
        return await final_writes.run(response_store_final, prepared=prepared, outcome=outcome)
    stored: bool = await final_writes.put(FinalWrite(prepared, outcome))
    return stored


def store_in_progress(
    prepared: Prepared, snapshot: dict[str, Any], lease_owner: str, lease_s: float
) -> asyncio.Future[Any]:
    """Queue a stored stream's ``in_progress`` row on :data:`final_writes` (from the event loop): the
    future of its write, which :func:`withdraw_in_progress` may take back until a batch takes it."""
    return final_writes.submit(InProgressWrite(prepared, snapshot, lease_owner, lease_s))


def withdraw_in_progress(write: asyncio.Future[Any]) -> bool:
    """Take back an ``in_progress`` row that no batch has taken yet (its final row supersedes it)."""
    return final_writes.withdraw(write)


def _writes_alone(p: Prepared, outcome: Outcome) -> bool:
    """Whether storing this response writes more than its items and row."""
    return bool(p.conversation_id) or (p.background and outcome.terminal_event is not None)


def _final_rows(p: Prepared, outcome: Outcome) -> tuple[list[Any], Any]:
    return rawsql.rows(
        items=[*p.items_to_insert, *outcome.output_items],
        owner=p.owner,
        response=_response_values(p, outcome),
    )


def _usage_rows(write: FinalWrite | InProgressWrite) -> list[Any]:
    """The ledger rows a write stores with its response (an ``in_progress`` row has none yet)."""
    if isinstance(write, InProgressWrite) or not write.outcome.usage_entries:
        return []
    entries = write.outcome.usage_entries
    try:
        return rawsql.usage_rows(ledger.rows(entries))
    except Exception:  # never the reason a response is not stored: the batch writer tries them
        log.exception("usage ledger: response %s's rows left to the batch writer", write.prepared.response_id)
        transaction.on_commit(lambda: writer_queue(entries))
        return []


def _queue_usage_on_commit(writes: list[FinalWrite]) -> None:
    """The ledger rows of responses a batch did not store (cancelled meanwhile) go to the batch
    writer once it commits (a rolled-back batch is written again, and decides again)."""
    entries = [entry for write in writes for entry in write.outcome.usage_entries]
    if entries:
        transaction.on_commit(lambda: writer_queue(entries))


def writer_queue(entries: list[UsageEntry]) -> None:
    for entry in entries:
        writer.queue(entry)


def _cache_on_commit(writes: list[FinalWrite]) -> None:
    """Cache the checkpoints of stored ``writes`` once committed (a group commit may roll the batch
    back and write it again): one callback for the batch."""

    def cache() -> None:
        for write in writes:
            history_cache.put(
                write.prepared.response_id, write.prepared.owner, _window(write.prepared, write.outcome)
            )

    if writes:
        transaction.on_commit(cache)


def response_store_final(*, prepared: Prepared, outcome: Outcome) -> bool:
    """Store a finished response: its new items once and its row with the checkpoint, in one
    transaction (with the terminal event of a background response, and the append to its
    conversation). False when the response was cancelled meanwhile (its row stays as it is).

    Every finished response takes this path (:func:`rawsql.store_responses`); the checkpoint is
    then cached for a continuation on this process.
    """
    p = prepared
    if not _writes_alone(p, outcome):
        return response_store_rows([FinalWrite(p, outcome)])[0]
    terminal_event = outcome.terminal_event if p.background else None
    rows = _final_rows(p, outcome)
    usage = _usage_rows(FinalWrite(p, outcome))
    with rawsql.writing():
        stored = rawsql.store_responses([rows], [usage])[0]
        if not stored:
            _queue_usage_on_commit([FinalWrite(p, outcome)])
        if stored and terminal_event is not None:
            ResponseEvent.objects.create(
                response_id=p.response_id,
                sequence_number=terminal_event[0],
                data=terminal_event[1].decode(),
            )
        if stored and p.conversation_id:
            conversation_services.conversation_append_items(
                conversation_id=p.conversation_id,
                owner=p.owner,
                item_ids=[item["id"] for item in (*p.new_items, *outcome.output_items)],
                expected_revision=p.conversation_revision,
            )
    if stored:
        _cache_on_commit([FinalWrite(p, outcome)])
    return stored


def _window(p: Prepared, outcome: Outcome) -> list[dict[str, Any]]:
    if outcome.window is not None:
        return outcome.window
    return [*p.history, *p.new_items, *outcome.output_items]


def response_compaction_store(
    *,
    prepared: Prepared,
    retained: list[dict[str, Any]],
    item: dict[str, Any],
    kept: list[dict[str, Any]],
    usage: dict[str, Any],
    usage_entries: list[UsageEntry],
) -> None:
    """Store a ``POST /v1/responses/compact`` answer as a checkpoint (the retained user messages,
    the compaction item, then ``kept``: a multi-agent chain's subagent items, with its agent tree)
    that ``previous_response_id`` can name. The retained messages that were stored already are
    referenced, not copied; nothing stored before is changed.

    The record is history only (no snapshot): ``GET /v1/responses/{id}`` answers it 409, as the
    spec says of records made through history-only APIs; the compaction object is not a response.
    """
    new_ids = {i["id"] for i in prepared.items_to_insert}
    window = dataclasses.replace(
        prepared,
        history=[],
        new_items=retained,
        items_to_insert=[message for message in retained if message["id"] in new_ids],
    )
    outcome = Outcome(
        "completed",
        None,
        [item],
        usage,
        window=[*retained, item, *kept],
        agent_tree=prepared.agent_tree,
        usage_entries=usage_entries,
    )
    response_store_final(prepared=window, outcome=outcome)


def _response_values(p: Prepared, outcome: Outcome) -> dict[str, Any]:
    """The response row's values (by attribute name); the end of the response decides the
    :data:`rawsql.FINAL_COLUMNS`, which are all a background response's placeholder takes."""
    return {
        "id": p.response_id,
        "owner": p.owner,
        "model": p.request.model,
        "background": p.background,
        "previous_response_id": p.previous_response_id,
        "conversation_id": p.conversation_id or "",
        "lineage": p.lineage,
        "request": strip_credentials(p.raw),
        "status": outcome.status,
        "snapshot": outcome.snapshot,
        "usage": outcome.usage,
        "error": outcome.error,
        "agent_tree": outcome.agent_tree,
        "history_item_ids": [item["id"] for item in _window(p, outcome)],
        "input_item_count": _input_count(p, outcome),
        "completed_at": timezone.now(),
    }


def _input_count(p: Prepared, outcome: Outcome) -> int:
    """How many leading checkpoint items are input (the rest is output): for a window, the items
    before the first of this response's output items in it."""
    if outcome.window is None:
        return len(p.history) + len(p.new_items)
    produced = {item["id"] for item in outcome.output_items}
    return next((i for i, item in enumerate(outcome.window) if item["id"] in produced), len(outcome.window))


def response_create_in_progress(
    *, prepared: Prepared, snapshot: dict[str, Any], lease_owner: str, lease_s: float
) -> None:
    """The row of a stored response whose id is announced before it ends (SSE, WebSocket): written
    ``in_progress`` under ``lease_owner``'s lease before ``response.created``, so the sweep fails it
    if its process dies (docs/operations.md). :func:`response_store_final` finishes it; until then
    it references no item (its items are stored with it at the end)."""
    response_store_rows([InProgressWrite(prepared, snapshot, lease_owner, lease_s)])


def _in_progress_rows(write: InProgressWrite) -> tuple[list[Any], Any]:
    values = _response_values(write.prepared, Outcome(Response.Status.IN_PROGRESS.value, write.snapshot, []))
    values.update(
        history_item_ids=[],
        input_item_count=0,
        completed_at=None,
        lease_owner=write.lease_owner,
        lease_expires_at=lease_until(write.lease_s),
    )
    return rawsql.rows(items=[], owner=write.prepared.owner, response=values)
