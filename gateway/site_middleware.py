"""The site's middleware (admin, SSO, static files): Django's own, for those paths only.

Each subclasses Django's middleware with :class:`SiteOnly` first, so the API skips sessions, CSRF,
messages and clickjacking (a thread hop each under ASGI). Separate from ``gateway.core.middleware``
because Django's auth middleware needs the app registry at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware

# Browser-facing paths that need sessions, CSRF, messages and static files; everything else (the
# API, /health, /ready, /metrics, /docs) skips the site's middleware.
SITE_PREFIXES = ("/admin", "/oidc/", "/static/")


class SiteOnly:
    """Put first in a Django middleware's subclass: it then runs for the site's paths only, sparing the
    API sessions, CSRF, messages and clickjacking (thread hops under ASGI)."""

    get_response: Callable[[HttpRequest], Any]

    def __call__(self, request: HttpRequest) -> Any:
        if request.path.startswith(SITE_PREFIXES):
            return super().__call__(request)  # type: ignore[misc]
        return self.get_response(request)


class SiteSecurityMiddleware(SiteOnly, SecurityMiddleware):
    pass


class SiteSessionMiddleware(SiteOnly, SessionMiddleware):
    pass


class SiteCsrfViewMiddleware(SiteOnly, CsrfViewMiddleware):
    async def process_view(  # type: ignore[override]
        self, request: HttpRequest, callback: Any, callback_args: Any, callback_kwargs: Any
    ) -> Any:
        """Async, so an API request does not hop to a thread to learn it is not checked."""
        if not request.path.startswith(SITE_PREFIXES):
            return None
        check = sync_to_async(super().process_view)
        return await check(request, callback, callback_args, callback_kwargs)


class SiteAuthenticationMiddleware(SiteOnly, AuthenticationMiddleware):
    pass


class SiteMessageMiddleware(SiteOnly, MessageMiddleware):
    pass


class SiteXFrameOptionsMiddleware(SiteOnly, XFrameOptionsMiddleware):
    pass
