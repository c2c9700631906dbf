from django.db import migrations

from gateway.core.schema import compressed_with_lz4


class Migration(migrations.Migration):
    """LZ4 for the large columns on PostgreSQL (docs/operations.md → Compression)."""

    dependencies = [
        ("responses_app", "0005_no_pattern_indexes"),
    ]

    operations = [
        compressed_with_lz4(
            ("responses_app_response", "request"),
            ("responses_app_response", "snapshot"),
            ("responses_app_response", "history_item_ids"),
            ("responses_app_response", "agent_tree"),
            ("responses_app_responseevent", "data"),
        ),
    ]
