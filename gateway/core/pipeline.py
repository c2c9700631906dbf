"""The one rule pipeline: every serving path admits a request with :func:`admitted` and ends it with
:func:`finish`, so no path carries a copy of a rule.

:class:`Passage` starts a request (request id, log context, gauge, clock, body ceiling);
:func:`admit` applies CORS, authentication and the route's methods, in that order;
:func:`meter` the principal's quotas on a route that calls a model (``usage_app.quotas`` registers
the rule: the kernel imports no app); :func:`finish` records metrics, the access log and 499 for an
unfinished answer, and frees the request's concurrency slot.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import lru_cache
from typing import Any, Protocol

from django.conf import settings
from django.urls import Resolver404, resolve

from gateway.core import errors, fastroutes
from gateway.core.auth import AuthResult, authenticate, authenticate_now
from gateway.core.config import get_config
from gateway.core.ids import request_id_for
from gateway.core.logging import log_access, request_id_var
from gateway.core.metrics import in_flight, observe_request
from gateway.core.principal import Principal, request_principal

RawHeaders = list[tuple[bytes, bytes]]

# Scope key of the request's Passage on the ASGI path.
PASSAGE = "gateway.passage"
# Scope key of the request id (errors.render reads it).
REQUEST_ID = "gateway.request_id"

ANY_METHOD: frozenset[str] = frozenset()


class QuotaTicket(Protocol):
    """An admitted request's quota state: the rate-limit headers of its answer, and its
    concurrency slot (freed by :meth:`release`)."""

    headers: RawHeaders

    def release(self) -> None: ...


# The quota rule, registered by ``usage_app`` in ``AppConfig.ready()``: for a principal and path, None
# when the principal has no limit (nothing to wait for), else the admission to await (it raises the 429).
quota_gate: Callable[[Principal, str], Awaitable[QuotaTicket] | None] | None = None


class Passage:
    """One HTTP request on its way through the rules (what :func:`admit` and :func:`finish` work on)."""

    __slots__ = ("cors", "method", "path", "quota", "refusal", "request_id", "started", "status", "token")

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
        self.quota: QuotaTicket | None = None  # set by meter(); its headers go on the answer
        limit = body_limit(method, path)
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self.refusal = body_too_large(method, path)
        in_flight(1)


# The file upload's own ceiling (``[files] max_upload_bytes``) replaces the JSON one on this route;
# the multipart framing around the file gets this much on top (the file itself is checked exactly
# while it is parsed, by ``files_app.upload``).
UPLOAD_ROUTE = ("POST", "/v1/files")
UPLOAD_FRAMING_BYTES = 64 * 1024


def body_limit(method: str, path: str) -> int:
    """The most body bytes a request may send: the upload route's own ceiling, else ``[server]``'s."""
    config = get_config()
    if (method, path) == UPLOAD_ROUTE:
        return config.files.max_upload_bytes + UPLOAD_FRAMING_BYTES
    return config.server.max_request_body_size_bytes


def body_too_large(method: str, path: str) -> errors.GatewayError:
    """The 413 for a body over :func:`body_limit` (the connection is closed after it)."""
    if (method, path) == UPLOAD_ROUTE:
        return errors.upload_too_large(get_config().files.max_upload_bytes)
    return errors.payload_too_large(get_config().server.max_request_body_size_bytes)


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
    passage: Passage,
    headers: Mapping[str, str],
    methods: frozenset[str] = ANY_METHOD,
    *,
    metered: bool = False,
) -> AuthResult:
    """:func:`admit`, waiting for authentication when it has to; ``metered``: a route that calls a
    model, so the principal's quotas apply (:func:`meter`)."""
    auth = admit(passage, headers, methods)
    if auth is None:
        auth = await authenticate(passage.path, headers)
        _check_method(passage, methods)
    if metered and quota_gate is not None:
        await meter(passage, auth.principal)
    return auth


async def meter(passage: Passage, principal: Principal) -> None:
    """The quota rule, once per request, before any upstream call: raises the 429 (nothing is
    counted then); an admitted request's ticket rides on ``passage`` until :func:`finish`."""
    gate = quota_gate
    if gate is None or passage.quota is not None:
        return
    pending = gate(principal, passage.path)
    if pending is not None:
        passage.quota = await pending


async def meter_request(request: Any) -> None:
    """:func:`meter` for a Django view that calls a model (its passage rides on the ASGI scope)."""
    scope = getattr(request, "scope", None)
    passage = scope.get(PASSAGE) if isinstance(scope, dict) else None
    if passage is not None and quota_gate is not None:
        await meter(passage, request_principal(request))


def _check_method(passage: Passage, methods: frozenset[str]) -> None:
    if methods and passage.method not in methods:
        raise errors.MethodNotAllowed(
            f"Method {passage.method} is not allowed on {passage.path}.",
            headers={"Allow": ", ".join(sorted(methods))},
        )


def finish(passage: Passage, status: int, route: str | None = None) -> None:
    """The request is over: metrics, in-flight, the access log (status 0: the client went away
    before a complete answer, logged 499), the concurrency slot freed, and the log context reset."""
    in_flight(-1)
    if passage.quota is not None:
        passage.quota.release()
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
