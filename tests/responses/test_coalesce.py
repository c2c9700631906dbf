"""``gateway.core.sse.coalesce``: frames produced without waiting go out as one write; nothing is
delayed past a point where the source waits; failures and cancellation behave as without it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.core.sse import coalesce


async def test_frames_are_joined_between_waits() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"
        await asyncio.sleep(0)
        yield b"c"
        await asyncio.sleep(0.01)
        yield b"d"
        yield b"e"

    assert [chunk async for chunk in coalesce(source())] == [b"ab", b"c", b"de"]


async def test_an_already_finished_future_does_not_split_a_write() -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)

    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        await done  # completes without suspending
        yield b"b"

    assert [chunk async for chunk in coalesce(source())] == [b"ab"]


async def test_frames_before_a_failure_are_sent_then_it_propagates() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"
        raise RuntimeError("broken")

    got: list[bytes] = []
    with pytest.raises(RuntimeError, match="broken"):
        async for chunk in coalesce(source()):
            got.append(chunk)
    assert got == [b"ab"]


async def test_cancellation_reaches_the_waiting_source() -> None:
    seen: list[str] = []
    waiting = asyncio.Event()

    async def source() -> AsyncIterator[bytes]:
        try:
            yield b"a"
            waiting.set()
            await asyncio.sleep(10)
            yield b"never"
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("closed")

    chunks: list[bytes] = []

    async def consume() -> None:
        async for chunk in coalesce(source()):
            chunks.append(chunk)

    task = asyncio.ensure_future(consume())
    await waiting.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert chunks == [b"a"]
    assert seen == ["cancelled", "closed"]


async def test_closing_early_closes_the_source() -> None:
    closed: list[bool] = []

    async def source() -> AsyncIterator[bytes]:
        try:
            yield b"a"
            await asyncio.sleep(0)
            yield b"b"
        finally:
            closed.append(True)

    frames = coalesce(source())
    assert await frames.__anext__() == b"a"
    await frames.aclose()
    assert closed == [True]


# --- the fast path's stream: its head goes out with its first frames ------------------------------


def _stream(source: AsyncIterator[bytes]) -> tuple[list[dict[str, object]], asyncio.Future[None]]:
    from gateway.core.asgi import Exchange
    from responses_app.api import fastpath
    from responses_app.api.views import Outcome

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    outcome = Outcome(headers=[("Content-Type", "text/event-stream")], frames=source)
    return sent, asyncio.ensure_future(fastpath._send(outcome, send, Exchange(), []))


async def test_a_streams_head_waits_for_its_first_frames_and_goes_out_with_them() -> None:
    first = asyncio.Event()

    async def source() -> AsyncIterator[bytes]:
        await first.wait()  # a stored stream's first event waits for its row
        yield b"a"
        yield b"b"
        await asyncio.sleep(0)
        yield b"c"

    sent, done = _stream(source())
    await asyncio.sleep(0.01)
    assert sent == []  # no head alone: it would cost the client a read of its own
    first.set()
    await done
    assert [(m["type"], m.get("body")) for m in sent] == [
        ("http.response.start", None),
        ("http.response.body", b"ab"),
        ("http.response.body", b"c"),
        ("http.response.body", b""),
    ]
    assert sent[0]["status"] == 200 and (b"content-type", b"text/event-stream") in sent[0]["headers"]  # type: ignore[operator]


async def test_a_stream_without_frames_or_failing_before_one_still_gets_its_head() -> None:
    async def empty() -> AsyncIterator[bytes]:
        return
        yield b""

    sent, done = _stream(empty())
    await done
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]

    async def broken() -> AsyncIterator[bytes]:
        await asyncio.sleep(0)
        raise RuntimeError("broken")
        yield b""

    sent, done = _stream(broken())
    with pytest.raises(RuntimeError, match="broken"):
        await done
    assert [m["type"] for m in sent] == ["http.response.start"]  # as before: the server ends it


async def test_a_head_whose_send_fails_is_not_sent_again() -> None:
    from gateway.core.asgi import Exchange
    from responses_app.api import fastpath
    from responses_app.api.views import Outcome

    sent: list[str] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(str(message["type"]))
        raise ConnectionError("the server refused the head")

    async def source() -> AsyncIterator[bytes]:
        yield b"a"

    outcome = Outcome(headers=[("Content-Type", "text/event-stream")], frames=source())
    with pytest.raises(ConnectionError, match="refused the head"):
        await fastpath._send(outcome, send, Exchange(), [])
    assert sent == ["http.response.start"]  # once: the original failure is the one raised
