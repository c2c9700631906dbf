from django.db import migrations

from gateway.core.schema import without_pattern_indexes


class Migration(migrations.Migration):
    """The ``LIKE`` indexes PostgreSQL got beside the ids (docs/operations.md → Indexes)."""

    dependencies = [
        ("responses_app", "0004_fewer_indexes"),
    ]

    operations = [
        without_pattern_indexes(
            ("responses_app_response", "id"),
            ("responses_app_responseevent", "response_id"),
        ),
    ]
