"""Operations: safe migrations, the WebSocket route and its size ceiling, the database settings, and
``manage.py serve``'s workers (logs: ``tests/core/test_logging.py``; metrics: ``tests/core/test_metrics.py``)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import orjson
import pytest
import websockets
from django.core.management import call_command
from django.db import connection

from tests.servers import ROOT, GatewayProcess, LiveServer


def _postgres_server() -> str:
    """The test database's PostgreSQL server, as a URL without a database name."""
    db = connection.settings_dict
    return f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"


@pytest.mark.django_db(transaction=True)
def test_migrate_safely_applies_migrations() -> None:
    call_command("migrate_safely", verbosity=0)
    tables = connection.introspection.table_names()
    assert "conversations_app_item" in tables


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_migrate_safely_waits_for_the_advisory_lock_on_postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks are a PostgreSQL feature; SQLite runs migrations directly")
    from gateway.management.commands.migrate_safely import MIGRATION_LOCK_KEY

    url = f"{_postgres_server()}/{connection.settings_dict['NAME']}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK_KEY])
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "migrate_safely", "--verbosity", "0"],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "DATABASE_URL": url},
        )
        # Wait for the real condition: the command's session queued on our lock in pg_locks.
        waiting: list[int] = []
        deadline = time.monotonic() + 60
        while not waiting:
            assert proc.poll() is None, "migrate_safely must wait while another replica holds the lock"
            assert time.monotonic() < deadline, "migrate_safely never asked for the advisory lock"
            cursor.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid = %s AND objid = %s AND pid <> pg_backend_pid()",
                [MIGRATION_LOCK_KEY >> 32, MIGRATION_LOCK_KEY & 0xFFFFFFFF],
            )
            waiting = [row[0] for row in cursor.fetchall()]
            time.sleep(0.05)
        assert proc.poll() is None  # still waiting, behind our lock
        cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK_KEY])
    assert proc.wait(timeout=60) == 0


async def _ws_roundtrip(url: str, message: str) -> tuple[dict[str, object] | None, int | None]:
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(message)
        try:
            reply = await asyncio.wait_for(ws.recv(), 5)
        except websockets.ConnectionClosed as exc:
            return None, exc.rcvd.code if exc.rcvd else None
        try:
            await asyncio.wait_for(ws.recv(), 5)
        except websockets.ConnectionClosed as exc:
            return orjson.loads(reply), exc.rcvd.code if exc.rcvd else None
    return orjson.loads(reply), None


def test_websocket_invalid_event_gets_an_error_event(live_gateway: LiveServer) -> None:
    url = live_gateway.url.replace("http", "ws") + "/v1/responses"

    async def roundtrip() -> dict[str, object]:
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send('{"type": "response.create", "stream_id": "s1"}')
            return dict(orjson.loads(await asyncio.wait_for(ws.recv(), 5)))

    reply = asyncio.run(roundtrip())
    assert reply["type"] == "error" and reply["stream_id"] == "s1" and reply["status"] == 400


def test_websocket_message_over_ceiling_closes_1009(live_gateway: LiveServer, gateway_config) -> None:  # type: ignore[no-untyped-def]
    gateway_config(server__max_request_body_size_bytes=100)
    url = live_gateway.url.replace("http", "ws") + "/v1/responses"
    reply, code = asyncio.run(_ws_roundtrip(url, '{"type": "response.create", "x": "' + "a" * 200 + '"}'))
    assert reply is None
    assert code == 1009


def test_websocket_connections_are_counted(live_gateway: LiveServer) -> None:
    url = live_gateway.url.replace("http", "ws") + "/v1/responses"

    def gauge() -> float:
        for line in httpx.get(f"{live_gateway.url}/metrics").text.splitlines():
            if line.startswith("gateway_websocket_connections_open "):
                return float(line.split()[1])
        raise AssertionError("gauge missing")

    async def hold() -> float:
        async with websockets.connect(url):
            await asyncio.sleep(0.2)
            return await asyncio.to_thread(gauge)

    before = gauge()
    during = asyncio.run(hold())
    assert during == before + 1
    deadline = time.monotonic() + 5
    while gauge() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gauge() == before


@pytest.mark.django_db
def test_postgres_has_pool_and_statement_timeout(settings) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.skip("the connection pool and statement_timeout are PostgreSQL settings; SQLite has neither")
    from gateway.core.config import get_config

    options = settings.DATABASES["default"]["OPTIONS"]
    assert options["pool"]["max_size"] == get_config().database.pool_max_size
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == f"{get_config().database.statement_timeout_ms // 1000}s"


@pytest.mark.django_db(transaction=True)
def test_store_responses_writes_a_batch_in_one_statement() -> None:
    """Three responses and their items in one call: one statement on PostgreSQL (counted with
    Django's query log), one transaction on SQLite. A row that is no longer open (completed
    meanwhile) is left as it is and answers False; the others are stored with every item."""
    from django.db import reset_queries
    from django.test.utils import CaptureQueriesContext

    from conversations_app.models import Item
    from responses_app.models import Response
    from responses_app.storage import rawsql

    Response.objects.create(id="resp_done", owner="o", status="completed", model="m", snapshot={"a": 1})
    writes = []
    for name in ("resp_one", "resp_done", "resp_two"):
        items = [
            {"type": "message", "id": f"msg_{name}_{n}", "role": "user", "content": []} for n in range(2)
        ]
        writes.append(
            rawsql.rows(
                items=items,
                owner="o",
                response={"id": name, "owner": "o", "status": "completed", "snapshot": {"id": name}},
            )
        )
    reset_queries()
    with CaptureQueriesContext(connection) as queries:
        assert rawsql.store_responses(writes) == [True, False, True]
    if connection.vendor == "postgresql":
        assert len(queries) == 1, [q["sql"][:80] for q in queries]
    assert Response.objects.get(id="resp_done").snapshot == {"a": 1}
    assert Response.objects.get(id="resp_two").snapshot == {"id": "resp_two"}
    assert Item.objects.filter(owner="o").count() == 6
    assert Item.objects.get(id="msg_resp_one_1").data["id"] == "msg_resp_one_1"


@pytest.mark.django_db
def test_postgres_binds_on_the_server_and_prepares_repeated_statements() -> None:
    """A statement a connection runs often is prepared (psycopg's prepare_threshold), which needs
    parameters bound on the server; the ORM's and the stored-response write path's alike."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are a PostgreSQL setting")
    from conversations_app.models import Item
    from responses_app.storage import rawsql

    for n in range(7):
        list(Item.objects.filter(id__in=["item_a", "item_b"], owner="someone"))
        item = {"type": "message", "id": f"msg_prepared_{n}", "role": "user", "content": []}
        item_rows, response_row = rawsql.rows(
            items=[item],
            owner="someone",
            response={"id": f"resp_prepared_{n}", "owner": "someone", "status": "completed"},
        )
        assert rawsql.store_response(item_rows=item_rows, response_row=response_row)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any(
        'FROM "conversations_app_item"' in statement and "$1" in statement for statement in prepared
    ), prepared
    assert any('INSERT INTO "responses_app_response"' in statement for statement in prepared), prepared


def test_prepared_statements_can_be_switched_off(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`[database] prepared_statements = false` (a pooler in transaction mode): never prepared."""
    from gateway import settings as gateway_settings
    from gateway.core.config import load_config

    for value, threshold in (("true", 5), ("false", None)):
        config = load_config(
            {"DATABASE_URL": "postgres://gw@db:5432/gateway", "GATEWAY_DATABASE_PREPARED_STATEMENTS": value}
        )
        monkeypatch.setattr(gateway_settings, "CONFIG", config)
        options = gateway_settings._databases()["default"]["OPTIONS"]
        assert options["server_side_binding"] is True
        assert options["prepare_threshold"] == threshold


@pytest.mark.process
def test_workers_refuse_a_port_already_taken(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gw = GatewayProcess(
            {"GATEWAY_SERVER_DATA_DIR": str(tmp_path), "GATEWAY_SERVER_WORKERS": "2"}, port=port
        )
        try:
            assert gw.proc.wait(60) != 0
        finally:
            gw.stop()
    assert "Address already in use" in gw.output()  # uvicorn's own message


LZ4_COLUMNS = {
    "responses_app_response.request",
    "responses_app_response.snapshot",
    "responses_app_response.history_item_ids",
    "responses_app_response.agent_tree",
    "responses_app_responseevent.data",
    "conversations_app_item.data",
}


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_the_like_indexes_and_the_compression_methods_go_and_come_back_with_their_migrations() -> None:
    """``0005_no_pattern_indexes`` (both apps) drops the ``varchar_pattern_ops`` index PostgreSQL got
    beside each id, and ``0006_lz4_compression`` sets LZ4 on the large columns; migrating back to
    ``0004`` creates the indexes again and gives the columns back the server's default. In a
    database of its own."""
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL has pattern indexes and compression methods")
    import psycopg

    server = _postgres_server()
    scratch = f"test_pattern_indexes_{time.monotonic_ns()}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{scratch}"')
    try:

        def migrate(*target: str) -> None:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", *target, "--verbosity", "0"],
                cwd=ROOT,
                env={"PATH": "/usr/bin:/bin", "DATABASE_URL": f"{server}/{scratch}"},
                check=True,
                timeout=120,
            )

        def names(query: str) -> set[str]:
            with psycopg.connect(f"{server}/{scratch}") as db:
                return {row[0] for row in db.execute(query).fetchall()}

        def pattern_indexes() -> set[str]:
            return names(
                "SELECT tablename FROM pg_indexes WHERE indexdef LIKE '%varchar_pattern_ops%'"
                " AND tablename LIKE ANY (ARRAY['responses_app_%', 'conversations_app_%'])"
            )

        def lz4_columns() -> set[str]:
            return names(
                "SELECT attrelid::regclass::text || '.' || attname FROM pg_attribute"
                " WHERE attcompression = 'l' AND attnum > 0"
            )

        migrate()
        assert pattern_indexes() == set()
        assert lz4_columns() == LZ4_COLUMNS
        migrate("responses_app", "0004")
        migrate("conversations_app", "0004")
        assert lz4_columns() == set()
        assert pattern_indexes() == {
            "responses_app_response",
            "responses_app_responseevent",
            "conversations_app_item",
            "conversations_app_conversation",
            "conversations_app_conversationitem",
        }
        migrate()
        assert pattern_indexes() == set()
        assert lz4_columns() == LZ4_COLUMNS
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
