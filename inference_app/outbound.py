"""The one general-purpose HTTP client for the outbound calls our own code makes.

OIDC discovery and JWKS (``gateway.auth``), the web search tool and the web fetch tool call out
through here, on aiohttp. The library's timeout and error types are mapped to ours once, in
:meth:`Client.fetch`; callers catch :class:`OutboundError` (or one of its kinds) and never an
aiohttp type. Every call has a whole-call timeout and a cap on the body it reads.

Not here: the upstream LLM client (``inference_app/http_client.py`` and the relay's lean client,
designed for the pass-through's speed) and the clients that libraries bring (mozilla-django-oidc's
``requests``, the MCP SDK's ``httpx``).
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
from asgiref.sync import async_to_sync
from multidict import CIMultiDictProxy


class OutboundError(Exception):
    """An outbound call failed; the message names the URL and why."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


class OutboundTimeout(OutboundError):
    """No complete answer within the call's timeout."""


class OutboundUnreachable(OutboundError):
    """No answer at all: DNS, connection refused or reset, TLS, a broken response."""


class OutboundTooLarge(OutboundError):
    """The answer's body is over the call's ``max_bytes``."""


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

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


class Client:
    """One session for several calls (``async with Client(timeout_s=…) as client``); every call is
    bounded by ``timeout_s`` as a whole."""

    def __init__(self, *, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_s), headers=self.headers
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
    ) -> Fetched:
        """One request and its whole body; redirects are answers unless ``allow_redirects``."""
        if self._session is None:
            raise RuntimeError("Client.fetch outside `async with Client(...)`")
        try:
            async with self._session.request(
                method, url, params=params, headers=headers, data=data, allow_redirects=allow_redirects
            ) as resp:
                if resp.content_length is not None and resp.content_length > max_bytes:
                    raise OutboundTooLarge(
                        f"{url} answered {resp.content_length} bytes (limit {max_bytes})", url
                    )
                body = bytearray()
                while chunk := await resp.content.readany():
                    body += chunk
                    if len(body) > max_bytes:
                        raise OutboundTooLarge(f"{url} answered more than {max_bytes} bytes", url)
                return Fetched(str(resp.url), resp.status, resp.headers, bytes(body))
        except TimeoutError:
            raise OutboundTimeout(f"{url} did not answer within {self.timeout_s:g}s", url) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise OutboundUnreachable(f"could not fetch {url}: {type(exc).__name__}: {exc}", url) from None

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
