"""The Django middleware that authenticates every protected HTTP request.

It runs after CORS (a refusal still carries the CORS headers a browser needs) and renders a
refusal through :func:`gateway.core.errors.django_response` (Anthropic's envelope on
``/v1/messages*``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from gateway.core import errors
from gateway.core.auth import OPEN, authenticate, requires_auth


class AuthMiddleware:
    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        result = OPEN
        if requires_auth(request.path):
            headers = {key.lower(): value for key, value in request.headers.items()}
            try:
                result = await authenticate(request.path, headers)
            except errors.GatewayError as exc:
                return errors.django_response(exc, request)
        request.principal = result.principal  # type: ignore[attr-defined]
        request.credential_consumed = result.credential_consumed  # type: ignore[attr-defined]
        return await self.get_response(request)
