"""The one upstream interface every feature uses, and its HTTP implementation.

``Upstream.send(...)`` returns an :class:`UpstreamResponse` whose body is the upstream's bytes as
sent (types in :mod:`inference_app.upstream.types`; :func:`get_upstream` picks one). The HTTP and
worker implementations behave the same, byte for byte. :class:`HttpUpstream` uses aiohttp:
connection failures are 502, no head within the read timeout or a stalled stream 504.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.core import errors, metrics
from gateway.core.config import Config, UpstreamEntry, get_config
from inference_app.upstream import lineage
from inference_app.upstream.types import Body, Upstream, UpstreamResponse

if TYPE_CHECKING:
    from gateway.core.outbound import Session

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
    """Headers to send upstream: hop-by-hop dropped, a credential the gateway consumed removed, and the
    configured ``OPENAI_API_KEY`` injected only when the caller sent none."""
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


class HttpUpstream:
    """One OpenAI-compatible server (``entry``; default the first of the upstream table) through
    :func:`gateway.core.outbound.pass_through`: one keep-alive session per event loop, closed by
    :func:`close_upstreams`."""

    def __init__(self, config: Config, entry: UpstreamEntry | None = None) -> None:
        from gateway.core import outbound  # aiohttp is loaded only where an HTTP upstream is used

        if entry is None and config.upstream_entries:
            entry = config.upstream_entries[0]
        self.config = config
        self.base = entry.base if entry is not None else config.upstream_base
        self.api_key = (entry.api_key if entry is not None else config.openai_api_key).get_secret_value()
        self._default_key = config.openai_api_key.get_secret_value()
        self._session_header = config.routing.session_header.lower()
        self._outbound = outbound
        self._probed_up = True
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Session]
        self._sessions = weakref.WeakKeyDictionary()
        _http_upstreams.add(self)

    def session(self) -> Session:
        """This event loop's session (never one per request, never shared across loops)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            upstream = self.config.upstream
            session = self._outbound.pass_through_session(upstream.pool_size, upstream.connect_timeout_s)
            self._sessions[loop] = session
        return session

    async def aclose(self) -> None:
        """Close this loop's session (on server shutdown, or when a task's loop ends)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    def url(self, path: str, query: str = "") -> str:
        return f"{self.base}{path}" + (f"?{query}" if query else "")

    def outgoing_headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """``headers`` with this server's own key in place of the gateway's ``OPENAI_API_KEY`` (which
        :func:`forward_headers` injects), and the lineage's session header when configured."""
        default, session_header = self._default_key, self._session_header
        key = lineage.current() if session_header else None
        if self.api_key == default and key is None:
            return headers  # one LLM_API_BASE: the headers go out exactly as given
        out = {name.lower(): value for name, value in headers.items()}
        if self.api_key != default:
            injected = bool(default) and out.get("authorization") == f"Bearer {default}"
            if injected or ("authorization" not in out and "x-api-key" not in out):
                out.pop("authorization", None)
                if self.api_key:
                    out["authorization"] = f"Bearer {self.api_key}"
        if key is not None:
            out[session_header] = key
        return out

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        headers: Mapping[str, str] | None = None,
        query: str = "",
    ) -> UpstreamResponse:
        upstream = self.config.upstream
        status, response_headers, chunks = await self._outbound.pass_through(
            self.session(),
            method,
            self.url(path, query),
            headers=self.outgoing_headers(headers or {}),
            body=body,
            drop_headers=_RESPONSE_SKIP,
            read_timeout_s=upstream.read_timeout_s,
            stall_timeout_s=upstream.stall_timeout_s,
        )
        return UpstreamResponse(status, response_headers, chunks)

    async def ready(self, timeout: float) -> None:
        headers = {}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        try:
            async with asyncio.timeout(timeout):
                # Not every OpenAI-compatible server has /health; its model list proves it serves.
                for path in ("/health", "/v1/models"):
                    response = await self.send("GET", path, headers=headers)
                    await response.aclose()
                    if response.status == 200:
                        self._probed_up = True
                        return
                raise RuntimeError(f"upstream answered {response.status}")
        except BaseException:
            self._probed_up = False
            raise
        finally:
            metrics.upstream_up(self.base, self._probed_up)

    def states(self) -> dict[str, dict[str, Any]]:
        """For ``/ready``: this upstream by base URL, ``up`` or ``down`` as its last probe found it
        (one upstream has no back-off: every request still goes to it)."""
        return {self.base: {"state": "up" if self._probed_up else "down"}}


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


# The in-process engine's upstream (inference_app.engine.embedded), registered by the app's ready():
# the engine sits above this layer.
_embedded: Callable[[Config], Upstream] | None = None


def use_embedded_engine(factory: Callable[[Config], Upstream]) -> None:
    global _embedded
    _embedded = factory


def get_upstream() -> Upstream:
    """The upstream for the current config (cached per config object)."""
    config = get_config()
    key = id(config)
    upstream = _upstreams.get(key)
    if upstream is None:
        _upstreams.clear()
        if config.http_upstreams:
            if len(config.upstream_entries) == 1:
                upstream = HttpUpstream(config)
            else:
                from inference_app.upstream.table import UpstreamTable

                upstream = UpstreamTable(config)
        elif config.broker_enabled:
            from inference_app.upstream.worker import WorkerUpstream

            upstream = WorkerUpstream(config)
        elif _embedded is not None and embedded_engine_available():
            upstream = _embedded(config)
        else:
            upstream = UnconfiguredUpstream()
        _upstreams[key] = upstream
    return upstream
