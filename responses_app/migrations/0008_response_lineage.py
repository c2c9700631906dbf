from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("responses_app", "0007_history_items_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="response",
            name="lineage",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
    ]
