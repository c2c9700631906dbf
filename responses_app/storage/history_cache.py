"""In-process cache of stored checkpoints: the history a ``previous_response_id`` continuation needs.

Keyed by response id, serialized once with orjson, LRU-bounded by ``[responses] history_cache_bytes``.
It holds payloads only: every continuation still reads the parent's row, so ownership, deletion and
status answer as without it. Payloads are copied out of orjson's over-allocated buffer, which would
otherwise keep several times the counted size resident. One lock: writes come from ORM threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import orjson

from gateway.core.config import get_config

# What an entry costs besides its payload, in bytes: the headers of the payload, the id and the
# owner, the tuple and the map's node (measured: ~320 on CPython 3.11, ids of 53 characters).
ENTRY_OVERHEAD = 320


class HistoryCache:
    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def _limit() -> int:
        return get_config().responses.history_cache_bytes

    def put(self, response_id: str, owner: str, items: list[dict[str, Any]]) -> None:
        """Remember ``items`` (the checkpoint of ``response_id``, owned by ``owner``)."""
        limit = self._limit()
        if limit <= 0:
            return
        payload = bytes(memoryview(orjson.dumps(items)))  # a right-sized copy (module docstring)
        if len(payload) + ENTRY_OVERHEAD > limit // 4:
            return  # one huge history must not evict everything else
        with self._lock:
            old = self._entries.pop(response_id, None)
            if old is not None:
                self._bytes -= _size(old[1])
            self._entries[response_id] = (owner, payload)
            self._bytes += _size(payload)
            while self._bytes > limit and self._entries:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= _size(evicted)

    def get(self, response_id: str, owner: str) -> list[dict[str, Any]] | None:
        """A fresh copy of the cached checkpoint items, or None (absent, or not ``owner``'s)."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or entry[0] != owner:
                return None
            self._entries.move_to_end(response_id)
        items: list[dict[str, Any]] = orjson.loads(entry[1])
        return items

    def discard(self, response_id: str) -> None:
        with self._lock:
            old = self._entries.pop(response_id, None)
            if old is not None:
                self._bytes -= _size(old[1])

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries


def _size(payload: bytes) -> int:
    return len(payload) + ENTRY_OVERHEAD


history_cache = HistoryCache()
