"""The upstream interface (:class:`Upstream`, ``send`` → :class:`UpstreamResponse`) and its shared
types, apart from :func:`inference_app.upstream.http.get_upstream` so that no implementation
imports the module that chooses it."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any, Protocol

import orjson

from gateway.core.config import Config

__all__ = ["Body", "Upstream", "UpstreamResponse", "model_cards", "read_body"]

Body = bytes | AsyncIterable[bytes] | None


async def read_body(body: Body) -> bytes:
    """A request body in one piece (for upstreams that cannot stream a request body)."""
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    return b"".join([chunk async for chunk in body])


def model_cards(body: bytes) -> list[dict[str, Any]] | None:
    """The cards (``data`` entries with a string ``id``) of an OpenAI ``/v1/models`` answer, or
    ``None`` when the body is not a model list."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list):
        return None
    return [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]


class UpstreamResponse:
    """An upstream answer whose body is read lazily, chunk by chunk, as it arrives."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]],
        chunks: AsyncIterator[bytes],
        close: Any = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self._chunks = chunks
        self._close = close

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def content_type(self) -> str:
        return (self.header("content-type") or "").split(";")[0].strip().lower()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks

    @property
    def complete(self) -> bool:
        """Whether the body is known to have arrived whole (an HTTP body that has seen its end);
        False when that cannot be told (a worker's or the embedded engine's stream)."""
        return bool(getattr(self._chunks, "complete", False))

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self._chunks]
        return b"".join(parts)

    async def aclose(self) -> None:
        # The body iterator first: a fully read body hands its connection back to the pool there;
        # only then is whatever is left (an unread or partly read body) closed for good.
        aclose = getattr(self._chunks, "aclose", None)
        if aclose is not None:
            await aclose()
        if self._close is not None:
            close, self._close = self._close, None
            close()


class Upstream(Protocol):
    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        headers: Mapping[str, str] | None = None,
        query: str = "",
    ) -> UpstreamResponse: ...

    async def ready(self, timeout: float) -> None:
        """Return when the backend answers; raise when it does not."""
        ...


# The name the tiny demo model (manage.py build_tiny_model) is served under.
DEMO_MODEL_NAME = "tiny-chat"


def served_name(config: Config) -> str:
    """The name clients send as ``model`` for this engine (vLLM: first served name, else the model)."""
    if config.inference.served_model_name:
        return config.inference.served_model_name
    if not config.model:
        return DEMO_MODEL_NAME
    return config.model


def is_demo_model(config: Config) -> bool:
    return not config.model
