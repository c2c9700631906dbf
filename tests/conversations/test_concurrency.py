"""Concurrent Conversations requests overlap: their ORM work never queues on one shared thread.

The database call is held at the driver boundary (Django's cursor, for reads of the conversations
table), so our code runs unchanged: each held call waits until all the requests' calls are in
flight at once (or a bound passes). Side by side they all meet; serialized on asgiref's single
thread-sensitive thread only one is ever in flight. Concurrency is counted, not timed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from django.db.backends.utils import CursorWrapper

from conversations_app.models import Conversation
from tests.servers import LiveServer

REQUESTS = 4
MEET_BOUND_S = 5.0  # a bound against hanging when the calls cannot meet


class Meeting:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.in_flight = 0
        self.peak = 0
        self.met = False  # latched once every request's call was in flight together
        self.active = False

    def hold(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.met = self.met or self.in_flight >= REQUESTS
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.met, timeout=MEET_BOUND_S)
        with self.lock:
            self.in_flight -= 1


@pytest.fixture
def held_conversation_reads(monkeypatch: pytest.MonkeyPatch) -> Meeting:
    table = Conversation._meta.db_table
    execute = CursorWrapper.execute
    meeting = Meeting()

    def held_execute(self: CursorWrapper, sql: str, params: Any = None) -> Any:
        if meeting.active and sql.lstrip().upper().startswith("SELECT") and table in sql:
            meeting.hold()
        return execute(self, sql, params)

    monkeypatch.setattr(CursorWrapper, "execute", held_execute)
    return meeting


async def _get_all(base: str, ids: list[str]) -> list[int]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        answers = await asyncio.gather(*(client.get(f"/v1/conversations/{i}") for i in ids))
        return [a.status_code for a in answers]


def test_concurrent_requests_overlap_their_database_calls(
    live_gateway: LiveServer, held_conversation_reads: Meeting
) -> None:
    ids = [httpx.post(f"{live_gateway.url}/v1/conversations", json={}).json()["id"] for _ in range(REQUESTS)]
    held_conversation_reads.active = True
    started = time.monotonic()
    assert asyncio.run(_get_all(live_gateway.url, ids)) == [200] * REQUESTS
    # Every request's database call was in flight at the same moment (serialized: a peak of 1,
    # each call waiting out the bound).
    assert held_conversation_reads.peak == REQUESTS
    assert time.monotonic() - started < MEET_BOUND_S  # they met; nobody waited out the bound
