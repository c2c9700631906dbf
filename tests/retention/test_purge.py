"""The retention purge: expired responses, conversations and usage rows go in bounded batches; what
is kept stays untouched, and so do the items a kept response or conversation still lists."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations_app import schemas, services
from conversations_app.models import Conversation, ConversationItem, Item
from gateway.core.ids import new_id
from gateway.data import retention
from responses_app.models import Response, ResponseEvent
from usage_app.models import UsageRecord

NOW = timezone.now()
OLD = NOW - dt.timedelta(days=100)
RECENT = NOW - dt.timedelta(days=1)


def item(owner: str = "key:1") -> Item:
    return Item.objects.create(
        id=new_id("msg"),
        owner=owner,
        type="message",
        data={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    )


def response(
    history: list[Item],
    created_at: dt.datetime,
    *,
    owner: str = "key:1",
    status: str = "completed",
    previous: Response | None = None,
    events: int = 0,
) -> Response:
    row = Response.objects.create(
        id=new_id("resp"),
        owner=owner,
        status=status,
        model="m",
        history_item_ids=[i.id for i in history],
        created_at=created_at,
        previous_response=previous,
    )
    for seq in range(events):
        ResponseEvent.objects.create(response=row, sequence_number=seq, data="{}")
    return row


def usage(created_at: dt.datetime, owner: str = "key:1") -> UsageRecord:
    return UsageRecord.objects.create(
        created_at=created_at,
        owner=owner,
        route="/v1/responses",
        kind="completions",
        status=200,
        latency_ms=5,
    )


def conversation(items: list[Item], updated_at: dt.datetime, owner: str = "key:1") -> Conversation:
    conv, _ = services.conversation_create(
        owner=owner,
        metadata={},
        items=schemas.validate_items([{"type": "item_reference", "id": i.id} for i in items], required=False)
        if items
        else [],
    )
    Conversation.objects.filter(pk=conv.pk).update(created_at=updated_at, updated_at=updated_at)
    return conv


@pytest.fixture
def keep(gateway_config: Callable[..., Any]) -> Callable[..., Any]:
    """Set the ages: ``keep(responses_days=30, …)``."""

    def apply(**days: Any) -> Any:
        return gateway_config(**{f"retention__{k}": v for k, v in days.items()})

    return apply


def exists(*rows: Any) -> list[bool]:
    return [type(row).objects.filter(pk=row.pk).exists() for row in rows]


@pytest.mark.django_db
def test_expired_responses_and_usage_go_and_the_rest_stays(keep: Callable[..., Any]) -> None:
    keep(responses_days=30, usage_days=30)
    a, b = item(), item()
    expired = response([a], OLD, events=3)
    running = response([b], OLD, status="in_progress")  # never purged under its runner
    kept = response([b], RECENT, events=2)
    old_use, new_use = usage(OLD), usage(RECENT)
    conv = conversation([], OLD)  # conversations_days unset: kept forever

    report = retention.purge()

    assert (report.responses, report.response_events, report.usage, report.conversations) == (1, 3, 1, 0)
    assert exists(expired, running, kept, old_use, new_use, conv) == [False, True, True, False, True, True]
    assert ResponseEvent.objects.filter(response=kept).count() == 2
    assert exists(a, b) == [False, True]  # a: listed by nothing kept; b: by kept responses
    assert report.items == 1


@pytest.mark.django_db
def test_items_a_kept_response_or_conversation_lists_survive(keep: Callable[..., Any]) -> None:
    keep(responses_days=30)
    root, shared, in_conv, only_old = item(), item(), item(), item()
    theirs = item(owner="key:2")  # another principal's item: never deleted with key:1's rows
    parent = response([root, shared, in_conv, only_old, theirs], OLD)
    # A continuation copies its parent's history ids: the kept child still lists the old items.
    child = response([root, shared, item()], RECENT, previous=parent)
    listing = conversation([in_conv], RECENT)

    report = retention.purge()

    assert report.responses == 1 and report.items == 1
    assert exists(root, shared, in_conv, only_old, theirs) == [True, True, True, False, True]
    child.refresh_from_db()
    assert child.previous_response_id is None  # the model's SET_NULL
    assert ConversationItem.objects.filter(conversation=listing).count() == 1


@pytest.mark.django_db
def test_a_conversation_ages_by_its_last_change(keep: Callable[..., Any]) -> None:
    keep(conversations_days=30)
    mine, shared, named = item(), item(), item()
    stale = conversation([mine, shared], OLD)
    touched = conversation([named], OLD)
    services.conversation_update(id=touched.id, owner="key:1", metadata={"k": "v"})  # changed today
    kept_response = response([shared], OLD)  # responses_days unset: every response is kept

    report = retention.purge()

    assert report.conversations == 1
    assert exists(stale, touched) == [False, True]
    assert exists(mine, shared, named) == [False, True, True]  # shared: a (kept) response lists it
    assert not ConversationItem.objects.filter(conversation_id=stale.id).exists()
    assert exists(kept_response) == [True]


@pytest.mark.django_db
def test_every_change_of_a_conversation_moves_updated_at() -> None:
    conv = conversation([], OLD)
    a, b = item(), item()

    def bumped(change: Callable[[], Any]) -> bool:
        Conversation.objects.filter(pk=conv.pk).update(updated_at=OLD)
        change()
        return Conversation.objects.get(pk=conv.pk).updated_at > RECENT

    assert bumped(lambda: services.conversation_update(id=conv.id, owner="key:1", metadata={"x": "1"}))
    refs = schemas.validate_items([{"type": "item_reference", "id": a.id}], required=False)
    assert bumped(lambda: services.conversation_items_create(id=conv.id, owner="key:1", items=refs))
    assert bumped(lambda: services.conversation_item_delete(id=conv.id, owner="key:1", item_id=a.id))
    revision = Conversation.objects.get(pk=conv.pk).revision
    assert bumped(
        lambda: services.conversation_append_items(
            conversation_id=conv.id, owner="key:1", item_ids=[b.id], expected_revision=revision
        )
    )
    fresh, _ = services.conversation_create(owner="key:1", metadata={}, items=[])
    assert fresh.updated_at > RECENT


@pytest.mark.django_db
def test_dry_run_counts_and_deletes_nothing(
    keep: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    keep(responses_days=30, conversations_days=30, usage_days=30)
    a = item()
    rows = [response([a], OLD, events=2), response([a], OLD), conversation([a], OLD), usage(OLD), usage(OLD)]
    rows += [response([item()], RECENT), usage(RECENT)]

    report = retention.purge(dry_run=True)

    assert (report.responses, report.response_events, report.conversations, report.usage) == (2, 2, 1, 2)
    assert report.items is None
    assert all(exists(*rows, a))
    call_command("purge", dry_run=True)
    out = capsys.readouterr().out
    assert "responses: would delete 2 (older than" in out and "usage rows: would delete 2" in out
    assert "conversations: would delete 1" in out
    assert all(exists(*rows, a))
    call_command("purge")
    out = capsys.readouterr().out
    assert "responses: deleted 2" in out and "usage rows: deleted 2" in out and "items: deleted 1" in out
    assert exists(*rows, a) == [False, False, False, False, False, True, True, False]


@pytest.mark.django_db
def test_purge_with_no_ages_set_keeps_everything(capsys: pytest.CaptureFixture[str]) -> None:
    old = [response([], OLD), usage(OLD), conversation([], OLD)]
    call_command("purge")
    assert "kept forever" in capsys.readouterr().out
    assert all(exists(*old))


@pytest.mark.django_db
def test_batches_are_bounded(keep: Callable[..., Any]) -> None:
    keep(responses_days=30, usage_days=30, conversations_days=30, batch_size=2)
    for _ in range(5):
        response([item()], OLD)
        usage(OLD)
    for _ in range(3):
        conversation([item()], OLD)

    with CaptureQueriesContext(connection) as queries:
        report = retention.purge()

    assert (report.responses, report.usage, report.conversations, report.items) == (5, 5, 3, 8)
    # 3 batches of responses, 3 of usage rows, 2 of conversations (each ends when one finds nothing)
    assert report.batches == 8
    sql = [q["sql"] for q in queries.captured_queries]
    usage_deletes = [s for s in sql if s.startswith("DELETE") and "usage_app_usagerecord" in s]
    assert len(usage_deletes) == 4 and all(re.search(r"LIMIT 2\b", s) for s in usage_deletes)
    picks = [s for s in sql if s.startswith("SELECT") and "responses_app_response" in s and "ORDER BY" in s]
    assert picks and all(re.search(r"LIMIT 2\b", s) for s in picks)
    assert not UsageRecord.objects.exists() and not Response.objects.exists()


@pytest.mark.django_db
def test_reference_check_probes_indexes_on_postgresql() -> None:
    """One GIN probe per id, whether every response is kept or only those since a cutoff (never the
    kept rows by created_at for each id)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no index over JSON array elements")

    def plan(since: dt.datetime | None) -> str:
        with CaptureQueriesContext(connection) as queries:
            retention._named_by_responses(["msg_a", "msg_b"], since)
        statements = [q["sql"] for q in queries.captured_queries]
        assert statements[0] == "SET LOCAL enable_seqscan = off" and statements[2].endswith("= on")
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")  # as the purge does
            cursor.execute("EXPLAIN " + statements[1])
            return "\n".join(row[0] for row in cursor.fetchall())

    assert "Bitmap Index Scan on response_history_items_gin" in plan(None)
    assert "Bitmap Index Scan on response_history_items_gin" in plan(OLD)
    assert "created_at" not in plan(OLD).partition("Bitmap Index Scan")[2]  # the age filters the probe's rows


@pytest.mark.django_db
def test_an_item_a_running_response_lists_survives(keep: Callable[..., Any]) -> None:
    keep(responses_days=30)
    listed = item()
    response([listed], OLD)
    running = response([listed], OLD, status="queued")
    assert retention.purge().responses == 1
    assert exists(listed, running) == [True, True]


@pytest.mark.django_db(transaction=True)
def test_the_in_process_timer_purges(keep: Callable[..., Any]) -> None:
    keep(responses_days=30, usage_days=30, interval_s=0.05)
    old = [response([item()], OLD), usage(OLD)]
    new = usage(RECENT)

    async def run_a_while() -> None:
        timer = asyncio.create_task(retention.purge_forever())
        for _ in range(200):
            await asyncio.sleep(0.02)
            if not await asyncio.to_thread(lambda: any(exists(*old))):
                break
        assert not timer.done()  # it keeps running
        timer.cancel()

    asyncio.run(run_a_while())
    assert exists(*old, new) == [False, False, True]


@pytest.mark.django_db(transaction=True)
def test_with_a_broker_the_timer_leaves_it_to_beat(keep: Callable[..., Any]) -> None:
    config = keep(responses_days=30, interval_s=0.01)
    from gateway.core import config as config_module

    config_module.set_config(config_module.replace(config, redis_url="redis://127.0.0.1:1/0"))
    old = response([], OLD)
    asyncio.run(asyncio.wait_for(retention.purge_forever(), 5))  # returns at once
    assert exists(old) == [True]


@pytest.mark.django_db(transaction=True)  # the task closes stale connections around it
def test_the_beat_task_purges(keep: Callable[..., Any]) -> None:
    from gateway.celery import app, purge

    keep(usage_days=30)
    assert app.conf.beat_schedule["retention-purge"]["task"] == "gateway.purge" == purge.name
    old = usage(OLD)
    result = purge.apply().get()
    assert result["usage"] == 1 and exists(old) == [False]
