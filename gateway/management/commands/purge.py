"""``manage.py purge [--dry-run]``: delete the stored data past ``[retention]``'s ages now
(docs/operations.md, "Retention"). The dry run counts what would go and deletes nothing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from gateway.core.config import get_config
from gateway.data import retention


class Command(BaseCommand):
    help = "Delete the responses, conversations and usage rows older than [retention] allows."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = get_config()
        limits = retention.cutoffs(config.retention)
        if not retention.enabled(config.retention):
            self.stdout.write(
                "retention: every kind is kept forever ([retention] sets no ages); nothing to do"
            )
            return
        report = retention.purge(config=config, dry_run=options["dry_run"])
        if report.skipped:
            self.stdout.write("another process is purging now; nothing done")
            return
        verb = "would delete" if report.dry_run else "deleted"
        for kind, cutoff, count in (
            ("responses", limits["responses"], report.responses),
            ("response events", limits["responses"], report.response_events),
            ("conversations", limits["conversations"], report.conversations),
            ("usage rows", limits["usage"], report.usage),
        ):
            if cutoff is None:
                self.stdout.write(f"{kind}: kept forever")
            else:
                self.stdout.write(
                    f"{kind}: {verb} {count} (older than {cutoff.isoformat(timespec='seconds')})"
                )
        if report.items is None:
            self.stdout.write(
                "items: decided while deleting (items a kept response or conversation lists stay)"
            )
        else:
            self.stdout.write(f"items: deleted {report.items} (no longer listed by anything kept)")
