"""WebSocket routes."""

from __future__ import annotations

from django.urls import path

from gateway.consumers import PlaceholderResponsesConsumer

websocket_urlpatterns = [
    path("v1/responses", PlaceholderResponsesConsumer.as_asgi()),
]
