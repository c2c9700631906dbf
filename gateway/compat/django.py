"""Django internals: an ASGI handler with a middleware stack of its own (the API's).

``/v1/*`` is served by Django's ASGI handler with ``settings.MIDDLEWARE`` minus
``settings.ADMIN_ONLY_MIDDLEWARE`` (no sessions, messages, CSRF: the API is bearer-authenticated).
Django has no public way to give one handler another stack: :class:`ApiASGIHandler` overrides
``BaseHandler.load_middleware(is_async)``, which builds the chain from ``settings.MIDDLEWARE`` when
the handler is created, and shows it the shorter list while it does.

Relied on (Django ``VERSION``): ``BaseHandler.load_middleware(self, is_async=False)`` reading
``settings.MIDDLEWARE``, called once from ``ASGIHandler.__init__``. :func:`missing` checks them; when
one has moved, :func:`api_handler` falls back to the stock handler with the full stack (the admin's
middleware then runs on the API too: slower, same answers, since ``ApiCsrfViewMiddleware`` exempts
``/v1``). ``tests/gateway/test_compat.py`` fails when one moves.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import django
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler

VERSION = (5, 2)


def missing() -> list[str]:
    """The internals relied on that the installed Django lacks (its version too)."""
    gone = (
        []
        if django.VERSION[:2] == VERSION
        else [f"Django {VERSION[0]}.{VERSION[1]} (installed: {django.__version__})"]
    )
    load = getattr(BaseHandler, "load_middleware", None)
    if load is None or "is_async" not in inspect.signature(load).parameters:
        gone.append("BaseHandler.load_middleware(is_async)")
    elif "settings.MIDDLEWARE" not in inspect.getsource(load):
        gone.append("BaseHandler.load_middleware reads settings.MIDDLEWARE")
    if "self.load_middleware(" not in inspect.getsource(ASGIHandler.__init__):
        gone.append("ASGIHandler.__init__ calls load_middleware")
    return gone


class ApiASGIHandler(ASGIHandler):
    """Django's ASGI handler with the API middleware stack instead of ``settings.MIDDLEWARE``.

    Requests are served by Django's own ``__call__``, so each runs in its own
    ``ThreadSensitiveContext``: Django's thread-sensitive internals never queue one request behind
    another's on asgiref's single shared thread (``gateway.asgi.RequestThreads`` gives that context
    a pooled thread, so no request starts one). ORM work goes through ``gateway.db.run_orm``.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = [m for m in full if m not in settings.ADMIN_ONLY_MIDDLEWARE]
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = full


def api_handler() -> Any:
    """The handler serving the API: :class:`ApiASGIHandler`, or the stock one (with a warning) on a
    Django it is not built on."""
    gone = missing()
    if gone:
        logging.getLogger("gateway").warning(
            "Django differs from what gateway.compat.django is built on (%s): the API is served with "
            "the full middleware stack",
            ", ".join(gone),
        )
        return ASGIHandler()
    return ApiASGIHandler()
