from django.db import migrations

from gateway.core.schema import without_pattern_indexes


class Migration(migrations.Migration):
    """The ``LIKE`` indexes PostgreSQL got beside the ids (docs/operations.md → Indexes)."""

    dependencies = [
        ("conversations_app", "0004_fewer_indexes"),
    ]

    operations = [
        without_pattern_indexes(
            ("conversations_app_item", "id"),
            ("conversations_app_conversation", "id"),
            ("conversations_app_conversationitem", "item_id"),
        ),
    ]
