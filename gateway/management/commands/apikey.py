"""``manage.py apikey create NAME | list | revoke NAME_OR_ID``: manage inbound API keys."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.core import errors
from gateway.core.auth import apikeys


class Command(BaseCommand):
    help = "Create, list or revoke the gateway's named inbound API keys."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print its secret (shown only once)")
        create.add_argument("name")
        sub.add_parser("list", help="list keys (never their secrets)")
        revoke = sub.add_parser("revoke", help="deactivate a key by name or id")
        revoke.add_argument("name_or_id")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "create":
                key, secret = apikeys.apikey_create(name=options["name"])
                # The secret alone on stdout, so `KEY=$(manage.py apikey create ci)` works.
                self.stdout.write(secret)
                self.stderr.write(
                    f"created API key {key.name!r} (id {key.pk}, owner {key.owner}); store the secret "
                    "now, it is not shown again"
                )
            elif options["action"] == "list":
                for key in apikeys.apikey_list():
                    state = "active" if key.is_active else "revoked"
                    last = key.last_used_at.isoformat() if key.last_used_at else "never"
                    self.stdout.write(
                        f"{key.pk}\t{key.name}\t{key.prefix}…\t{state}\t"
                        f"created {key.created_at.isoformat()}\tlast used {last}"
                    )
            elif options["action"] == "revoke":
                key = apikeys.apikey_revoke(name_or_id=options["name_or_id"])
                self.stdout.write(f"revoked API key {key.name!r} (id {key.pk})")
        except errors.GatewayError as exc:
            raise CommandError(exc.message) from None
