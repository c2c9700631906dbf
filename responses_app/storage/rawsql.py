"""The one write path of a finished response, and the parent check of a continuation, in plain SQL.

Through the ORM these statements cost more than the database work, so the SQL is built once per
backend from the models' metadata, and rows by :func:`rows`. The response row upsert replaces only
an unfinished row. PostgreSQL: one statement for a whole batch (``jsonb_to_recordset`` and CTEs);
SQLite: one ``BEGIN IMMEDIATE`` transaction, writers queued on a lock and a ``flock`` beside the
database instead of SQLite's polling busy handler (``docs/responses.md``).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import cache
from typing import Any, NamedTuple

import orjson
from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.utils import timezone

from conversations_app.models import Item
from responses_app.models import Response
from usage_app.models import UsageRecord

_OPTS = orjson.OPT_NON_STR_KEYS
_OPEN = (Response.Status.QUEUED, Response.Status.IN_PROGRESS)
# Item rows per INSERT statement (5 parameters each: within SQLite's 999-parameter limit).
_BATCH = 150
# The columns a finished response writes over its unfinished (background) row.
FINAL_COLUMNS = (
    "status",
    "snapshot",
    "usage",
    "error",
    "agent_tree",
    "history_item_ids",
    "input_item_count",
    "completed_at",
    "lease_expires_at",  # a finished response holds no lease
)

_sqlite_writer = threading.Lock()
# This process's descriptor of the SQLite writers' lock file: (pid, fd), opened in the process that
# uses it (a descriptor inherited over fork would share its lock with the parent).
_lock_file: tuple[int, int] | None = None


def dumps(value: Any) -> str | None:
    """A JSON column's value (``None`` stays SQL NULL, as ``JSONField(null=True)`` stores it)."""
    return None if value is None else orjson.dumps(value, option=_OPTS).decode()


def loads(value: Any) -> Any:
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return orjson.loads(value)
    return value  # a driver that already decoded it


@cache
def _sql(vendor: str) -> dict[str, Any]:
    """The statements for one database backend, built once from the models' metadata.

    Parameters are named (``%(r0)s``): Django's SQLite backend rewrites positional ``%s`` with a costly
    regular expression, named ones with one ``%`` formatting.
    """
    q = connection.ops.quote_name
    responses, items = q(Response._meta.db_table), q(Item._meta.db_table)
    columns = tuple(str(field.column) for field in Response._meta.concrete_fields)
    item_columns = tuple(str(field.column) for field in Item._meta.concrete_fields)
    where = f"WHERE {q('id')} = %(id)s AND {q('owner')} = %(owner)s"
    update = ", ".join(f"{q(c)} = excluded.{q(c)}" for c in FINAL_COLUMNS)
    statuses = ", ".join(f"'{status}'" for status in _OPEN)

    def recordset(name: str, fields: Any) -> str:
        """``name``'s JSON document as rows of ``fields``' columns, with their database types."""
        types = ", ".join(f"{q(str(f.column))} {f.db_type(connection)}" for f in fields)
        return f"SELECT * FROM jsonb_to_recordset(%({name})s::jsonb) AS {name}({types})"

    listed, item_listed = ", ".join(q(c) for c in columns), ", ".join(q(c) for c in item_columns)
    usage_table = q(UsageRecord._meta.db_table)
    usage_fields = _usage_fields()
    usage_listed = ", ".join(q(str(f.column)) for f in usage_fields)
    return {
        # PostgreSQL: any number of responses, their items and their ledger rows in one statement
        # (store_responses); a response's ledger rows only when its row was written.
        "records": (
            f"WITH new_responses AS ({recordset('responses', Response._meta.concrete_fields)}), "
            f"new_items AS ({recordset('items', Item._meta.concrete_fields)}), "
            f"new_usage AS ({recordset('usage', usage_fields)}), "
            f"inserted_items AS (INSERT INTO {items} ({item_listed}) SELECT {item_listed} FROM new_items "
            f"ON CONFLICT DO NOTHING), "
            f"written AS (INSERT INTO {responses} ({listed}) SELECT {listed} FROM new_responses "
            f"ON CONFLICT ({q('id')}) DO UPDATE SET {update} "
            f"WHERE {responses}.{q('status')} IN ({statuses}) RETURNING {q('id')}), "
            f"inserted_usage AS (INSERT INTO {usage_table} ({usage_listed}) SELECT {usage_listed} "
            f"FROM new_usage WHERE {q('response_id')} IN (SELECT {q('id')} FROM written)) "
            f"SELECT {q('id')} FROM written"
        ),
        # SQLite: the ledger rows of one stored response (executemany).
        "usage": (
            f"INSERT INTO {usage_table} ({usage_listed}) "
            f"VALUES ({', '.join(f'%(u{i})s' for i in range(len(usage_fields)))})"
        ),
        "status": f"SELECT {q('status')}, {q('agent_tree')}, {q('lineage')} FROM {responses} {where}",
        "status_ids": (
            f"SELECT {q('status')}, {q('agent_tree')}, {q('lineage')}, {q('history_item_ids')} "
            f"FROM {responses} {where}"
        ),
        "items": f"INSERT INTO {items} ({', '.join(q(c) for c in item_columns)}) VALUES ",
        "item_columns": item_columns,
        "columns": columns,
        "response": (
            f"INSERT INTO {responses} ({', '.join(q(c) for c in columns)}) "
            f"VALUES ({', '.join(f'%({name})s' for name in _RESPONSE_NAMES)}) "
            f"ON CONFLICT ({q('id')}) DO UPDATE SET {update} "
            f"WHERE {responses}.{q('status')} IN ({statuses})"
        ),
    }


# Parameter names: one per column of the response row, and one per value of a batch of item rows.
_RESPONSE_NAMES = tuple(f"r{i}" for i in range(len(Response._meta.concrete_fields)))
_ITEM_NAMES = tuple(f"i{i}" for i in range(_BATCH * len(Item._meta.concrete_fields)))


@cache
def _items_sql(vendor: str, rows: int) -> str:
    """The INSERT of ``rows`` item rows (existing ids left alone)."""
    sql = _sql(vendor)
    width = len(sql["item_columns"])
    values = ", ".join(
        "(" + ", ".join(f"%({name})s" for name in _ITEM_NAMES[row * width : (row + 1) * width]) + ")"
        for row in range(rows)
    )
    return f"{sql['items']}{values} ON CONFLICT DO NOTHING"


@cache
def _vendor() -> str:
    """The default database's backend, looked up once (the connection proxy costs more than a
    dictionary lookup on this path)."""
    return str(connection.vendor)


@cache
def _columns(model: type[models.Model]) -> tuple[tuple[str, str, Any], ...]:
    """``(attribute, kind, field)`` of every concrete column of ``model``, in column order."""
    plan = []
    for field in model._meta.concrete_fields:
        if isinstance(field, models.JSONField):
            kind = "json"
        elif isinstance(field, models.DateTimeField):
            kind = "datetime"
        else:
            kind = ""
        plan.append((field.attname, kind, field))
    return tuple(plan)


def _row(
    model: type[models.Model], values: dict[str, Any], adapt_datetime: Callable[[Any], Any]
) -> list[Any]:
    """One row of ``model`` as the ORM would write it: concrete columns in order, defaults filled, JSON
    with orjson, dates adapted for the backend."""
    row: list[Any] = []
    for name, kind, field in _columns(model):
        value = values[name] if name in values else field.get_default()
        if kind == "json":
            value = dumps(value)
        elif kind == "datetime" and value is not None:
            value = adapt_datetime(value)
        row.append(value)
    return row


def _record(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    """One row of ``model`` for PostgreSQL's JSON payload: columns by name, defaults filled, JSON values
    and aware datetimes left for orjson (RFC 3339, which ``timestamptz`` reads)."""
    record: dict[str, Any] = {}
    for name, _kind, field in _columns(model):
        record[field.column] = values[name] if name in values else field.get_default()
    return record


def rows(*, items: list[dict[str, Any]], owner: str, response: dict[str, Any]) -> tuple[list[Any], Any]:
    """The item rows and the response row in the form :func:`store_responses` takes on this database.
    ``response`` holds values by attribute name; missing ones take the field's default."""
    now = timezone.now()
    item_values = [
        {"id": item["id"], "owner": owner, "type": item["type"], "data": item, "created_at": now}
        for item in items
    ]
    response_values = {"created_at": now, **response}
    if _vendor() == "postgresql":
        return [_record(Item, values) for values in item_values], _record(Response, response_values)
    adapt = connection.ops.adapt_datetimefield_value  # looked up once: each lookup is a thread-local one
    return [_row(Item, values, adapt) for values in item_values], _row(Response, response_values, adapt)


def _usage_fields() -> tuple[Any, ...]:
    """The ledger's columns a write fills (its id is the database's)."""
    return tuple(f for f in UsageRecord._meta.concrete_fields if not f.primary_key)


def usage_rows(records: list[UsageRecord]) -> list[Any]:
    """Unsaved ledger ``records`` in the form :func:`store_responses` takes on this database."""
    fields = _usage_fields()
    if _vendor() == "postgresql":  # for orjson: aware datetimes as RFC 3339, which timestamptz reads
        return [{f.column: getattr(record, f.attname) for f in fields} for record in records]
    adapt = connection.ops.adapt_datetimefield_value
    return [
        {
            f"u{i}": adapt(value) if isinstance(f, models.DateTimeField) else value
            for i, f in enumerate(fields)
            for value in (getattr(record, f.attname),)
        }
        for record in records
    ]


def _writers_lock() -> int:
    """The descriptor of the lock file the SQLite writers of every server process queue on."""
    global _lock_file
    pid = os.getpid()
    if _lock_file is None or _lock_file[0] != pid:
        path = f"{connection.settings_dict['NAME']}.writers.lock"
        _lock_file = (pid, os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    return _lock_file[1]


@contextmanager
def _between_processes() -> Iterator[None]:
    """Hold the writers' file lock (blocking: the kernel wakes the next waiter when it is free)."""
    fd = _writers_lock()
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextmanager
def writing() -> Iterator[None]:
    """One write transaction: queued behind this process's, then every server process's, other
    writers on SQLite."""
    if _vendor() == "sqlite" and not connection.in_atomic_block:
        with _sqlite_writer, _between_processes(), transaction.atomic():
            yield
        return
    with transaction.atomic():
        yield


def store_response(*, item_rows: list[Any], response_row: Any) -> bool:
    """Insert the items (existing ids left alone) and insert, or finish, the response row.

    Atomic, or part of the caller's transaction inside :func:`writing`. False when the row is already
    past ``queued`` / ``in_progress`` (cancelled meanwhile): the response is left as it is.
    """
    return store_responses([(item_rows, response_row)])[0]


def store_responses(writes: list[tuple[list[Any], Any]], usage: list[list[Any]] | None = None) -> list[bool]:
    """:func:`store_response` for each of ``writes``, atomically (one statement on PostgreSQL, one
    transaction elsewhere); one answer per write, in order. ``usage``: each write's ledger rows
    (:func:`usage_rows`), inserted only with a response row that was written."""
    vendor = _vendor()
    db = connections[DEFAULT_DB_ALIAS]  # the calling thread's connection, looked up once
    usage = usage or [[] for _ in writes]
    with db.cursor() as cursor:
        if vendor == "postgresql":
            responses = [row for _, row in writes]
            items = [item for item_rows, _ in writes for item in item_rows]
            cursor.execute(
                _sql(vendor)["records"],
                {
                    "responses": orjson.dumps(responses, option=_OPTS).decode(),
                    "items": orjson.dumps(items, option=_OPTS).decode(),
                    "usage": orjson.dumps([r for rows in usage for r in rows], option=_OPTS).decode(),
                },
            )
            written = {row[0] for row in cursor.fetchall()}
            return [row["id"] in written for row in responses]
        sql = _sql(vendor)
        stored = []
        with nullcontext() if db.in_atomic_block else writing():
            for (item_rows, response_row), usage_rows in zip(writes, usage, strict=True):
                for start in range(0, len(item_rows), _BATCH):
                    batch = item_rows[start : start + _BATCH]
                    cursor.execute(_items_sql(vendor, len(batch)), _item_params(batch))
                cursor.execute(sql["response"], dict(zip(_RESPONSE_NAMES, response_row, strict=True)))
                stored.append(bool(cursor.rowcount))
                if stored[-1] and usage_rows:
                    cursor.executemany(sql["usage"], usage_rows)
        return stored


def _item_params(rows: list[list[Any]]) -> dict[str, Any]:
    """The values of a batch of item rows by the names of their placeholders (``_items_sql``)."""
    return dict(zip(_ITEM_NAMES, [value for row in rows for value in row], strict=False))


class ParentRow(NamedTuple):
    """What a continuation reads of the response it continues."""

    status: str
    item_ids: list[str] | None  # None unless asked for
    agent_tree: dict[str, Any] | None
    lineage: str | None  # None: stored before lineages were (responses_app 0008)


def parent_row(response_id: str, owner: str, *, with_item_ids: bool) -> ParentRow | None:
    """The owner's response ``response_id`` as a continuation reads it, or None when there is none."""
    sql = _sql(_vendor())["status_ids" if with_item_ids else "status"]
    with connection.cursor() as cursor:
        cursor.execute(sql, {"id": response_id, "owner": owner})
        row = cursor.fetchone()
    if row is None:
        return None
    return ParentRow(row[0], loads(row[3]) if with_item_ids else None, loads(row[1]), row[2])
