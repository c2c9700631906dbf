"""Pointing the gateway's Celery app at another broker inside one test process."""

from __future__ import annotations

import threading
from typing import Any

from gateway.celery import configure


def rebind(app: Any, config: Any) -> None:
    """Configure ``app`` for ``config`` and drop what it cached for an earlier broker (other tests
    in this process configure the same app for another Redis db)."""
    configure(app, config)
    if app._pool is not None:
        app._pool.force_close_all()
    app._pool = None
    if "amqp" in app.__dict__:
        app.__dict__["amqp"]._producer_pool = None
    app._local = threading.local()  # the cached result backend
