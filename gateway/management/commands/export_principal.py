"""``manage.py export_principal SUBJECT [--output FILE]``: everything stored for one principal as
JSON lines (docs/operations.md, "A principal's data"). SUBJECT is the owner key as stored:
``default``, ``oidc:<issuer>#<subject>`` or ``key:<api key id>``."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.data import principal


class Command(BaseCommand):
    help = "Write every row stored for a principal (owner key) as JSON lines."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("subject", help="the owner key: default, oidc:<issuer>#<subject> or key:<id>")
        parser.add_argument("--output", "-o", help="write to this file instead of standard output")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            principal.check_subject(options["subject"])
        except principal.SubjectError as exc:
            raise CommandError(str(exc)) from None
        if options["output"]:
            with open(options["output"], "wb") as out:
                counts = principal.export(options["subject"], out)
        else:
            counts = principal.export(options["subject"], sys.stdout.buffer)
            sys.stdout.buffer.flush()
        summary = ", ".join(f"{count} {kind}" for kind, count in counts.items() if count) or "nothing stored"
        self.stderr.write(f"exported {options['subject']}: {summary}")
