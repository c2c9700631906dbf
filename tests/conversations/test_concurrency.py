"""Concurrent Conversations requests overlap: their ORM work never queues on one shared thread.

The database call is made slow at the driver boundary (Django's cursor, for statements on the
conversations table), so our code runs unchanged; N requests at once must take about one call's
time, not N calls' (asgiref's single thread-sensitive thread would serialize them).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from django.db.backends.utils import CursorWrapper

from conversations_app.models import Conversation
from tests.servers import LiveServer

SLOW_S = 0.4
REQUESTS = 4


@pytest.fixture
def slow_conversation_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Conversation._meta.db_table
    execute = CursorWrapper.execute

    def slow_execute(self: CursorWrapper, sql: str, params: Any = None) -> Any:
        if sql.lstrip().upper().startswith("SELECT") and table in sql:
            time.sleep(SLOW_S)
        return execute(self, sql, params)

    monkeypatch.setattr(CursorWrapper, "execute", slow_execute)


async def _get_all(base: str, ids: list[str]) -> tuple[float, list[int]]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        started = time.perf_counter()
        answers = await asyncio.gather(*(client.get(f"/v1/conversations/{i}") for i in ids))
        return time.perf_counter() - started, [a.status_code for a in answers]


def test_concurrent_requests_take_one_calls_time_not_n(
    live_gateway: LiveServer, slow_conversation_reads: None
) -> None:
    ids = [httpx.post(f"{live_gateway.url}/v1/conversations", json={}).json()["id"] for _ in range(REQUESTS)]
    # One request alone: one slow call.
    alone, statuses = asyncio.run(_get_all(live_gateway.url, ids[:1]))
    assert statuses == [200]
    assert alone >= SLOW_S
    elapsed, statuses = asyncio.run(_get_all(live_gateway.url, ids))
    assert statuses == [200] * REQUESTS
    # Serialized they would take REQUESTS * SLOW_S (1.6 s); side by side about SLOW_S.
    assert elapsed < 2 * SLOW_S, f"{REQUESTS} concurrent requests took {elapsed:.2f}s"
