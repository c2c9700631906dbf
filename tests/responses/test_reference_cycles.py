"""A finished response leaves no reference cycles behind: its objects die by reference count.

The serving process raises the garbage collector's thresholds (``gateway/asgi.py``), so a full
collection is rare under load. A run whose objects form a cycle (the executor, its emitter and tool
loop, its task: ~100 objects a response) outlives itself until one: under sustained stored
streaming the server's memory grew by ~1 KB a response. These tests fail when such a cycle comes
back.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.core import asgi as passthrough
from responses_app.engine.executor import Executor
from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.scripts import text


@pytest.fixture
def wire() -> str:
    return "responses"


@pytest.fixture
def no_collection() -> Iterator[None]:
    """The collector off (only reference counts free objects), and back on afterwards."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _cyclic_garbage(kinds: tuple[type, ...]) -> list[Any]:
    """The objects of ``kinds`` that only a collection would free (found, then freed)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [o for o in gc.garbage if issubclass(type(o), kinds)]  # type(): a dead weak proxy raises
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _runs_of(response_id: str, executors: list[Any]) -> list[Executor]:
    return [e for e in executors if e.p.response_id == response_id]


def _alive(kind: type) -> list[Any]:
    """The live objects of ``kind`` (``type()``: ``isinstance`` on a dead weak proxy raises)."""
    return [o for o in gc.get_objects() if issubclass(type(o), kind)]


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
def test_a_stored_response_leaves_no_cycles(gw: Gateway, no_collection: None, stream: bool) -> None:
    gw.script(text("The", " answer."))
    body = {"model": "m", "input": "hi", "store": True}
    if stream:
        events = gw.stream(body)
        assert events[-1]["type"] == "response.completed"
        response_id = events[-1]["response"]["id"]
    else:
        answer = gw.post(body)
        assert answer.status_code == 200, answer.text
        response_id = answer.json()["id"]
    assert Response.objects.get(id=response_id).status == "completed"
    # The run ends just after its last event (the lease is released): wait until its executor is
    # gone, or is found in a cycle (other tests' executors, if any, are not this test's business).
    deadline = time.monotonic() + 10
    while True:
        cyclic = _runs_of(response_id, _cyclic_garbage((Executor,)))
        assert cyclic == [], "a finished run's executor is held in a reference cycle"
        if not _runs_of(response_id, _alive(Executor)):
            break
        assert time.monotonic() < deadline, "the run's executor is still referenced"
        time.sleep(0.05)


def test_a_disconnect_watch_leaves_no_cycle(monkeypatch: pytest.MonkeyPatch, no_collection: None) -> None:
    """A watch that started its watcher task (a request running past ``WATCH_AFTER_S``)."""
    monkeypatch.setattr(passthrough, "WATCH_AFTER_S", 0.0)

    async def request() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def left() -> None:
            await never

        with passthrough.DisconnectWatch(left, lambda: False):
            await asyncio.sleep(0.01)  # the watcher starts
        await asyncio.sleep(0.01)  # the cancelled watcher ends

    asyncio.run(request())
    assert _cyclic_garbage((passthrough.DisconnectWatch,)) == []


def test_a_websocket_response_leaves_no_cycles(gw: Gateway, no_collection: None) -> None:
    """Codex's transport: stored responses on one WebSocket connection, then the connection closed."""
    from tests.responses.wsutil import Client, connect, create

    for _ in range(2):
        gw.script(text("The", " answer."))

    async def scenario() -> list[str]:
        ids = []
        async with await connect(gw.url) as ws:
            client = Client(ws)
            for _ in range(2):
                await client.send(create(store=True))
                terminal = (await client.until_terminal())[-1]
                assert terminal["type"] == "response.completed", terminal
                ids.append(terminal["response"]["id"])
        return ids

    ids = asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while True:
        cyclic = [e for rid in ids for e in _runs_of(rid, _cyclic_garbage((Executor,)))]
        assert cyclic == [], "a finished run's executor is held in a reference cycle"
        if not any(_runs_of(rid, _alive(Executor)) for rid in ids):
            break
        assert time.monotonic() < deadline, "a run's executor is still referenced"
        time.sleep(0.05)
