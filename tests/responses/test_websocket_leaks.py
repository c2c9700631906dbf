"""Closed WebSocket connections leave nothing behind (issue 62).

Each server the gateway ships with serves ``WS /v1/responses`` in a probe process of its own
(``tests/responses/ws_leak_probe.py``): connections used as Codex uses them (lanes, stored and
unstored responses, steering, a client leaving a stored response mid-generation) are opened and
closed, and no consumer may outlive them, nor any class of ours or of the server's gain instances
with the connections. Deterministic: a census of live objects, not the process's RSS.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import orjson
import pytest

from gateway.core import memory
from tests.servers import ROOT, child_env

CONNECTIONS = 6


@pytest.mark.process
@pytest.mark.timeout(300)
@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_closed_connections_leave_no_object_of_ours_or_the_servers_alive(server: str) -> None:
    probe = subprocess.run(
        [sys.executable, "-m", "tests.responses.ws_leak_probe", server, str(CONNECTIONS)],
        cwd=ROOT,
        env=child_env({}),
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = probe.stdout.strip().splitlines()
    assert probe.returncode == 0 and lines, probe.stdout[-3000:] + probe.stderr[-3000:]
    result = orjson.loads(lines[-1])
    assert "error" not in result, result
    assert result["consumers"] == 0 and result["connections"] == CONNECTIONS, result
    # What every connection (or every other one) left behind: a class with at least half as many
    # new instances as connections. One more of a process-wide object made lazily (the access log's
    # writer, on some logging set-ups) is not a connection's.
    kept = {name: count for name, count in result["outlived"].items() if count >= CONNECTIONS // 2}
    assert kept == {}, result


def test_closes_share_one_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone close gets one collection and one trim; a burst shares one and gets one more after it
    (what its connections held may still be in use when the first runs)."""
    trims: list[int] = []
    collections: list[int] = []
    releaser = memory.Releaser(lambda pad: trims.append(pad) or 1, lambda: collections.append(1) or 0)
    monkeypatch.setattr(memory, "RELEASE_DELAY_S", 0.05)

    async def closes() -> None:
        releaser.connection_closed()
        await asyncio.sleep(0.3)
        assert (collections, trims, releaser.releases) == ([1], [0], 1)
        for _ in range(50):  # a burst: one release, and one more for what it may have missed
            releaser.connection_closed()
        await asyncio.sleep(0.3)
        assert (collections, trims, releaser.releases) == ([1, 1, 1], [0, 0, 0], 3)

    asyncio.run(closes())
    assert releaser.releases == 3


def test_the_consumer_asks_for_a_release_when_its_connection_closes(
    monkeypatch: pytest.MonkeyPatch, live_gateway: Any
) -> None:
    import websockets

    from tests.responses.wsutil import ws_url

    asked: list[int] = []
    monkeypatch.setattr(memory, "connection_closed", lambda: asked.append(1))

    async def open_and_close() -> None:
        async with websockets.connect(ws_url(live_gateway.url)):
            pass
        for _ in range(100):
            if asked:
                return
            await asyncio.sleep(0.02)

    asyncio.run(open_and_close())
    assert asked == [1]


def test_a_closed_connection_is_freed_without_the_cycle_collector(
    monkeypatch: pytest.MonkeyPatch, transactional_db: None
) -> None:
    """The consumer and its session form no reference cycle: both go when the connection closes,
    with the collector off (the release after a close collects, which would hide one). Channels
    closes stale database connections around each event, hence the database."""
    import gc
    import weakref

    from channels.testing import WebsocketCommunicator

    from responses_app.api.consumers import ResponsesConsumer

    monkeypatch.setattr(memory, "connection_closed", lambda: None)
    alive: list[weakref.ref[Any]] = []
    connect = ResponsesConsumer.connect

    async def tracked_connect(self: ResponsesConsumer) -> None:
        await connect(self)
        alive.extend((weakref.ref(self), weakref.ref(self.session)))

    monkeypatch.setattr(ResponsesConsumer, "connect", tracked_connect)

    async def open_use_and_close() -> None:
        communicator = WebsocketCommunicator(ResponsesConsumer.as_asgi(), "/v1/responses")
        assert (await communicator.connect())[0]
        await communicator.send_to(text_data='{"type": "response.nope"}')
        assert orjson.loads(await communicator.receive_from())["type"] == "error"
        await communicator.disconnect()

    gc.collect()
    gc.disable()
    try:
        asyncio.run(open_use_and_close())
        assert len(alive) == 2 and [ref() for ref in alive] == [None, None]
    finally:
        gc.enable()
