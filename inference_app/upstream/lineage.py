"""The lineage of a model round: which earlier rounds' prompt it extends, for KV-cache-affine placement.

A lineage is one agent's conversation with the model: the rounds of a response, its tool rounds, its
``previous_response_id`` and ``conversation`` continuations, its compaction summaries; each agent
of a multi-agent run has its own. Features bind the lineage around their upstream calls
(:func:`bind`); the upstream reads it (:func:`current`) to place the round where its prefix is
cached, and may send it to a KV-aware router. Keys are tenant-scoped digests: the same raw key of
two owners never meets, and no id travels in clear.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[str | None] = ContextVar("inference_lineage", default=None)


def key(owner: str, *parts: str) -> str:
    """The tenant-scoped lineage key of ``parts`` (for example a conversation id, or a chain's first
    response id and an agent's name) for ``owner``: 32 hex digits."""
    digest = hashlib.sha256(owner.encode())
    for part in parts:
        digest.update(b"\x00" + part.encode())
    return digest.hexdigest()[:32]


def current() -> str | None:
    """The lineage of the model round being sent, or None (a round with no lineage)."""
    return _current.get()


@contextmanager
def bind(lineage: str | None) -> Iterator[None]:
    """Model rounds sent inside this block belong to ``lineage`` (None: to no lineage)."""
    token = _current.set(lineage)
    try:
        yield
    finally:
        _current.reset(token)
