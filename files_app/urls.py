"""Routes of the Files and vector stores APIs, included by ``gateway.urls`` before the ``/v1`` catch-all."""

from django.urls import path  # noqa: F401

from gateway.core.drf import async_view  # noqa: F401

urlpatterns: list = []
