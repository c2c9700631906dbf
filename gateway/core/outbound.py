"""The one outbound HTTP client of our own code, on aiohttp.

:func:`pass_through` relays to the upstream model server byte for byte; :class:`Client` makes the
bounded calls of OIDC, web search and web fetch. aiohttp's errors are mapped here: the upstream's to
502/504, the others to :class:`OutboundError`. Libraries keep their own clients (mozilla-django-oidc,
the MCP SDK).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json as jsonlib
import logging
import socket
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from asgiref.sync import async_to_sync
from multidict import CIMultiDictProxy
from yarl import URL

from gateway.core import errors

log = logging.getLogger("gateway.upstream")


class OutboundError(Exception):
    """An outbound call failed; the message names the URL and why."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


class OutboundTimeout(OutboundError):
    """No complete answer within the call's timeout."""


class OutboundUnreachable(OutboundError):
    """No answer at all: DNS, connection refused or reset, TLS, a broken response; ``reason`` names
    the kind of failure (the library's exception type)."""

    def __init__(self, message: str, url: str, reason: str) -> None:
        super().__init__(message, url)
        self.reason = reason


class OutboundTooLarge(OutboundError):
    """The answer's body is over the call's ``max_bytes``; ``declared`` is its Content-Length when
    that alone was over."""

    def __init__(self, message: str, url: str, limit: int, declared: int | None = None) -> None:
        super().__init__(message, url)
        self.limit = limit
        self.declared = declared


class OutboundRefused(OutboundError):
    """The client's ``connect_check`` refused the addresses ``host`` resolves to."""

    def __init__(self, message: str, url: str, host: str) -> None:
        super().__init__(message, url)
        self.host = host


class OutboundStatus(OutboundError):
    """An answer whose status the caller did not accept (``get_json``: anything but 200)."""

    def __init__(self, message: str, url: str, status: int, body: bytes) -> None:
        super().__init__(message, url)
        self.status = status
        self.body = body


class OutboundNotJson(OutboundError):
    """A 200 answer whose body is not JSON."""


@dataclass(frozen=True)
class Fetched:
    """A complete answer: status, headers, the body (at most ``max_bytes``) and the URL it came from."""

    url: str
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    charset: str | None = None

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


ConnectCheck = Callable[[str, Sequence[str]], bool]
"""``(host, addresses) -> allowed``: whether the client may connect to ``host`` at ``addresses``."""

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10


class _Refused(OSError):
    def __init__(self, host: str) -> None:
        super().__init__(f"host {host!r} resolves to a refused address")
        self.host = host


class _CheckingResolver(AbstractResolver):
    """aiohttp's threaded resolver, with ``connect_check`` applied to the answers the connection uses."""

    def __init__(self, check: ConnectCheck) -> None:
        self._inner: aiohttp.ThreadedResolver | None = None
        self._check = check

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if self._inner is None:
            self._inner = aiohttp.ThreadedResolver()
        answers = await self._inner.resolve(host, port, family)
        name = host.rstrip(".")
        if not self._check(name, [a["host"] for a in answers]):
            raise _Refused(name)
        return answers

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


def _refused_cause(exc: BaseException) -> _Refused | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _Refused):
            return seen
        seen = getattr(seen, "os_error", None) or seen.__cause__
    return None


class Client:
    """One session for several calls (``async with Client(timeout_s=…) as client``); every call is
    bounded by ``timeout_s`` as a whole. ``connect_check``: see the module's docstring."""

    def __init__(
        self,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
        connect_check: ConnectCheck | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.connect_check = connect_check
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        connector = None
        if self.connect_check is not None:
            connector = aiohttp.TCPConnector(
                resolver=_CheckingResolver(self.connect_check), use_dns_cache=False
            )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s), headers=self.headers
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def fetch(
        self,
        method: str,
        url: str,
        *,
        max_bytes: int,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        allow_redirects: bool = False,
        read_body: Callable[[int], bool] | None = None,
    ) -> Fetched:
        """One request and its whole body; redirects are answers unless ``allow_redirects``. With
        ``read_body``, an answer whose status it rejects comes back with an empty body, unread."""
        if self._session is None:
            raise RuntimeError("Client.fetch outside `async with Client(...)`")
        try:
            if self.connect_check is None:
                return await self._once(
                    method, url, max_bytes, params, headers, data, allow_redirects, read_body
                )

            # Followed by hand, so that every hop's IP-literal host meets the check too.
            def read_hop(status: int) -> bool:
                if allow_redirects and status in _REDIRECTS:
                    return False
                return read_body is None or read_body(status)

            for _hop in range(_MAX_REDIRECTS + 1):
                self._check_literal(url)
                fetched = await self._once(method, url, max_bytes, params, headers, data, False, read_hop)
                location = fetched.headers.get("Location")
                if not allow_redirects or fetched.status not in _REDIRECTS or not location:
                    return fetched
                url, params = urljoin(fetched.url, location), None
                if fetched.status == 303 or (fetched.status in (301, 302) and method == "POST"):
                    method, data = "GET", None
            raise OutboundUnreachable(f"{url}: more than {_MAX_REDIRECTS} redirects", url, "TooManyRedirects")
        except TimeoutError:
            raise OutboundTimeout(f"{url} did not answer within {self.timeout_s:g}s", url) from None
        except (aiohttp.ClientError, OSError) as exc:
            refused = _refused_cause(exc)
            if refused is not None:
                raise OutboundRefused(f"could not fetch {url}: {refused}", url, refused.host) from None
            raise OutboundUnreachable(
                f"could not fetch {url}: {type(exc).__name__}: {exc}", url, type(exc).__name__
            ) from None

    def _check_literal(self, url: str) -> None:
        assert self.connect_check is not None
        host = (urlsplit(url).hostname or "").strip("[]")
        try:
            address = ipaddress.ip_address(host).compressed
        except ValueError:
            return  # a name: the resolver checks its answers
        if not self.connect_check(host, [address]):
            raise _Refused(host)

    async def _once(
        self,
        method: str,
        url: str,
        max_bytes: int,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
        data: bytes | None,
        allow_redirects: bool,
        read_body: Callable[[int], bool] | None,
    ) -> Fetched:
        assert self._session is not None
        async with self._session.request(
            method, url, params=params, headers=headers, data=data, allow_redirects=allow_redirects
        ) as resp:
            if read_body is not None and not read_body(resp.status):
                return Fetched(str(resp.url), resp.status, resp.headers, b"", resp.charset)
            if resp.content_length is not None and resp.content_length > max_bytes:
                raise OutboundTooLarge(
                    f"{url} answered {resp.content_length} bytes (limit {max_bytes})",
                    url,
                    max_bytes,
                    resp.content_length,
                )
            body = bytearray()
            while chunk := await resp.content.readany():
                body += chunk
                if len(body) > max_bytes:
                    raise OutboundTooLarge(f"{url} answered more than {max_bytes} bytes", url, max_bytes)
            return Fetched(str(resp.url), resp.status, resp.headers, bytes(body), resp.charset)

    async def get_json(
        self,
        url: str,
        *,
        max_bytes: int,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "GET",
        data: bytes | None = None,
    ) -> Any:
        """The JSON of a 200 answer; any other status is :class:`OutboundStatus`."""
        fetched = await self.fetch(
            method,
            url,
            max_bytes=max_bytes,
            params=params,
            headers={"Accept": "application/json", **(headers or {})},
            data=data,
        )
        if fetched.status != 200:
            raise OutboundStatus(f"{url} answered HTTP {fetched.status}", url, fetched.status, fetched.body)
        try:
            return jsonlib.loads(fetched.body)
        except ValueError:
            raise OutboundNotJson(f"{url} did not answer JSON", url) from None


async def fetch(method: str, url: str, *, timeout_s: float, max_bytes: int, **kwargs: Any) -> Fetched:
    """One call on its own session: see :meth:`Client.fetch`."""
    async with Client(timeout_s=timeout_s) as client:
        return await client.fetch(method, url, max_bytes=max_bytes, **kwargs)


async def get_json(url: str, *, timeout_s: float, max_bytes: int, **kwargs: Any) -> Any:
    """One JSON GET on its own session: see :meth:`Client.get_json`."""
    async with Client(timeout_s=timeout_s) as client:
        return await client.get_json(url, max_bytes=max_bytes, **kwargs)


def get_json_sync(url: str, *, timeout_s: float, max_bytes: int, **kwargs: Any) -> Any:
    """:func:`get_json` for sync code (admin single sign-on), on its own event loop thread."""
    return async_to_sync(get_json)(url, timeout_s=timeout_s, max_bytes=max_bytes, **kwargs)


# --- the upstream model server: bytes passed through --------------------------------------------

UNREACHABLE = "Could not reach the upstream model server."
MID_RESPONSE = "The upstream connection failed mid-response."
# An idle connection older than this is closed, not reused: vLLM's server (uvicorn) closes idle
# keep-alive connections after 5 s, and a request sent as it does so fails.
IDLE_REUSE_S = 4.0
# Unread answer bytes buffered per connection before its socket stops being read. Bodies are read
# with ``readany``: the SSE line limit is the SSE parser's.
READ_BUFSIZE = 256 * 1024

Session = aiohttp.ClientSession


def pass_through_session(pool_size: int, connect_timeout_s: float) -> Session:
    """A keep-alive session for :func:`pass_through`: at most ``pool_size`` connections, bodies not
    decompressed, no headers of aiohttp's own added, no cookies kept."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=pool_size, limit_per_host=0, keepalive_timeout=IDLE_REUSE_S),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        read_bufsize=READ_BUFSIZE,
    )


async def pass_through(
    session: Session,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes | AsyncIterable[bytes] | None,
    drop_headers: frozenset[str],
    read_timeout_s: float,
    stall_timeout_s: float,
) -> tuple[int, list[tuple[str, str]], Chunks]:
    """Send one request; status, lower-cased headers and the body once the head arrived within
    ``read_timeout_s``. ``url`` is sent as given; failures are a 502 or 504."""
    replayable = not isinstance(body, AsyncIterable)
    if replayable and ("content-length" in headers or "transfer-encoding" in headers):
        headers = {k: v for k, v in headers.items() if k not in ("content-length", "transfer-encoding")}
    target = URL(url, encoded=True)
    for attempt in (0, 1):
        try:
            async with asyncio.timeout(read_timeout_s):
                resp = await session.request(
                    method, target, headers=headers, data=body, allow_redirects=False
                )
            break
        except aiohttp.ConnectionTimeoutError:
            connect = session.timeout.sock_connect
            raise errors.UpstreamTimeout(
                f"Could not connect to the upstream model server within {connect:g}s."
            ) from None
        except TimeoutError:
            raise errors.UpstreamTimeout(
                f"The upstream model server did not answer within {read_timeout_s:g}s."
            ) from None
        except ValueError as exc:  # aiohttp refuses a header that could smuggle a second request
            raise errors.BadRequest(f"The request cannot be forwarded: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            # A malformed or cut-off answer (then the partly parsed head is the message) was sent by
            # a server that was reached.
            answered = isinstance(exc, aiohttp.ClientResponseError) or (
                isinstance(exc, aiohttp.ServerDisconnectedError) and not isinstance(exc.message, str)
            )
            if (
                attempt == 0
                and replayable
                and isinstance(exc, aiohttp.ServerDisconnectedError)
                and not answered
            ):
                continue  # a pooled connection the server closed as it was reused: sent again once
            # The detail (host, port, OS error) goes to the log, not to the client.
            log.warning("upstream %s %s failed: %s: %s", method, url, type(exc).__name__, exc)
            raise errors.UpstreamError(MID_RESPONSE if answered else UNREACHABLE) from None
    kept = [
        (name, value.decode("latin-1"))
        for raw, value in resp.raw_headers
        if (name := raw.decode("latin-1").lower()) not in drop_headers
    ]
    return resp.status, kept, Chunks(resp, stall_timeout_s)


class Chunks:
    """An answer's body, each chunk handed on as soon as it is read.

    A wait of ``stall_s`` for the next chunk is an :class:`errors.UpstreamTimeout`. Read whole, the
    connection goes back to the pool; closed earlier, it is closed.
    """

    __slots__ = ("_loop", "_read", "_resp", "_stall", "_stalled", "_timer", "_waiting")

    def __init__(self, resp: aiohttp.ClientResponse, stall_s: float) -> None:
        self._resp = resp
        self._read = resp.content.readany
        self._loop = asyncio.get_running_loop()
        self._stall = stall_s
        self._stalled = False
        self._waiting = 0.0  # when the wait going on began (0: none)
        self._timer = self._loop.call_later(stall_s, self._watch)

    def __aiter__(self) -> Chunks:
        return self

    @property
    def complete(self) -> bool:
        """Whether the whole body has arrived."""
        return self._resp.content.is_eof()

    async def __anext__(self) -> bytes:
        self._waiting = self._loop.time()
        try:
            chunk = await self._read()
        except BaseException as exc:
            self._end()
            if self._stalled:
                raise errors.UpstreamTimeout(
                    f"The upstream stream stalled for more than {self._stall:g}s."
                ) from None
            if isinstance(exc, aiohttp.ClientError | OSError):
                log.warning("upstream connection failed mid-response: %s: %s", type(exc).__name__, exc)
                raise errors.UpstreamError(MID_RESPONSE) from None
            raise
        self._waiting = 0.0
        if chunk:
            return chunk
        self._end()
        raise StopAsyncIteration

    def _watch(self) -> None:
        since, now = self._waiting, self._loop.time()
        if since and now - since >= self._stall:
            self._stalled = True
            self._resp.close()  # the waiting read fails at once
        else:
            self._timer = self._loop.call_at((since or now) + self._stall, self._watch)

    def _end(self) -> None:
        self._timer.cancel()
        if self._resp.content.is_eof():
            self._resp.release()
        else:
            self._resp.close()

    async def aclose(self) -> None:
        self._end()
