from django.db import migrations

from gateway.core.schema import compressed_with_lz4


class Migration(migrations.Migration):
    """LZ4 for the items' JSON on PostgreSQL (docs/operations.md → Compression)."""

    dependencies = [
        ("conversations_app", "0005_no_pattern_indexes"),
    ]

    operations = [
        compressed_with_lz4(("conversations_app_item", "data")),
    ]
