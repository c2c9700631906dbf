"""The two statements on the stored-response hot path, written as plain SQL.

A continuation reads its parent's row and every stored response ends with one insert of its new
items and its row. Through the ORM those cost more than the database work itself (query
compilation, model instances, stdlib ``json`` for every JSON column); here the SQL is built once
from the models' metadata and the JSON columns are written with orjson. The rows are exactly what
the ORM would write (same columns, defaults and datetime adaptation); everything else (background
responses, conversations, reads of snapshots) stays on the ORM.

On PostgreSQL the items and the response go in one statement (a data-modifying CTE: atomic by
itself, one round trip); on SQLite in one short transaction.

On a SQLite file database both may also run on the event loop itself (:func:`loop_reads_available`):
the statements take tens of microseconds, a worker-thread round trip costs several times that. The
event loop's thread has its own connection that never waits: in WAL mode a reader never waits for
a writer, and the insert only runs when ``BEGIN IMMEDIATE`` gets the write lock at once. A busy or
locked database sends the work to a worker thread instead (:class:`LoopReadUnavailable`, or False
from :func:`insert_response_on_loop`), which waits for the lock as before. The loop's connection
never checkpoints the WAL (that fsyncs); a worker thread runs a passive checkpoint every
``_CHECKPOINT_EVERY`` loop commits, and every other connection keeps SQLite's automatic ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from functools import cache
from typing import Any

import orjson
from django.db import connection, transaction
from django.utils import timezone

from conversations_app.models import Item
from responses_app.models import Response

log = logging.getLogger("responses.rawsql")

_OPTS = orjson.OPT_NON_STR_KEYS
# Item rows per INSERT statement (5 parameters each: within SQLite's 999-parameter limit).
_BATCH = 150


def dumps(value: Any) -> str | None:
    """A JSON column's value (``None`` stays SQL NULL, as ``JSONField(null=True)`` stores it)."""
    return None if value is None else orjson.dumps(value, option=_OPTS).decode()


def loads(value: Any) -> Any:
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return orjson.loads(value)
    return value  # a driver that already decoded it


@cache
def _sql(vendor: str) -> dict[str, Any]:
    """The statements for one database backend, built once from the models' metadata."""
    q = connection.ops.quote_name
    responses, items = q(Response._meta.db_table), q(Item._meta.db_table)
    columns = tuple(str(field.column) for field in Response._meta.concrete_fields)
    where = "WHERE id = %s AND owner = %s"
    return {
        "status": f"SELECT status FROM {responses} {where}",
        "status_ids": f"SELECT status, history_item_ids FROM {responses} {where}",
        "items": f"INSERT INTO {items} (id, owner, {q('type')}, data, created_at) VALUES ",
        "columns": columns,
        "response": (
            f"INSERT INTO {responses} ({', '.join(q(c) for c in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))})"
        ),
    }


class LoopReadUnavailable(Exception):
    """The event loop's read could not run (SQLite busy or locked): do it on a worker thread."""


# A passive WAL checkpoint on a worker thread after this many commits from the event loop.
_CHECKPOINT_EVERY = 200


_loop_local = threading.local()


_database: tuple[str, str | None] | None = None


def _db_info() -> tuple[str, str | None]:
    """``(vendor, SQLite file or None)`` of the default database, looked up once per process
    (``connection``'s thread-local proxy costs more than the statements on this path)."""
    global _database
    if _database is None:
        in_memory = getattr(connection, "is_in_memory_db", None)
        sqlite_file = None
        if connection.vendor == "sqlite" and in_memory is not None and not in_memory():
            sqlite_file = str(connection.settings_dict["NAME"])
        _database = (connection.vendor, sqlite_file)
    return _database


def loop_reads_available() -> bool:
    """True when the parent check and the insert can run on the event loop: a SQLite file."""
    return _db_info()[1] is not None


def _on_event_loop() -> bool:
    return asyncio._get_running_loop() is not None


def _loop_connection() -> sqlite3.Connection:
    name = _db_info()[1]
    assert name is not None
    held = getattr(_loop_local, "connection", None)
    if held is not None and held[0] == name:
        return held[1]  # type: ignore[no-any-return]
    conn = sqlite3.connect(name, timeout=0, isolation_level=None, check_same_thread=True)
    conn.execute("PRAGMA synchronous = NORMAL")  # as Django's connections (WAL: crash-safe)
    # Checkpoints (which fsync) never run on the event loop: worker threads run them.
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    _loop_local.connection = (name, conn)
    return conn


def parent_row(response_id: str, owner: str, *, with_item_ids: bool) -> tuple[str, list[str] | None] | None:
    """``(status, history_item_ids or None)`` of the owner's response, or None when there is none.

    Called on the event loop (only when :func:`loop_reads_available`), it reads through the loop's
    own SQLite connection; :class:`LoopReadUnavailable` when SQLite cannot answer at once.
    """
    sql = _sql(_db_info()[0])["status_ids" if with_item_ids else "status"]
    if _on_event_loop():
        try:
            found = _loop_connection().execute(sql.replace("%s", "?"), (response_id, owner))
            row = found.fetchone()
            found.close()
        except sqlite3.OperationalError as exc:
            raise LoopReadUnavailable(str(exc)) from None
    else:
        with connection.cursor() as cursor:
            cursor.execute(sql, [response_id, owner])
            row = cursor.fetchone()
    if row is None:
        return None
    return row[0], (loads(row[1]) if with_item_ids else None)


def _insert_params(
    items: list[tuple[str, str, str, str]], response: dict[str, Any]
) -> tuple[list[list[Any]], list[Any]]:
    ops = connection.ops
    now = timezone.now()
    created = ops.adapt_datetimefield_value(now)
    item_params: list[Any] = []
    for item in items:
        item_params.extend(item)
        item_params.append(created)
    values = dict(response)
    values.setdefault("created_at", now)
    for name in ("created_at", "completed_at"):
        if values.get(name) is not None:
            values[name] = ops.adapt_datetimefield_value(values[name])
    batches = [item_params[i : i + _BATCH * 5] for i in range(0, len(item_params), _BATCH * 5)]
    return batches, [values[column] for column in _sql(_db_info()[0])["columns"]]


def _item_rows_sql(batch: list[Any]) -> str:
    rows = ", ".join(["(%s, %s, %s, %s, %s)"] * (len(batch) // 5))
    return f"{_sql(_db_info()[0])['items']}{rows} ON CONFLICT DO NOTHING"


def insert_response(*, items: list[tuple[str, str, str, str]], response: dict[str, Any]) -> None:
    """Insert ``items`` (id, owner, type, data JSON; existing ids are left alone) and the response
    row ``response`` (column → value, JSON columns already serialized) atomically."""
    batches, response_params = _insert_params(items, response)
    response_sql = _sql(_db_info()[0])["response"]
    with connection.cursor() as cursor:
        if _db_info()[0] == "postgresql" and len(batches) <= 1:
            if batches:
                sql = f"WITH new_items AS ({_item_rows_sql(batches[0])}) {response_sql}"
                cursor.execute(sql, [*batches[0], *response_params])
            else:
                cursor.execute(response_sql, response_params)
            return
        with transaction.atomic():
            for batch in batches:
                cursor.execute(_item_rows_sql(batch), batch)
            cursor.execute(response_sql, response_params)


def insert_response_on_loop(*, items: list[tuple[str, str, str, str]], response: dict[str, Any]) -> bool:
    """:func:`insert_response` on the event loop (only when :func:`loop_reads_available`), when
    SQLite grants the write lock at once; False (nothing written) when it does not."""
    batches, response_params = _insert_params(items, response)
    try:
        conn = _loop_connection()
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return False  # another writer holds the lock: a worker thread waits for it instead
    try:
        for batch in batches:
            conn.execute(_item_rows_sql(batch).replace("%s", "?"), batch)
        conn.execute(_sql("sqlite")["response"].replace("%s", "?"), response_params)
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    commits = getattr(_loop_local, "commits", 0) + 1
    _loop_local.commits = commits
    if commits % _CHECKPOINT_EVERY == 0:
        asyncio.get_running_loop().run_in_executor(None, _checkpoint)
    return True


def _checkpoint() -> None:
    from django.db import close_old_connections

    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except Exception:  # nobody awaits this; the next one (or any connection's own) catches up
        log.warning("WAL checkpoint failed", exc_info=True)
    finally:
        close_old_connections()
