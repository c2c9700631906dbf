from typing import Any

from django.db import migrations

INDEX = "response_history_items_gin"


def create(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: a GIN index over the item ids of every checkpoint, so the retention purge finds
    whether a kept response still references an item (``history_item_ids @> '["id"]'``) without
    reading the table (docs/operations.md → Retention). SQLite indexes no JSON array elements."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON responses_app_response "
        "USING gin (history_item_ids jsonb_path_ops)"
    )


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY: writers are not blocked while it builds

    dependencies = [
        ("responses_app", "0006_lz4_compression"),
    ]

    operations = [migrations.RunPython(create, drop)]
