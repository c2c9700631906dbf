from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("files_app", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="vectorstore",
            name="description",
            field=models.CharField(blank=True, default="", max_length=512),
        ),
    ]
