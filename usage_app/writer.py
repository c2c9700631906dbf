"""The ledger's batch writer: rows queued by :func:`usage_app.ledger.record`, written in batches.

One daemon thread per process writes what is pending about once a second (one INSERT statement run
for each row, in one transaction), so a request never waits for the database and a crash loses at
most about a second of rows. It is a thread, not a task, so calls from any thread work alike (the
server's loop, a Celery task, sync code). Pending rows are capped: past the cap the oldest are dropped (a warning, once). A failed write
is logged and never raised. At shutdown (the server's lifespan, after SIGTERM's drain) and at
interpreter exit (a plain process; uvicorn's worker processes end without ``atexit``, hence the
lifespan job) :func:`flush_now` writes what is left (``docs/operations.md``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from usage_app.ledger import UsageEntry

log = logging.getLogger("gateway.usage")

# How long a queued row waits at most before its batch is written.
INTERVAL_S = 1.0
# Rows kept waiting at most (a database that is down for long must not grow the process forever).
MAX_PENDING = 100_000
# Rows per INSERT statement.
BATCH_SIZE = 500


class BatchWriter:
    """The pending rows and the thread that writes them (see the module docstring)."""

    def __init__(self, interval_s: float = INTERVAL_S, max_pending: int = MAX_PENDING) -> None:
        self.interval_s = interval_s
        self.max_pending = max_pending
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Held while a batch is written: a shutdown flush waits for the thread's write in progress.
        self._writing = threading.Lock()
        self._pending: deque[UsageEntry] = deque()
        self._thread: threading.Thread | None = None
        self._warned = False
        self.dropped = 0

    def queue(self, entry: UsageEntry) -> None:
        """Queue one row (never blocks on the database, never raises)."""
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._pending.popleft()
                self.dropped += 1
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "usage ledger: %d rows pending, dropping the oldest (is the database down?)",
                        self.max_pending,
                    )
            self._pending.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
                self._thread.start()
            elif len(self._pending) == 1:
                self._wake.notify()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending:
                    self._wake.wait()
            time.sleep(self.interval_s)  # rows queued meanwhile join this batch
            try:
                self.flush_now()
            except Exception:  # the thread must outlive any failure (flush_now logs write errors)
                log.exception("usage ledger: the writer failed")

    def flush_now(self) -> int:
        """Write every pending row now, on this thread; returns how many were written."""
        from django.db import close_old_connections

        written = 0
        with self._writing:
            while True:
                with self._lock:
                    batch = [self._pending.popleft() for _ in range(min(BATCH_SIZE, len(self._pending)))]
                if not batch:
                    break
                close_old_connections()
                try:
                    _write(batch)
                    written += len(batch)
                except Exception:
                    log.exception("usage ledger: %d rows could not be written", len(batch))
                finally:
                    if not self._pending:
                        _close_connection()
        return written


def _write(batch: list[UsageEntry]) -> None:
    """One INSERT statement run for every row of ``batch``, in one transaction. Through the ORM
    (``bulk_create``) the statement's compilation cost several times the database's work."""
    from django.db import connection, transaction

    from usage_app.ledger import values

    sql, names, times = _insert()
    adapt = connection.ops.adapt_datetimefield_value
    params = []
    for entry in batch:
        row = values(entry)
        for name in times:
            row[name] = adapt(row[name])
        params.append([row[name] for name in names])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(sql, params)


@functools.cache
def _insert() -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The ledger's INSERT (built once from the model), its fields' names in order, and those of
    its timestamps (adapted to the database)."""
    from django.db import connection, models

    from usage_app.models import UsageRecord

    fields = [f for f in UsageRecord._meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        quote(UsageRecord._meta.db_table),
        ", ".join(quote(str(f.column)) for f in fields),
        ", ".join(["%s"] * len(fields)),
    )
    times = tuple(f.attname for f in fields if isinstance(f, models.DateTimeField))
    return sql, tuple(f.attname for f in fields), times


def _close_connection() -> None:
    """Give this thread's connection back when nothing waits (no idle connection held between
    batches; a test database can be dropped)."""
    from django.db import connections

    connections.close_all()


writer = BatchWriter()


def queue(entry: UsageEntry) -> None:
    try:
        writer.queue(entry)
    except Exception:  # never into a request
        log.exception("usage ledger: a row could not be queued")


def flush_now() -> int:
    """Write what is pending now (sync code: shutdown, Celery, tests)."""
    return writer.flush_now()


async def flush() -> None:
    """Write what is pending now, from async code (the server's shutdown job)."""
    from gateway.core.db import run_orm

    await run_orm(writer.flush_now)


def _after_fork_in_child() -> None:
    # The parent's thread does not exist here, and its pending rows are the parent's to write.
    writer._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(flush_now)
