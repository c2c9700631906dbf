"""Process-level endpoints: liveness, readiness, metrics, and the envelope for unknown routes."""

from __future__ import annotations

import asyncio
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.core import errors
from gateway.core.config import get_config
from gateway.core.db import run_orm
from gateway.core.metrics import exposition


async def health(request: HttpRequest) -> HttpResponse:
    """Liveness: 200 while the process serves."""
    return JsonResponse({"status": "ok"})


def _database_ping() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


async def _probe(name: str, coro: Any, timeout: float) -> tuple[str, str | None]:
    try:
        async with asyncio.timeout(timeout):
            await coro
    except TimeoutError:
        return name, f"no answer within {timeout:g}s"
    except Exception as exc:
        return name, str(exc) or type(exc).__name__
    return name, None


async def _broker_ping(url: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        await client.ping()
    finally:
        await client.aclose()


async def ready(request: HttpRequest) -> HttpResponse:
    """Readiness: 200 only when the database answers, the inference backend is reachable and, with
    ``REDIS_URL``, the task broker answers (background responses and tool calls are sent there).
    With several HTTP upstreams, ``upstreams`` names each by base URL with its state."""
    from inference_app.upstream.http import get_upstream

    config = get_config()
    timeout = config.upstream.ready_timeout_s
    upstream = get_upstream()
    probes = [
        _probe("database", run_orm(_database_ping), timeout),
        _probe("upstream", upstream.ready(timeout), timeout + 0.1),
    ]
    if config.broker_enabled:
        probes.append(_probe("broker", _broker_ping(config.redis_url), timeout))
    results = await asyncio.gather(*probes)
    checks = {
        name: ({"status": "ok"} if err is None else {"status": "fail", "error": err}) for name, err in results
    }
    ok = all(err is None for _, err in results)
    body: dict[str, Any] = {"status": "ok" if ok else "fail", "checks": checks}
    states = getattr(upstream, "states", None)
    if states is not None:  # the upstream table (inference_app.upstream.table)
        body["upstreams"] = states()
    return JsonResponse(body, status=200 if ok else 503)


async def metrics(request: HttpRequest) -> HttpResponse:
    # In a thread: the inference queues' collector reads Redis, and several processes' files are read.
    return HttpResponse(await asyncio.to_thread(exposition), content_type=CONTENT_TYPE_LATEST)


async def head_root(request: HttpRequest) -> HttpResponse:
    """``HEAD /`` (Claude Code probes it) and ``GET /`` answer 200 cleanly."""
    if request.method not in ("HEAD", "GET"):
        raise errors.MethodNotAllowed(f"Method {request.method} is not allowed on /.")
    return JsonResponse({"status": "ok", "service": "agentic-gateway"})


async def unknown_route(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise errors.unknown_route(request.method or "", request.path)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return errors.django_response(errors.unknown_route(request.method or "", request.path), request)


def handler500(request: HttpRequest) -> HttpResponse:
    return errors.django_response(errors.server_error(), request)


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return errors.django_response(errors.BadRequest("Bad request.", code="bad_request"), request)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return errors.django_response(errors.PermissionDenied("Forbidden."), request)
