"""The usage ledger's one entry point: every model call that reaches an upstream is reported here once.

Callers build a :class:`UsageEntry` when the call is over (its usage read from the answer as it
passed) and hand it to :func:`record`, which counts the metrics, charges the principal's token quotas
and queues the row for the batch writer; a stored response's rounds use :func:`observe` instead and
write their rows in the response's own final write (:func:`rows`). Neither ever raises to the caller
nor waits for the database. With ``[usage] ledger = false`` (:func:`enabled`) all three do nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.core.config import get_config
from gateway.core.principal import Principal

# Routes whose calls OpenAI's Usage API counts under /usage/completions and /usage/embeddings.
COMPLETIONS_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/responses/compact",
        "/v1/messages",
    }
)
EMBEDDINGS_ROUTES = frozenset({"/v1/embeddings"})


def kind_of(route: str) -> str:
    """``completions``, ``embeddings`` or ``other`` (count_tokens, audio, vLLM's own routes)."""
    if route in COMPLETIONS_ROUTES:
        return "completions"
    if route in EMBEDDINGS_ROUTES:
        return "embeddings"
    return "other"


@dataclass(slots=True)
class UsageEntry:
    """One model call. Token counts are the upstream's (``None``: it reported none)."""

    principal: Principal
    route: str  # the public route that caused the call ("/v1/responses" for every Responses round)
    model: str
    status: int  # the upstream's HTTP status; 499 when the client left first, 502/504 when it failed
    started_at: float  # time.time() when the call was sent
    latency_ms: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    response_id: str = ""
    request_id: str = ""

    @property
    def kind(self) -> str:
        return kind_of(self.route)

    @property
    def tokens(self) -> int:
        """What a token quota is charged: input plus output."""
        return (self.input_tokens or 0) + (self.output_tokens or 0)


def since(started: float) -> int:
    """Milliseconds from ``started`` (a ``time.perf_counter()`` reading) to now."""
    return max(0, int((time.perf_counter() - started) * 1000))


def enabled() -> bool:
    """Whether the ledger is on (``[usage] ledger``): off, nothing is counted, charged or written."""
    return get_config().usage.ledger


def record(entry: UsageEntry) -> None:
    """Count ``entry`` (metrics, token quotas) and queue its row for the batch writer."""
    if not enabled():
        return
    from usage_app import accounting, writer

    accounting.count(entry)
    writer.queue(entry)


def observe(entry: UsageEntry) -> None:
    """Count ``entry`` (metrics, token quotas) without writing its row: the caller writes it
    (a stored response's final write, :func:`rows`)."""
    if not enabled():
        return
    from usage_app import accounting

    accounting.count(entry)


def rows(entries: list[UsageEntry]) -> list[Any]:
    """Unsaved ``UsageRecord`` rows for ``entries`` (a stored response's final write saves them);
    none while the ledger is off."""
    if not enabled():
        return []
    from usage_app.models import UsageRecord

    return [UsageRecord(**values(e)) for e in entries]


def values(e: UsageEntry) -> dict[str, Any]:
    """The ``UsageRecord`` field values of an entry, by attribute name."""
    return {
        "created_at": datetime.fromtimestamp(e.started_at, UTC),
        "owner": e.principal.owner,
        "api_key_id": e.principal.api_key_id,
        "route": e.route,
        "kind": e.kind,
        "model": e.model[:256],
        "response_id": e.response_id,
        "request_id": e.request_id,
        "input_tokens": e.input_tokens,
        "output_tokens": e.output_tokens,
        "cached_tokens": e.cached_tokens,
        "reasoning_tokens": e.reasoning_tokens,
        "status": e.status,
        "latency_ms": e.latency_ms,
    }
