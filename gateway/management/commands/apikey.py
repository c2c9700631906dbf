"""``manage.py apikey create NAME | update NAME_OR_ID | list | revoke NAME_OR_ID``: manage inbound API keys.

``create`` and ``update`` take the key's quota overrides (``--requests-per-minute N``,
``--tokens-per-minute N``, ``--tokens-per-day N``, ``--max-concurrent N``; ``none`` clears one, so the
``[quotas]`` default applies) and ``--admin`` / ``--no-admin`` (sees everyone's usage).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.core import errors
from gateway.core.auth import apikeys

LIMIT_OPTIONS = {
    "requests_per_minute": "requests a minute",
    "tokens_per_minute": "tokens (input + output) a minute",
    "tokens_per_day": "tokens (input + output) a day",
    "max_concurrent": "requests at once (a background response holds one until it ends)",
}


def limit_value(text: str) -> int | None:
    """A positive integer, or ``none`` (the ``[quotas]`` default)."""
    text = text.strip()
    if text.lower() == "none":
        return None
    if text.isascii() and text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(
        f"must be a positive whole number, or 'none' for the [quotas] default; got {text!r}"
    )


def add_settings(parser: CommandParser) -> None:
    for name, what in LIMIT_OPTIONS.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=limit_value,
            default=argparse.SUPPRESS,
            metavar="N",
            help=f"at most N {what}; 'none': the [quotas] default",
        )
    parser.add_argument(
        "--admin",
        dest="is_admin",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="the key sees every principal's usage (GET /v1/organization/usage/…)",
    )


def _settings(options: dict[str, Any]) -> dict[str, Any]:
    return {name: options[name] for name in (*LIMIT_OPTIONS, "is_admin") if name in options}


def _describe(key: Any) -> str:
    limits = ", ".join(
        f"{name.replace('_', '-')} {getattr(key, name)}"
        for name in LIMIT_OPTIONS
        if getattr(key, name) is not None
    )
    return f"{'admin' if key.is_admin else 'not admin'}; limits: {limits or 'the [quotas] defaults'}"


class Command(BaseCommand):
    help = "Create, update, list or revoke the gateway's named inbound API keys."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print its secret (shown only once)")
        create.add_argument("name")
        add_settings(create)
        update = sub.add_parser("update", help="change a key's quota overrides or admin flag")
        update.add_argument("name_or_id")
        add_settings(update)
        sub.add_parser("list", help="list keys (never their secrets)")
        revoke = sub.add_parser("revoke", help="deactivate a key by name or id")
        revoke.add_argument("name_or_id")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "create":
                key, secret = apikeys.apikey_create(name=options["name"], **_settings(options))
                # The secret alone on stdout, so `KEY=$(manage.py apikey create ci)` works.
                self.stdout.write(secret)
                self.stderr.write(
                    f"created API key {key.name!r} (id {key.pk}, owner {key.owner}, usage id "
                    f"key_{key.pk}; {_describe(key)}); store the secret now, it is not shown again"
                )
            elif options["action"] == "update":
                settings = _settings(options)
                if not settings:
                    raise CommandError("Nothing to update: give a limit option, --admin or --no-admin.")
                key = apikeys.apikey_update(name_or_id=options["name_or_id"], **settings)
                self.stdout.write(f"updated API key {key.name!r} (id {key.pk}): {_describe(key)}")
            elif options["action"] == "list":
                for key in apikeys.apikey_list():
                    state = "active" if key.is_active else "revoked"
                    last = key.last_used_at.isoformat() if key.last_used_at else "never"
                    self.stdout.write(
                        f"{key.pk}\t{key.name}\t{key.prefix}…\t{state}\t"
                        f"created {key.created_at.isoformat()}\tlast used {last}\t{_describe(key)}"
                    )
            elif options["action"] == "revoke":
                key = apikeys.apikey_revoke(name_or_id=options["name_or_id"])
                self.stdout.write(f"revoked API key {key.name!r} (id {key.pk})")
        except errors.GatewayError as exc:
            raise CommandError(exc.message) from None
