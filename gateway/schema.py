"""Schema operations for the apps' migrations that Django's own operations do not express."""

from __future__ import annotations

from typing import Any

from django.db import migrations


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
