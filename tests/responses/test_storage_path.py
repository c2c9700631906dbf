"""The one storage path of a finished response: it waits for a busy database instead of failing,
the admin deletes through the service (the cached checkpoint goes with it), and a failure to store
ends honestly (an error for the client, ``failed`` in the database)."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest
from django.db import connection
from django.test import Client

from conversations_app.models import Conversation, ConversationItem, Item
from responses_app.models import Response, ResponseEvent
from responses_app.storage.history_cache import history_cache
from tests.responses.conftest import Gateway, sse_events
from tests.responses.scripts import text

HOLD_S = 1.0


class _FinalWrites:
    """Where the finished responses' writes are in ``storage.writes.final_writes``: ``entered`` counts
    the final rows its batches have begun to write (a batch blocked on a lock included), ``waiting``
    those queued behind. Waited on instead of a pause that hopes they got there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from responses_app.storage.writes import FinalWrite, final_writes

        self.writer = final_writes
        self.batches: list[int] = []  # the number of final rows of each statement
        combine = self.writer.combine
        assert combine is not None

        def counting(batch: list[Any]) -> list[Any]:
            self.batches.append(sum(isinstance(w, FinalWrite) for w in batch))
            return combine(batch)

        monkeypatch.setattr(self.writer, "combine", counting)
        self.final = FinalWrite

    @property
    def waiting(self) -> int:
        return sum(isinstance(write.value, self.final) for write in list(self.writer.waiting))

    def wait_until(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + 10
        while not condition(self):
            assert time.monotonic() < deadline, f"{what}: {self.batches}, {self.waiting} waiting"
            time.sleep(0.005)


@pytest.fixture
def wire() -> str:
    return "responses"


@contextmanager
def _write_lock_held_by_another_connection() -> Iterator[None]:
    """Another connection takes the database's write lock on the responses table and keeps it."""
    settings = connection.settings_dict
    table = Response._meta.db_table
    if connection.vendor == "sqlite":
        other: Any = sqlite3.connect(settings["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
    else:
        import psycopg

        other = psycopg.connect(
            host=settings["HOST"] or "127.0.0.1",
            port=settings["PORT"] or 5432,
            user=settings["USER"] or "postgres",
            password=settings["PASSWORD"] or None,
            dbname=settings["NAME"],
        )
        other.execute(f'LOCK TABLE "{table}" IN EXCLUSIVE MODE')
    try:
        yield
    finally:
        if connection.vendor == "sqlite":
            other.execute("COMMIT")
        else:
            other.commit()
        other.close()


def test_a_held_write_lock_makes_the_store_wait_not_fail(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = _FinalWrites(monkeypatch)
    gw.script(text("patient"))
    gw.script(text("streamed"))
    answers: dict[str, Any] = {}

    def post_json() -> None:
        answers["json"] = gw.post({"model": "m", "input": "wait for it"})

    def post_sse() -> None:
        answers["sse"] = httpx.post(
            f"{gw.url}/v1/responses", json={"model": "m", "input": "and this", "stream": True}, timeout=30
        )

    with _write_lock_held_by_another_connection():
        threads = [threading.Thread(target=post_json), threading.Thread(target=post_sse)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        # Both generated, both final rows at the writer (one batch blocked on the lock, or behind a
        # blocked one); then the lock stays held a while longer: a store waits, it does not fail.
        writes.wait_until(lambda w: sum(w.batches) + w.waiting == 2, "both stores at the writer")
        time.sleep(HOLD_S)
        assert not answers
    for thread in threads:
        thread.join(30)
    assert time.monotonic() - started >= HOLD_S
    assert answers["json"].status_code == 200, answers["json"].text
    events = sse_events(answers["sse"])
    assert events[-1]["type"] == "response.completed"
    for response_id in (answers["json"].json()["id"], events[-1]["response"]["id"]):
        assert Response.objects.get(id=response_id).status == "completed"


def test_sqlite_writers_queue_on_the_writers_lock_file(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every server process's SQLite writers queue on one advisory file lock (woken by the kernel),
    not in SQLite's busy handler: a write waits while another holder has it, then completes."""
    if connection.vendor != "sqlite":
        pytest.skip("the writers' lock file is SQLite's")
    writes = _FinalWrites(monkeypatch)
    gw.script(text("queued"))
    answers: dict[str, Any] = {}
    fd = os.open(f"{connection.settings_dict['NAME']}.writers.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as another server process's writer would hold it
        thread = threading.Thread(
            target=lambda: answers.setdefault("json", gw.post({"model": "m", "input": "x"}))
        )
        thread.start()
        writes.wait_until(lambda w: w.batches == [1], "the store at the writer")  # generated
        time.sleep(HOLD_S)  # the lock held a while longer: the store waits for it
        assert not answers
        fcntl.flock(fd, fcntl.LOCK_UN)
        thread.join(30)
    finally:
        os.close(fd)
    assert answers["json"].status_code == 200, answers["json"].text
    assert Response.objects.get(id=answers["json"].json()["id"]).status == "completed"


def _admin() -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def _turn(gw: Gateway, previous: str | None = None) -> httpx.Response:
    gw.script(text("ok"))
    body: dict[str, Any] = {"model": "m", "input": "go on"}
    if previous is not None:
        body["previous_response_id"] = previous
    return gw.post(body)


def test_the_admin_deletes_through_the_service(gw: Gateway) -> None:
    admin = _admin()
    first, second = _turn(gw).json()["id"], _turn(gw).json()["id"]
    assert first in history_cache and second in history_cache
    # One response from its delete page, one with the bulk action: both drop the cached checkpoint.
    r = admin.post(f"/admin/responses_app/response/{first}/delete/", {"post": "yes"})
    assert r.status_code == 302
    r = admin.post(
        "/admin/responses_app/response/",
        {"action": "delete_selected", "_selected_action": [second], "post": "yes"},
    )
    assert r.status_code == 302
    for response_id in (first, second):
        assert response_id not in history_cache
        assert not Response.objects.filter(id=response_id).exists()
        refused = _turn(gw, response_id)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "previous_response_not_found"


def test_the_admin_cannot_delete_or_change_items(gw: Gateway) -> None:
    admin = _admin()
    answer = _turn(gw).json()
    item_id = answer["output"][0]["id"]
    assert admin.get(f"/admin/conversations_app/item/{item_id}/delete/").status_code == 403
    assert admin.post(f"/admin/conversations_app/item/{item_id}/delete/", {"post": "yes"}).status_code == 403
    page = admin.get("/admin/conversations_app/item/").content.decode()
    assert "delete_selected" not in page
    assert Item.objects.filter(id=item_id).exists()
    assert answer["id"] in history_cache


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL refuses \\u0000 in jsonb")
@pytest.mark.parametrize("stream", [False, True])
def test_a_store_that_fails_after_generation_ends_failed(gw: Gateway, stream: bool) -> None:
    """PostgreSQL refuses the generated text (``\\u0000`` in jsonb) after the model answered: the
    client gets a 500 or an error event, and the stored row says ``failed``."""
    gw.script(text("bad \u0000 byte"))
    body = {"model": "m", "input": "hi"}
    if stream:
        events = sse_events(httpx.post(f"{gw.url}/v1/responses", json={**body, "stream": True}, timeout=30))
        assert events[-1]["type"] == "error"
        assert events[-1]["code"] == "storage_error"
        assert "response.completed" not in [e["type"] for e in events]
        response_id = events[0]["response"]["id"]
    else:
        r = gw.post(body)
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "storage_error"
        response_id = Response.objects.get().id
    stored = Response.objects.get(id=response_id)
    assert stored.status == "failed"
    assert stored.snapshot["status"] == "failed"
    assert stored.snapshot["output"] == []
    assert stored.error["message"].startswith("The response could not be stored")
    got = httpx.get(f"{gw.url}/v1/responses/{response_id}").json()
    assert got["status"] == "failed"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL refuses \\u0000 in jsonb")
def test_one_bad_response_in_a_group_commit_fails_alone(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seven stored responses wait for the write lock; six of them (one with text PostgreSQL
    refuses) are then written as one batch (one statement). The batch fails, its members are
    written again one by one: the six good ones are stored completed, the bad one alone ends failed (500)."""
    writes = _FinalWrites(monkeypatch)
    gw.script(text("first"))
    for n in range(5):
        gw.script(text(f"good {n}"))
    gw.script(text("bad \u0000 byte"))
    answers: list[httpx.Response] = []

    def post() -> None:
        answers.append(gw.post({"model": "m", "input": "hi"}))

    with _write_lock_held_by_another_connection():
        first = threading.Thread(target=post)
        first.start()
        # Its write waits for the lock and holds the writer: the others queue behind it.
        writes.wait_until(lambda w: w.batches == [1], "the first store blocked on the lock")
        rest = [threading.Thread(target=post) for _ in range(6)]
        for thread in rest:
            thread.start()
        writes.wait_until(lambda w: w.waiting == 6, "six stores queued behind it")
        assert not answers
    for thread in [first, *rest]:
        thread.join(30)
    # The first alone; the six tried together once (one statement), then one by one (and the bad
    # one's ``failed`` row after them).
    batches = writes.batches
    assert batches[:2] == [1, 6] and batches[2:] == [1] * 7, batches
    assert sorted(r.status_code for r in answers) == [200] * 6 + [500]
    bad = next(r for r in answers if r.status_code == 500)
    assert bad.json()["error"]["code"] == "storage_error"
    stored = sorted(Response.objects.values_list("status", flat=True))
    assert stored == ["completed"] * 6 + ["failed"]
    texts = {r.json()["output"][0]["content"][0]["text"] for r in answers if r.status_code == 200}
    assert texts == {"first", *(f"good {n}" for n in range(5))}


def test_the_admin_lists_filters_and_searches_responses(gw: Gateway) -> None:
    """Every filter, the search, the date drill-down and the detail page of the Responses admin
    answer with the right rows (on PostgreSQL their parameters are bound on the server)."""
    admin = _admin()
    first = _turn(gw).json()
    second = _turn(gw, first["id"]).json()
    page = "/admin/responses_app/response/"
    shown = {
        "all": {},
        "status": {"status__exact": "completed"},
        "model": {"model": "m"},
        "owner": {"owner": Response.objects.get(id=first["id"]).owner},
        "background": {"background__exact": "0"},
        "search child": {"q": first["id"]},  # matches the first by id, the second by its parent
        "year": {"created_at__year": str(Response.objects.get(id=first["id"]).created_at.year)},
    }
    for name, query in shown.items():
        r = admin.get(page, query)
        assert r.status_code == 200, name
        body = r.content.decode()
        assert first["id"] in body and second["id"] in body, name
    for name, query in {"status": {"status__exact": "failed"}, "model": {"model": "other"}}.items():
        body = admin.get(page, query).content.decode()
        assert first["id"] not in body and second["id"] not in body, name
    alone = admin.get(page, {"q": second["id"]}).content.decode()
    assert second["id"] in alone and f"{first['id']}/change/" not in alone
    detail = admin.get(f"{page}{second['id']}/change/")
    assert detail.status_code == 200 and first["id"] in detail.content.decode()


def _indexes(model: Any) -> dict[tuple[str, ...], str]:
    """The non-unique indexes of ``model``'s table: their columns, and their definition."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        else:
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s", [table]
            )
        definitions = dict(cursor.fetchall())
    return {
        tuple(spec["columns"]): definitions.get(name) or ""
        for name, spec in constraints.items()
        if spec["index"] and not spec["unique"] and not spec["primary_key"]
    }


@pytest.mark.django_db
def test_a_stored_response_writes_only_the_indexes_a_query_needs() -> None:
    """Every stored response writes every index of its row and items: reads go by id (and owner)
    on the primary key; created_at orders the admin; previous_response_id unlinks a deleted
    response's successors; only unfinished rows are in the leases' index (the sweep). No ``LIKE``
    index beside an id on PostgreSQL (nothing looks ids up by prefix)."""
    responses = _indexes(Response)
    expected = {("created_at",), ("previous_response_id",), ("lease_expires_at",)}
    if connection.vendor == "postgresql":
        expected.add(("history_item_ids",))  # GIN: the retention purge asks which response lists an item
    assert set(responses) == expected, responses
    condition = responses[("lease_expires_at",)].replace('"', "").partition(" WHERE ")[2]
    assert "status" in condition and "'queued'" in condition and "'in_progress'" in condition, condition
    assert not any(f"'{done}'" in condition for done in ("completed", "incomplete", "failed", "cancelled"))
    assert set(_indexes(Item)) == {("created_at",)}
    for model in (Conversation, ConversationItem, ResponseEvent):
        assert not any("pattern_ops" in definition for definition in _indexes(model).values()), model


def test_a_response_with_more_items_than_one_insert_holds_is_stored_whole(gw: Gateway) -> None:
    """Items are inserted 150 to a statement: 320 input items take three statements (SQLite) or
    the statement sequence without the single-statement CTE (PostgreSQL); every one is stored and
    referenced by the checkpoint, in order."""
    gw.script(text("ok"))
    messages = [{"type": "message", "role": "user", "content": f"line {i}"} for i in range(320)]
    answer = gw.post({"model": "m", "input": messages})
    assert answer.status_code == 200, answer.text
    row = Response.objects.get(id=answer.json()["id"])
    assert row.status == "completed" and row.input_item_count == 320
    assert len(row.history_item_ids) == 321
    stored = dict(Item.objects.filter(id__in=row.history_item_ids).values_list("id", "data"))
    assert [stored[i]["content"][0]["text"] for i in row.history_item_ids[:320]] == [
        f"line {i}" for i in range(320)
    ]
    assert stored[row.history_item_ids[-1]]["type"] == "message"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="only PostgreSQL compresses stored values")
def test_a_large_stored_response_and_its_items_are_compressed_with_lz4(gw: Gateway) -> None:
    """``0006_lz4_compression``: a response row past PostgreSQL's 2 KB threshold (its request and
    snapshot hold a long input and answer) is written LZ4-compressed, its items too, and reads back
    whole."""
    prose = " ".join(f"word{i}" for i in range(800))
    gw.script(text(prose))
    answer = gw.post({"model": "m", "input": prose})
    assert answer.status_code == 200, answer.text
    response_id = answer.json()["id"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_compression(request), pg_column_compression(snapshot), history_item_ids"
            " FROM responses_app_response WHERE id = %s",
            [response_id],
        )
        request_method, snapshot_method, item_ids = cursor.fetchone()
        cursor.execute(
            "SELECT pg_column_compression(data) FROM conversations_app_item WHERE id = ANY(%s)",
            [list(orjson.loads(item_ids) if isinstance(item_ids, str) else item_ids)],
        )
        item_methods = [row[0] for row in cursor.fetchall()]
    assert (request_method, snapshot_method) == ("lz4", "lz4")
    assert item_methods == ["lz4", "lz4"]
    assert gw.client.responses.retrieve(response_id).output_text == prose


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="only PostgreSQL has compression methods")
def test_a_compression_method_the_server_does_not_support_leaves_the_migration_going(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server built without LZ4 refuses ``SET COMPRESSION lz4`` as a feature it does not support
    (SQLSTATE 0A000): the migration keeps the default method and goes on, in a savepoint (the
    refusal does not abort the migration's transaction). Shown with a column whose type PostgreSQL
    never compresses, which the server refuses with that same SQLSTATE."""
    from django.db import transaction
    from django.db.migrations.state import StateApps

    from gateway.core.schema import compressed_with_lz4

    operation = compressed_with_lz4(
        ("responses_app_response", "input_item_count"), ("responses_app_response", "snapshot")
    )
    with transaction.atomic(), connection.schema_editor(atomic=False) as editor:
        operation.code(StateApps([], {}), editor)
        with connection.cursor() as cursor:  # the transaction still works
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    assert "responses_app_response.input_item_count kept its compression method" in caplog.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="only PostgreSQL has compression methods")
def test_any_other_failure_of_the_compression_migration_fails_it() -> None:
    """Only a server's refusal of the method is let go: another failure (here a column that does not
    exist; in production a lock or statement timeout) fails the migration, so it is not recorded as
    applied with the columns left as they were."""
    from django.db import DatabaseError
    from django.db.migrations.state import StateApps

    from gateway.core.schema import compressed_with_lz4

    operation = compressed_with_lz4(("responses_app_response", "no_such_column"))
    with pytest.raises(DatabaseError, match="no_such_column"), connection.schema_editor() as editor:
        operation.code(StateApps([], {}), editor)
