#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    from gateway.core.config import ConfigError, get_config

    try:
        get_config()
    except ConfigError as exc:
        sys.exit(f"configuration error: {exc}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
