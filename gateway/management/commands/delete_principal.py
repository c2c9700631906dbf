"""``manage.py delete_principal SUBJECT [--yes]``: delete everything stored for one principal
(docs/operations.md, "A principal's data"); asks first unless ``--yes``. SUBJECT is the owner key
as stored: ``default``, ``oidc:<issuer>#<subject>`` or ``key:<api key id>``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.data import principal


class Command(BaseCommand):
    help = "Delete every response, conversation, item, file, vector store and usage row of a principal."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("subject", help="the owner key: default, oidc:<issuer>#<subject> or key:<id>")
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    def handle(self, *args: Any, **options: Any) -> None:
        subject = options["subject"]
        try:
            principal.check_subject(subject)
        except principal.SubjectError as exc:
            raise CommandError(str(exc)) from None
        if not options["yes"]:
            answer = input(f"Delete everything stored for {subject}? This cannot be undone. Type 'yes': ")
            if answer.strip().lower() != "yes":
                raise CommandError("not deleted")
        done = principal.delete(subject)
        summary = ", ".join(f"{count} {kind}" for kind, count in done.as_dict().items())
        self.stdout.write(f"deleted {subject}: {summary}")
