import django.utils.timezone
from django.db import migrations, models
from django.db.models import F


def backfill(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Existing conversations were last changed, as far as anyone knows, when they were created."""
    Conversation = apps.get_model("conversations_app", "Conversation")
    Conversation.objects.using(schema_editor.connection.alias).update(updated_at=F("created_at"))


class Migration(migrations.Migration):
    """``updated_at``: retention ages a conversation by its last change (docs/operations.md → Retention)."""

    dependencies = [
        ("conversations_app", "0006_lz4_compression"),
    ]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="updated_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="conversation",
            index=models.Index(fields=["updated_at"], name="conv_updated_idx"),
        ),
    ]
