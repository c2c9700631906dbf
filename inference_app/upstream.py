"""The one upstream interface every feature uses, and its HTTP implementation.

``Upstream.send(method, path, body=…, headers=…, query=…)`` returns an :class:`UpstreamResponse`:
status, headers (hop-by-hop removed) and an async iterator over the body bytes exactly as the
upstream sent them (the interface and its types: :mod:`inference_app.upstream_types`, which the
implementations import; this module picks one in :func:`get_upstream`). Pass-through routes, the Responses executor and the Messages loop all call it;
the HTTP and worker implementations behave the same, byte for byte.

:class:`HttpUpstream` speaks HTTP/1.1 through a keep-alive pool per event loop (an
:class:`HttpClient`). The client is the lean one the below-ASGI relay is designed with,
``gateway.relay.http_client.HttpPool``; ``inference_app`` may not import the relay, so the gateway app
hands it over in ``AppConfig.ready()`` with :func:`use_http_client` (every process that sets Django
up: ``manage.py serve`` and the other commands, Celery workers, tests). Failures map to gateway
errors: connection refused / DNS → :class:`UpstreamError` (502); no response headers within the read
timeout, or a stream silent for longer than the stall timeout → :class:`UpstreamTimeout` (504).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from gateway import errors
from gateway.config import Config, UpstreamConfig, get_config
from inference_app.upstream_types import Body, Upstream, UpstreamResponse

log = logging.getLogger("gateway.upstream")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
    }
)
# Dropped from upstream responses: the gateway's own server writes these.
_RESPONSE_SKIP = HOP_BY_HOP | {"server", "date"}
# Dropped from client requests before forwarding (``expect`` is answered by our own server).
_REQUEST_SKIP = HOP_BY_HOP | {"host", "content-length", "expect"}


def forward_headers(
    incoming: Mapping[str, str] | list[tuple[str, str]],
    config: Config,
    *,
    caller_credential_consumed: bool = False,
) -> dict[str, str]:
    """Headers to send upstream for a client request.

    Hop-by-hop headers are dropped. The configured upstream credential (``OPENAI_API_KEY``) is
    injected only when the caller supplies none; a credential the gateway consumed (an OIDC token or
    a gateway API key) is removed first, so it never reaches the upstream.
    """
    items = incoming.items() if isinstance(incoming, dict | Mapping) else incoming
    out: dict[str, str] = {}
    for key, value in items:
        low = key.lower()
        if low in _REQUEST_SKIP:
            continue
        if caller_credential_consumed and low in ("authorization", "x-api-key"):
            continue
        out[low] = value
    upstream_key = config.openai_api_key.get_secret_value()
    if upstream_key and "authorization" not in out and "x-api-key" not in out:
        out["authorization"] = f"Bearer {upstream_key}"
    return out


class ResponseChunks(Protocol):
    """A response body as an :class:`HttpClient` hands it back: its chunks as they arrive."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def __anext__(self) -> bytes: ...

    async def aclose(self) -> None:
        """Hand the connection back to the pool when the body was read whole, else close it."""
        ...


class HttpClient(Protocol):
    """What :class:`HttpUpstream` needs of an HTTP client: keep-alive connections from one event loop
    to one base URL (``gateway.relay.http_client.HttpPool``)."""

    loop: asyncio.AbstractEventLoop
    closed: bool

    async def request(
        self, method: str, target: str, headers: Mapping[str, str], body: Body = None
    ) -> tuple[int, list[tuple[str, str]], ResponseChunks]:
        """Send one request (``target``: path and query below the base URL, ``headers`` lower-cased);
        status, headers and the body once the headers arrived."""
        ...

    def close(self) -> None:
        """Close the idle connections; busy ones close when their responses are done."""
        ...


class HttpClientFactory(Protocol):
    """Builds the :class:`HttpClient` for one base URL, on the running loop (``HttpPool`` itself)."""

    def __call__(
        self, base_url: str, timeouts: UpstreamConfig, *, drop_headers: frozenset[str] = ...
    ) -> HttpClient: ...


# The factory handed over at start-up (use_http_client).
_http_client: HttpClientFactory | None = None


def use_http_client(factory: HttpClientFactory) -> None:
    """Build :class:`HttpUpstream`'s pools with ``factory``. The gateway app calls it in
    ``AppConfig.ready()`` with the lean client of ``gateway.relay``."""
    global _http_client
    _http_client = factory


def http_client() -> HttpClientFactory:
    """The factory handed to :func:`use_http_client`; a clear error when Django was not set up."""
    if _http_client is None:
        raise RuntimeError(
            "no HTTP client for the upstream: the gateway app hands one over in AppConfig.ready() "
            "(set DJANGO_SETTINGS_MODULE=gateway.settings and call django.setup())"
        )
    return _http_client


class HttpUpstream:
    """An OpenAI-compatible server at ``LLM_API_BASE`` (vLLM, or any compatible server).

    ``client`` builds the keep-alive pool of each event loop (default: the one handed to
    :func:`use_http_client`)."""

    def __init__(self, config: Config, client: HttpClientFactory | None = None) -> None:
        self.config = config
        self.base = config.upstream_base
        self.client = client or http_client()
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpClient]
        self._pools = weakref.WeakKeyDictionary()
        self._last: HttpClient | None = None  # the last one used: one loop per process is the rule
        _http_upstreams.add(self)

    def pool(self, loop: asyncio.AbstractEventLoop | None = None) -> HttpClient:
        """One keep-alive pool per event loop (never one per request, never shared across loops).

        ``loop`` is the running loop, when the caller has it (asking for it costs a ``getpid()``).
        """
        if loop is None:
            loop = asyncio.get_running_loop()
        pool = self._last
        if pool is None or pool.loop is not loop or pool.closed:
            pool = self._pools.get(loop)
            if pool is None or pool.closed:
                pool = self.client(self.base, self.config.upstream, drop_headers=_RESPONSE_SKIP)
                self._pools[loop] = pool
            self._last = pool
        return pool

    async def aclose(self) -> None:
        """Close this loop's pool (on server shutdown)."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            pool.close()

    def url(self, path: str, query: str = "") -> str:
        return f"{self.base}{path}" + (f"?{query}" if query else "")

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        headers: Mapping[str, str] | None = None,
        query: str = "",
    ) -> UpstreamResponse:
        status, response_headers, chunks = await self.pool().request(
            method, f"{path}?{query}" if query else path, headers or {}, body
        )
        return UpstreamResponse(status, response_headers, chunks)

    async def ready(self, timeout: float) -> None:
        pool = self.pool()
        headers = {}
        if upstream_key := self.config.openai_api_key.get_secret_value():
            headers["authorization"] = f"Bearer {upstream_key}"
        async with asyncio.timeout(timeout):
            status, _, body = await pool.request("GET", "/health", headers)
            await _drain(body)
            if status == 200:
                return
            # Not every OpenAI-compatible server has /health; its model list proves it serves.
            status, _, body = await pool.request("GET", "/v1/models", headers)
            await _drain(body)
            if status != 200:
                raise RuntimeError(f"upstream answered {status}")


async def _drain(body: ResponseChunks) -> None:
    try:
        async for _ in body:
            pass
    finally:
        await body.aclose()


class UnconfiguredUpstream:
    """No ``LLM_API_BASE``, no broker and no embedded engine: every call says so clearly."""

    message = (
        "No inference backend is configured: set LLM_API_BASE to an OpenAI-compatible server "
        "(for example a vLLM server), or REDIS_URL with Celery inference workers, or install the "
        "inference dependencies (make install-inference) to host the engine in the gateway."
    )

    async def send(self, method: str, path: str, **kwargs: Any) -> UpstreamResponse:
        raise errors.ServiceUnavailable(self.message, code="no_inference_backend")

    async def ready(self, timeout: float) -> None:
        raise RuntimeError("no inference backend configured (LLM_API_BASE is not set)")


_upstreams: dict[int, Upstream] = {}
_http_upstreams: weakref.WeakSet[HttpUpstream] = weakref.WeakSet()


async def close_upstreams() -> None:
    """Close every pooled upstream client that belongs to the running event loop."""
    for upstream in list(_http_upstreams):
        await upstream.aclose()


def embedded_engine_available() -> bool:
    """vLLM is installed here (``make install-inference``), so the gateway can host the engine."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def get_upstream() -> Upstream:
    """The upstream for the current config (cached per config object)."""
    config = get_config()
    key = id(config)
    upstream = _upstreams.get(key)
    if upstream is None:
        _upstreams.clear()
        if config.llm_api_base:
            upstream = HttpUpstream(config)
        elif config.broker_enabled:
            from inference_app.worker_upstream import WorkerUpstream

            upstream = WorkerUpstream(config)
        elif embedded_engine_available():
            from inference_app.embedded import EmbeddedUpstream

            upstream = EmbeddedUpstream(config)
        else:
            upstream = UnconfiguredUpstream()
        _upstreams[key] = upstream
    return upstream
