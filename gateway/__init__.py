"""The Django project package: config, ASGI app, errors, middleware, auth, pass-through views.

The Celery app is loaded with the package (Celery's Django guide), so every process that sends a
task (the gateway's background responses, tool calls) sends it through this app and its broker,
never through Celery's default app (AMQP on localhost).
"""

from gateway.celery import app as celery_app

__all__ = ("celery_app",)
