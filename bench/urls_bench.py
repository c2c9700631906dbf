"""Benchmark-only routes: an SSE stream of N events through the full Django stack."""

from collections.abc import AsyncIterator

from django.http import HttpRequest, StreamingHttpResponse
from django.urls import include, path

CHUNK = b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'


async def sse(request: HttpRequest) -> StreamingHttpResponse:
    n = int(request.GET.get("n", "100"))

    async def events() -> AsyncIterator[bytes]:
        for _ in range(n):
            yield CHUNK
        yield b"data: [DONE]\n\n"

    return StreamingHttpResponse(events(), content_type="text/event-stream")


urlpatterns = [path("bench/sse", sse), path("v1/bench/sse", sse), path("", include("gateway.urls"))]
