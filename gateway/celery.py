"""The Celery app: queues ``inference`` (GPU workers hosting vLLM) and ``tools`` (gateway tools).

With ``REDIS_URL`` set, Redis is the broker and result backend; without it, tasks run in-process
(eager), so a one-machine gateway needs no broker.
"""

from __future__ import annotations

import logging
import os

from celery import Celery, signals
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

from gateway.config import Config, ConfigError, get_config

QUEUES = ("inference", "tools", "responses")


def configure(app: Celery, config: Config) -> Celery:
    """Broker and queues for ``config``: Redis when ``REDIS_URL`` is set, in-process otherwise."""
    app.conf.update(
        broker_url=config.redis_url or "memory://",
        result_backend=config.redis_url or None,
        task_always_eager=not config.broker_enabled,
        task_eager_propagates=True,
        # Each queue with its own exchange and routing key: queues declared bare would all bind to
        # the default exchange with the default routing key, so a task sent to one queue would be
        # delivered to every queue.
        task_queues=tuple(Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES),
        task_default_queue="tools",
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        # A request whose task cannot be sent is refused at once (503): a producer's connection is
        # not retried (kombu's default retries for seconds); the worker's consumer keeps its own
        # reconnect policy (broker_connection_retry / broker_connection_max_retries).
        broker_connection_timeout=3,
        broker_transport_options={"max_retries": 0},
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
    )
    return app


def _loaded_config() -> Config:
    # Loaded with the gateway package (gateway/__init__.py): a bad setting must still reach the one
    # clear message manage.py and the settings give, not a traceback from this import.
    try:
        return get_config()
    except ConfigError:
        return Config()


app = configure(Celery("gateway"), _loaded_config())
app.autodiscover_tasks(["inference_app", "responses_app", "conversations_app"])
app.autodiscover_tasks(["inference_app"], related_name="tool_tasks")


@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_stale_connections(**kwargs: object) -> None:
    """Before and after each task, drop database connections that died (a database restart) or
    outlived their age, as Django does around each request (Celery's Django integration)."""
    from django.db import close_old_connections

    close_old_connections()


@signals.worker_ready.connect
def _recover_orphans(**kwargs: object) -> None:
    """Start-up recovery: fail the background responses of this host's processes that are gone
    (a worker killed mid-response), and any whose lease expired."""
    from responses_app.tasks import sweep_once

    try:
        sweep_once()
    except Exception:  # the database may not be up yet; the gateways' sweep will do it
        logging.getLogger("responses.background").exception("start-up lease sweep failed")


@app.task(name="gateway.ping", queue="tools")
def ping() -> str:
    """A trivial task to check that a worker consumes a queue."""
    return "pong"
