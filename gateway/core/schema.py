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
    """Drop the ``varchar_pattern_ops`` (``…_like``) index Django adds on PostgreSQL beside each
    ``(table, column)``'s index: ids are looked up by equality only (``docs/operations.md``). The reverse
    creates them again; other backends have none."""

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
    """Compress each ``(table, column)`` with LZ4 instead of PostgreSQL's slower default, pglz
    (``docs/operations.md``), for values written from then on.

    A server built without LZ4 refuses it (SQLSTATE 0A000): it keeps pglz and the migration says so;
    any other failure fails the migration. Other backends: nothing to do. The reverse restores the
    server's default.
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
