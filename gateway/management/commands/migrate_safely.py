"""``manage.py migrate_safely``: run migrations once even when many replicas start together.

On PostgreSQL the migration runs under a session advisory lock, so concurrent entrypoints wait for
the first one and then find nothing to do. SQLite is single-host; its own file lock suffices.
"""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection

# An arbitrary, fixed 64-bit key that names "gateway schema migration" for pg_advisory_lock.
MIGRATION_LOCK_KEY = 0x6761_7465_7761_7901


class Command(BaseCommand):
    help = "Apply migrations, serialised across replicas with a PostgreSQL advisory lock."

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options.get("verbosity", 1)
        if connection.vendor != "postgresql":
            call_command("migrate", interactive=False, verbosity=verbosity)
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK_KEY])
            try:
                call_command("migrate", interactive=False, verbosity=verbosity)
            finally:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK_KEY])
