"""The one rule pipeline: every serving path admits a request with :func:`admitted` and ends it with
:func:`finish`, so no path carries a copy of a rule.

:class:`Passage` starts a request (request id, log context, gauge, clock, body ceiling);
:func:`admit` applies CORS, authentication and the route's methods, in that order;
:func:`finish` records metrics, the access log and 499 for an unfinished answer.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.urls import Resolver404, resolve

from gateway.core import errors, fastroutes
from gateway.core.auth import AuthResult, authenticate, authenticate_now
from gateway.core.config import get_config
from gateway.core.ids import request_id_for
from gateway.core.logging import log_access, request_id_var
from gateway.core.metrics import in_flight, observe_request

RawHeaders = list[tuple[bytes, bytes]]

# Scope key of the request's Passage on the ASGI path.
PASSAGE = "gateway.passage"
# Scope key of the request id (errors.render reads it).
REQUEST_ID = "gateway.request_id"

ANY_METHOD: frozenset[str] = frozenset()


class Passage:
    """One HTTP request on its way through the rules (what :func:`admit` and :func:`finish` work on)."""

    __slots__ = ("cors", "method", "path", "refusal", "request_id", "started", "status", "token")

    def __init__(
        self,
        method: str,
        path: str,
        incoming_id: str | None,
        declared: str | None,
    ) -> None:
        self.method = method
        self.path = path
        self.request_id = rid = request_id_for(incoming_id)
        # The log context for the whole request (its task's), reset by finish().
        self.token: contextvars.Token[str] | None = request_id_var.set(rid)
        self.started = time.perf_counter()
        self.status = 0  # the answer's status once it is complete; 0: not answered (yet)
        self.cors: RawHeaders = _NO_HEADERS
        self.refusal: errors.GatewayError | None = None
        limit = get_config().server.max_request_body_size_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self.refusal = errors.payload_too_large(limit)
        in_flight(1)


def admit(
    passage: Passage, headers: Mapping[str, str], methods: frozenset[str] = ANY_METHOD
) -> AuthResult | None:
    """CORS, authentication and the method (``methods`` empty: any). Raises the refusal; None:
    authentication must wait for I/O (:func:`admitted` waits)."""
    passage.cors = cors_headers(passage.method, passage.path, headers)
    auth = authenticate_now(passage.path, headers)
    if auth is None:
        return None
    _check_method(passage, methods)
    return auth


async def admitted(
    passage: Passage, headers: Mapping[str, str], methods: frozenset[str] = ANY_METHOD
) -> AuthResult:
    """:func:`admit`, waiting for authentication when it has to."""
    auth = admit(passage, headers, methods)
    if auth is None:
        auth = await authenticate(passage.path, headers)
        _check_method(passage, methods)
    return auth


def _check_method(passage: Passage, methods: frozenset[str]) -> None:
    if methods and passage.method not in methods:
        raise errors.MethodNotAllowed(
            f"Method {passage.method} is not allowed on {passage.path}.",
            headers={"Allow": ", ".join(sorted(methods))},
        )


def finish(passage: Passage, status: int, route: str | None = None) -> None:
    """The request is over: metrics, in-flight, the access log (status 0: the client went away
    before a complete answer, logged 499), and the log context reset."""
    in_flight(-1)
    path = passage.path
    record_request(
        passage.method,
        path,
        route if route is not None else route_label(path),
        status or 499,
        time.perf_counter() - passage.started,
        passage.request_id,
    )
    token, passage.token = passage.token, None
    if token is not None:
        request_id_var.reset(token)


def passage_of(scope: Mapping[str, Any]) -> Passage:
    """The passage ``GatewayASGIMiddleware`` opened for this ASGI request."""
    passage: Passage = scope[PASSAGE]
    return passage


def record_request(method: str, path: str, route: str, status: int, seconds: float, request_id: str) -> None:
    """Count an answered HTTP request in the metrics and write its access-log line."""
    observe_request(route, method, status, seconds)
    log_access(method, path, route, status, seconds, request_id)


@lru_cache(maxsize=4096)
def route_label(path: str) -> str:
    """The URL pattern serving ``path`` (bounded label cardinality for metrics)."""
    if path in fastroutes.RELAYED or path in fastroutes.HANDLERS:
        return path
    try:
        match = resolve(path)
    except Resolver404:
        return "unmatched"
    return "/" + match.route if match.route else path


# -- CORS --------------------------------------------------------------------------------------------

_NO_HEADERS: RawHeaders = []
_VARY_ORIGIN: RawHeaders = [(b"vary", b"origin")]


@lru_cache(maxsize=256)
def _cors_applies(pattern: str, path: str) -> bool:
    import re

    return re.match(pattern, path) is not None


def cors_headers(method: str, path: str, headers: Mapping[str, str]) -> RawHeaders:
    """The headers django-cors-headers adds to this (non-preflight) request's answer, computed by the
    library's own middleware; the returned list is shared and must not be changed."""
    if not _cors_applies(settings.CORS_URLS_REGEX, path):
        return _NO_HEADERS
    if "origin" not in headers:
        return _VARY_ORIGIN
    from corsheaders.middleware import CorsMiddleware
    from django.http import HttpRequest, HttpResponse

    request = HttpRequest()
    request.method = method
    request.path = request.path_info = path
    request.META = {"HTTP_" + key.upper().replace("-", "_"): value for key, value in headers.items()}
    response = HttpResponse()
    del response["Content-Type"]
    answered = CorsMiddleware(lambda r: response)(request)  # synchronous: get_response is
    assert isinstance(answered, HttpResponse)
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answered.headers.items()]
