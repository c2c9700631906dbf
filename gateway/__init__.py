"""The Django project: settings, URLs, ASGI entry point, Celery app and management commands.

The Celery app is loaded with the package (Celery's Django guide), so every task is sent through
it and its broker, never through Celery's default app.
"""

from gateway.celery import app as celery_app

__all__ = ("celery_app",)
