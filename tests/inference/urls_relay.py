"""Test URLconf: the gateway's routes plus a minimal relay to ``get_upstream()``.

The pass-through views (chat/completions, completions, models …) are another issue's work; until they
are merged, this relay stands in for them so the inference tests run through the real gateway (ASGI
app, middleware, uvicorn on a loopback port). Routes the gateway already has take precedence, so once
the real pass-through routes exist these tests exercise them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import re_path

from gateway import urls as gateway_urls
from gateway.core import errors
from gateway.core.config import get_config
from inference_app.upstream.http import forward_headers, get_upstream

RELAYED = r"^(?P<path>v1/chat/completions|v1/completions|v1/models|v1/responses|tokenize|detokenize)$"


async def relay(request: HttpRequest, path: str) -> HttpResponse:
    return await _relay(request, "/" + path)


async def upstream_health(request: HttpRequest) -> HttpResponse:
    return await _relay(request, "/health")


async def _relay(request: HttpRequest, path: str) -> HttpResponse:
    headers = forward_headers(dict(request.headers), get_config())
    upstream = await get_upstream().send(
        request.method or "GET",
        path,
        body=request.body or None,
        headers=headers,
        query=request.META.get("QUERY_STRING", ""),
    )
    if upstream.content_type != "text/event-stream":
        body = await upstream.read()
        response = HttpResponse(body, status=upstream.status)
    else:

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream:
                    yield chunk
            except errors.GatewayError as exc:
                yield errors.openai_sse_error(exc)
            finally:
                await upstream.aclose()

        response = StreamingHttpResponse(stream(), status=upstream.status)
    for key, value in upstream.headers:
        if key.lower() != "content-length":
            response[key] = value
    return response


urlpatterns = [p for p in gateway_urls.urlpatterns if getattr(p.pattern, "_regex", "") != r"^v1/.*$"]
urlpatterns += [re_path(RELAYED, relay), re_path(r"^upstream-health$", upstream_health)]
urlpatterns += [p for p in gateway_urls.urlpatterns if getattr(p.pattern, "_regex", "") == r"^v1/.*$"]
