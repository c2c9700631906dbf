"""The connections ``ws_leak_probe`` opens: each one used the ways Codex uses one, then closed.

One connection after another, so the scripted upstream's answers are taken in order:

1. ``store: false`` on lane ``a``;
2. ``store: true`` on the default lane;
3. a response steered mid-generation on lane ``s`` (its stream held at its second delta until the
   steer is accepted), then its automatic successor;
4. a stored response on lane ``b`` that the client leaves while it is generating: the gateway
   finishes and stores it after the close, and the probe waits for that before it counts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from tests.responses.scripts import Script, handler, text
from tests.responses.test_websocket_steering import gated, recv_until, steer
from tests.responses.wsutil import Client, connect, create
from tests.upstream import Gate, Recorded, ScriptedUpstream


def _script(upstream: ScriptedUpstream, answer: str) -> None:
    upstream.script("/v1/responses", handler(Script([text(answer)])))


def _left_while_generating(upstream: ScriptedUpstream, done: asyncio.Event, loop: Any) -> Gate:
    """A stored answer held until its client has gone, then streamed to the end."""
    gate = Gate()
    scripted = handler(Script([text("Finished ", "after ", "the client left.")]))

    async def answer(request: web.Request, rec: Recorded) -> web.StreamResponse:
        await gate.wait()
        try:
            return await scripted(request, rec)
        finally:
            loop.call_soon_threadsafe(done.set)

    upstream.script("/v1/responses", answer)
    return gate


async def one_connection(url: str, upstream: ScriptedUpstream) -> None:
    _script(upstream, "Not stored.")
    _script(upstream, "Stored.")
    gate = Gate()
    gated(
        upstream,
        gate,
        text("It is ", "21 degrees ", "Celsius."),
        hold_before="response.output_text.delta",
        nth=2,
    )
    _script(upstream, "About 70 F.")
    finished = asyncio.Event()
    held = _left_while_generating(upstream, finished, asyncio.get_running_loop())
    async with await connect(url) as ws:
        c = Client(ws)
        await c.send(create(stream_id="a", store=False, input="One."))
        assert (await c.until_terminal())[-1]["type"] == "response.completed"
        await c.send(create(store=True, input="Two."))
        assert (await c.until_terminal())[-1]["type"] == "response.completed"
        await c.send(create(stream_id="s", store=False, input="Weather in Paris?"))
        events = await recv_until(c, "response.output_text.delta")
        await c.send(steer(events[0]["response"]["id"]))
        await recv_until(c, "response.steer.accepted")
        gate.open()
        await recv_until(c, "response.incomplete")
        await recv_until(c, "response.completed")
        await c.send(create(stream_id="b", store=True, input="Leave me."))
        created = await recv_until(c, "response.created")
        left_id = created[-1]["response"]["id"]
    held.open()
    await asyncio.wait_for(finished.wait(), 15)
    await _stored(url, left_id)


async def _stored(url: str, response_id: str) -> None:
    """Wait until the response the client left is stored complete (so its work is over)."""
    import httpx

    async with httpx.AsyncClient(base_url=url) as http:
        for _ in range(100):
            answer = await http.get(f"/v1/responses/{response_id}")
            if answer.status_code == 200 and orjson.loads(answer.content)["status"] == "completed":
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{response_id} was not stored complete after its client left")


async def run_connections(url: str, upstream: ScriptedUpstream, count: int) -> None:
    for _ in range(count):
        await one_connection(url, upstream)
