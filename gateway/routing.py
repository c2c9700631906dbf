"""WebSocket routes."""

from __future__ import annotations

from django.urls import path

from responses_app.api.consumers import ResponsesConsumer

websocket_urlpatterns = [
    path("v1/responses", ResponsesConsumer.as_asgi()),
]
