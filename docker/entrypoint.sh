#!/bin/sh
# Container entrypoint: apply migrations safely (advisory lock on PostgreSQL), then exec the command.
set -e
if [ "${GATEWAY_SKIP_MIGRATE:-0}" != "1" ]; then
  python manage.py migrate_safely --verbosity 1
fi
exec "$@"
