"""Schema operations for the apps' migrations that Django's own operations do not express."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, migrations, transaction

log = logging.getLogger("gateway.core.schema")

# PostgreSQL's SQLSTATE for a feature the server was built without ("compression method lz4 not
# supported").
FEATURE_NOT_SUPPORTED = "0A000"


def without_pattern_indexes(*columns: tuple[str, str]) -> migrations.RunPython:
    """Drop the ``LIKE`` index PostgreSQL gets beside the index of each ``(table, column)``.

    Django adds a second index (``varchar_pattern_ops``, named ``…_like``) to every indexed or unique
    ``CharField`` on PostgreSQL, for ``LIKE 'prefix%'`` lookups. An id column is only ever looked up
    by equality (the admin's search is ``icontains``, which no b-tree serves), so that index is
    written by every insert and read by nothing. Other backends have no such index: nothing to do.
    The reverse creates them again.
    """

    def forward(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            for table, column in columns:
                cursor.execute(
                    "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                    "AND tablename = %s AND indexdef LIKE %s",
                    [table, f"%({column} varchar_pattern_ops)"],
                )
                for (name,) in cursor.fetchall():
                    schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")

    def backward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        quote = schema_editor.quote_name
        for table, column in columns:
            schema_editor.execute(
                f"CREATE INDEX IF NOT EXISTS {quote(f'{table}_{column}_like')} "
                f"ON {quote(table)} ({quote(column)} varchar_pattern_ops)"
            )

    return migrations.RunPython(forward, backward)


def compressed_with_lz4(*columns: tuple[str, str]) -> migrations.RunPython:
    """Compress each ``(table, column)`` with LZ4 instead of PostgreSQL's default, pglz.

    A stored response's row holds its whole response object (``snapshot``) and request: past about
    2 KB a row is compressed as it is written, and pglz is the slow one of the two methods
    PostgreSQL has (measured: 45 µs against 27 µs to insert a typical stored response, for a stored
    size within 10 %), and reads decompress faster too (5,000 snapshots read back as text: 43 ms
    against 52 to 60). The method applies to values written from then on; values already stored
    keep theirs, and both read back the same. A server built without LZ4
    support (PostgreSQL's ``--with-lz4``, which the Debian, Red Hat and Docker builds have) refuses
    the method as a feature it does not support (SQLSTATE 0A000): it keeps pglz, the migration says
    so and goes on. Any other failure (a lock or statement timeout, a missing column) fails the
    migration, which is then not recorded as applied. Other backends compress nothing: nothing to
    do. The reverse goes back to the server's default (``default_toast_compression``).
    """

    def alter(schema_editor: Any, method: str) -> None:
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        quote = schema_editor.quote_name
        for table, column in columns:
            statement = f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} SET COMPRESSION {method}"
            try:
                with transaction.atomic(using=connection.alias):  # a savepoint: a refusal ends here
                    schema_editor.execute(statement)
            except DatabaseError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != FEATURE_NOT_SUPPORTED:
                    raise
                log.warning(
                    "%s kept its compression method (and the columns after it): %s", f"{table}.{column}", exc
                )
                return

    return migrations.RunPython(
        lambda apps, schema_editor: alter(schema_editor, "lz4"),
        lambda apps, schema_editor: alter(schema_editor, "default"),
    )
