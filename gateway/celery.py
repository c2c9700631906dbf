"""The Celery app: queues ``inference`` (GPU workers hosting vLLM) and ``tools`` (gateway tools).

With ``REDIS_URL`` set, Redis is the broker and result backend; without it, tasks run in-process
(eager), so a one-machine gateway needs no broker.
"""

from __future__ import annotations

import logging
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

from gateway.core.config import Config, ConfigError, get_config
from inference_app.upstream.celery_config import QUEUES, configure

__all__ = ["QUEUES", "app", "configure", "ping"]


def _loaded_config() -> Config:
    # Loaded with the gateway package (gateway/__init__.py): a bad setting must still reach the one
    # clear message manage.py and the settings give, not a traceback from this import.
    try:
        return get_config()
    except ConfigError:
        return Config.model_construct()  # the defaults


_config = _loaded_config()
app = configure(Celery("gateway"), _config)
# The retention purge (docs/operations.md, "Retention"), run by `celery -A gateway beat` (or a worker
# started with -B); without a broker each server process runs it on a timer instead.
app.conf.beat_schedule = {
    "retention-purge": {"task": "gateway.purge", "schedule": _config.retention.interval_s},
}
app.autodiscover_tasks(
    ["inference_app.engine", "inference_app.tools", "files_app", "responses_app", "conversations_app"]
)


@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_stale_connections(**kwargs: object) -> None:
    """Before and after each task, drop database connections that died (a database restart) or
    outlived their age, as Django does around each request (Celery's Django integration)."""
    from django.db import close_old_connections

    close_old_connections()


@signals.worker_init.connect
def _tracing(**kwargs: object) -> None:
    """A worker traces like the gateway (the OTEL_* variables); its task spans continue the trace the
    gateway put into each task's headers. Its forked pool processes inherit it (the SDK restarts
    its export thread after a fork)."""
    from gateway.core import tracing

    tracing.setup(_loaded_config(), service_name="agentic-gateway-worker")


@signals.worker_ready.connect
def _recover_orphans(**kwargs: object) -> None:
    """Start-up recovery: fail the background responses and file ingestions of this host's processes
    that are gone (a worker killed mid-response), and any whose lease expired."""
    from responses_app.tasks import sweep_once

    try:
        sweep_once()
    except Exception:  # the database may not be up yet; the gateways' sweep will do it
        logging.getLogger("responses.background").exception("start-up lease sweep failed")


@app.task(name="gateway.purge", ignore_result=True)
def purge() -> dict[str, object]:
    """Delete the stored data past ``[retention]``'s ages (beat sends it every ``interval_s``)."""
    from gateway.data.retention import purge_logged

    return purge_logged().as_dict()


@app.task(name="gateway.ping")
def ping() -> str:
    """A trivial task to check that a worker consumes a queue."""
    return "pong"
