"""The Celery configuration every app of ours shares: broker, queues and their routing, here so that
``inference_app`` never imports the gateway's app module (which imports the apps' tasks)."""

from __future__ import annotations

from celery import Celery
from kombu import Exchange, Queue

from gateway.core.config import Config

QUEUES = ("inference", "tools", "responses")
TASK_QUEUES = {
    "gateway.ping": {"queue": "tools"},
    "inference_app.run_gateway_tool": {"queue": "tools"},
    "inference.generate": {"queue": "inference"},
    "responses.run_background": {"queue": "responses"},
}


def configure(app: Celery, config: Config) -> Celery:
    """Broker and queues for ``config``: Redis when ``REDIS_URL`` is set, in-process otherwise."""
    app.conf.update(
        broker_url=config.redis_url or "memory://",
        result_backend=config.redis_url or None,
        task_always_eager=not config.broker_enabled,
        task_eager_propagates=True,
        # Each queue has its own exchange and routing key: bare queues would all bind to the default one and
        # every task would reach every queue.
        task_queues=tuple(Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES),
        task_default_queue="tools",
        # Each task's queue by name (Celery deprecates the ``queue`` task attribute); a sender may
        # still name another queue (WorkerUpstream sends to the served model's own queue).
        task_routes=TASK_QUEUES,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        # A task that cannot be sent is a 503 at once (no producer retries); workers keep their own
        # reconnect policy.
        broker_connection_timeout=3,
        broker_transport_options={"max_retries": 0},
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
    )
    return app


_clients: dict[tuple[str, str], Celery] = {}


def client_app(config: Config, name: str = "gateway-client") -> Celery:
    """A Celery app that sends tasks by name to ``config``'s broker (one per broker and name)."""
    key = (config.redis_url, name)
    app = _clients.get(key)
    if app is None:
        app = _clients[key] = configure(Celery(name, set_as_current=False), config)
    return app
