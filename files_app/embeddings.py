"""Embeddings for file search: OpenAI's ``/v1/embeddings`` on ``[file_search] embedding_base_url``, or
on the configured upstream when it is "" (docs/file-search.md). Ingestion embeds chunks, retrieval
embeds queries, both through :func:`embed`. Vectors are stored as float32 little-endian bytes
(:func:`pack` / :func:`unpack`).
"""

from __future__ import annotations

import asyncio
import sys
from array import array
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.core import errors
from gateway.core.config import Config, UpstreamEntry
from inference_app.upstream.types import Upstream

# Inputs per /v1/embeddings request, and requests in flight at once for one call.
BATCH_SIZE = 64
CONCURRENT_BATCHES = 4


def pack(vector: Sequence[float]) -> bytes:
    """float32 little-endian bytes of ``vector`` (``Chunk.embedding``)."""
    values = array("f", vector)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


def unpack(data: bytes | memoryview) -> array[float]:
    """The vector :func:`pack` stored."""
    values = array("f")
    values.frombytes(bytes(data))
    if sys.byteorder == "big":
        values.byteswap()
    return values


def other_space(store_embedding_model: str, config: Config) -> bool:
    """Whether a store was built in another embedding space than the configured one: it is searched
    by keyword only, and files are not attached to it. A store with no recorded model ("") is not:
    its first ingested file records the configured model."""
    return bool(store_embedding_model) and store_embedding_model != config.file_search.embedding_model


_own_upstreams: dict[tuple[int, str], Upstream] = {}


def _target(config: Config) -> tuple[Upstream, dict[str, str]]:
    """The upstream that embeds, and its headers: ``embedding_base_url`` (sent no credential of the
    gateway's) or the configured upstream (with ``OPENAI_API_KEY`` when set)."""
    from inference_app.upstream.http import HttpUpstream, get_upstream

    headers = {"content-type": "application/json"}
    base = config.file_search.embedding_base_url
    if base:
        key = (id(config), base)
        upstream = _own_upstreams.get(key)
        if upstream is None:
            _own_upstreams.clear()
            # Its own keep-alive pool with the upstream's timeouts; no key of the main upstream.
            upstream = _own_upstreams[key] = HttpUpstream(config, UpstreamEntry(base_url=base))
        return upstream, headers
    if api_key := config.openai_api_key.get_secret_value():
        headers["authorization"] = f"Bearer {api_key}"
    return get_upstream(), headers


async def embed(texts: list[str], config: Config) -> list[list[float]]:
    """One vector per text, in order, from ``[file_search] embedding_model``; an
    :class:`errors.UpstreamError` (or the upstream's 5xx/timeout error) with a clear message when the
    embedding server fails or answers something else than one vector per input, all of one size."""
    model = config.file_search.embedding_model
    if not model:
        raise errors.ServerError("No embedding model is configured ([file_search] embedding_model).")
    if not texts:
        return []
    upstream, headers = _target(config)
    gate = asyncio.Semaphore(CONCURRENT_BATCHES)

    async def batch(part: list[str]) -> list[list[float]]:
        async with gate:
            return await _embed_batch(upstream, headers, model, part)

    parts = [texts[i : i + BATCH_SIZE] for i in range(0, len(texts), BATCH_SIZE)]
    results = await asyncio.gather(*(batch(part) for part in parts))
    vectors = [vector for part in results for vector in part]
    dims = {len(v) for v in vectors}
    if len(dims) != 1:
        raise errors.UpstreamError(
            f"The embedding model {model!r} returned vectors of different sizes ({sorted(dims)}).",
            code="embedding_failed",
        )
    return vectors


async def _embed_batch(
    upstream: Upstream, headers: dict[str, str], model: str, texts: list[str]
) -> list[list[float]]:
    body = orjson.dumps({"model": model, "input": texts, "encoding_format": "float"})
    response = await upstream.send("POST", "/v1/embeddings", body=body, headers=headers)
    try:
        payload = await response.read()
    finally:
        await response.aclose()
    if response.status != 200:
        raise errors.UpstreamError(
            f"The embedding model {model!r} failed (HTTP {response.status}): {_error_message(payload)}",
            code="embedding_failed",
        )
    try:
        data = orjson.loads(payload)["data"]
        by_index = {int(item["index"]): item["embedding"] for item in data}
        vectors = [[float(x) for x in by_index[i]] for i in range(len(texts))]
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        raise errors.UpstreamError(
            f"The embedding model {model!r} did not answer one float vector per input "
            "(OpenAI's /v1/embeddings format).",
            code="embedding_failed",
        ) from None
    if any(not v for v in vectors):
        raise errors.UpstreamError(
            f"The embedding model {model!r} returned an empty vector.", code="embedding_failed"
        )
    return vectors


def _error_message(payload: bytes) -> str:
    try:
        body: Any = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload[:200].decode(errors="replace") or "no body"
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:500]
        if isinstance(body.get("message"), str):  # vLLM's older error shape
            return str(body["message"])[:500]
    return payload[:200].decode(errors="replace")
