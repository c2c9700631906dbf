"""Pointing the gateway's Celery app at another broker inside one test process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery.contrib.testing.worker import start_worker
from kombu import pools

from gateway.celery import app as celery_app
from gateway.celery import configure


def rebind(app: Any, config: Any) -> None:
    """Configure ``app`` for ``config`` and drop what it cached for an earlier broker (other tests
    in this process configure the same app for another Redis db)."""
    configure(app, config)
    # kombu keeps its connection and producer pools per broker URL, process-wide: close and forget
    # them all, or binding the same URL again later would hand back the pool closed here.
    pools.reset()
    app._pool = None
    if "amqp" in app.__dict__:
        app.__dict__["amqp"]._producer_pool = None
    app._local = threading.local()  # the cached result backend


@contextmanager
def responses_worker(gateway_config: Callable[..., Any], redis_url: str) -> Iterator[None]:
    """A real Celery worker in this thread consuming the ``responses`` queue from ``redis_url`` (a
    Redis db of the caller's own, flushed before and after), with the gateway's config pointing at
    it; background responses then run on the broker path."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    rebind(celery_app, gateway_config(redis_url=redis_url))
    try:
        with start_worker(
            celery_app, queues=["responses"], perform_ping_check=False, pool="solo", loglevel="WARNING"
        ):
            yield
    finally:
        rebind(celery_app, gateway_config(redis_url=""))
        client.flushdb()
        client.close()
