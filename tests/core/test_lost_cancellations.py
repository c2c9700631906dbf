"""A cancellation is never lost on the way through a Redis call (``gateway/core/aio.py``).

On Python 3.11, ``asyncio.wait_for`` drops a cancellation that arrives as the awaited work
completes, and redis-py sends every command through it (its default socket timeout). A client that
disconnected from a worker-served stream then never stopped the engine: the relay read the whole
answer from Redis to its end (seen as a flaky ``test_client_disconnect_aborts_the_request_in_the_engine``
of the real-vLLM leg). These tests show the mechanism on its own, the guard, and the worker stream
reader cancelled against a real Redis.
"""

from __future__ import annotations

import asyncio
import random
import sys
import uuid

import pytest

from gateway.core.aio import keep_cancellation
from tests.conftest import REDIS_URL


async def _done_at_once() -> str:
    return "result"


async def _cancel_as_it_completes(body: asyncio.Future[str] | asyncio.Task[str]) -> None:
    """Let ``body`` reach its ``wait_for``, then cancel it in the turn where the inner work (already
    scheduled) completes: the outer task's wake-up comes after the inner task's step."""
    await asyncio.sleep(0)
    body.cancel()


async def _wait_for_at_once() -> str:
    return await asyncio.wait_for(_done_at_once(), 5)  # the behaviour under test (banned outside tests)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 rebuilt wait_for on asyncio.timeout")
async def test_wait_for_drops_a_cancellation_that_arrives_as_its_work_completes() -> None:
    """The interpreter's bug that the guard exists for: the task was cancelled, yet it returns."""
    task = asyncio.ensure_future(_wait_for_at_once())
    await _cancel_as_it_completes(task)
    assert await task == "result"
    assert task.cancelling() == 1  # the request is still counted: what the guard reads


async def test_keep_cancellation_raises_the_dropped_cancellation() -> None:
    task = asyncio.ensure_future(keep_cancellation(_wait_for_at_once()))
    await _cancel_as_it_completes(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_keep_cancellation_leaves_alone_a_timeout_that_took_its_cancellation_back() -> None:
    async def times_out_inside() -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(5)
        except TimeoutError:
            return "timed out"
        return "not reached"

    assert await keep_cancellation(times_out_inside()) == "timed out"


async def _deadline_passes_during(wrap: object) -> str:
    """An ``asyncio.timeout`` (as the drain's interrupt and the tool calls use) whose deadline passes
    while the task is inside a ``wait_for`` whose work completes in that same turn."""
    async with asyncio.timeout(None) as deadline:
        deadline.reschedule(asyncio.get_running_loop().time())  # due at the next turn
        awaitable = _wait_for_at_once()
        return await (wrap(awaitable) if callable(wrap) else awaitable)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 rebuilt wait_for on asyncio.timeout")
async def test_wait_for_drops_a_deadline_too() -> None:
    assert await _deadline_passes_during(None) == "result"  # the deadline was never enforced


async def test_keep_cancellation_gives_a_dropped_deadline_its_timeout_error() -> None:
    with pytest.raises(TimeoutError):
        await _deadline_passes_during(keep_cancellation)


async def test_a_cancelled_worker_stream_read_ends_and_cancels_the_engine_request() -> None:
    """The worker stream reader (``XREAD`` on a busy stream, as a worker writes one), cancelled at a
    random moment, many times over: every cancellation ends the read at once and sets the cancel
    key the worker polls. Before the guard, most of them were lost (253 of 300 in a bare loop)."""
    import redis.asyncio as aioredis

    from gateway.core.config import get_config, replace
    from inference_app.upstream import streams
    from inference_app.upstream.worker import WorkerUpstream, _StreamReader

    upstream = WorkerUpstream(replace(get_config(), redis_url=REDIS_URL))
    producer = aioredis.Redis.from_url(REDIS_URL)
    rounds, lost = 40, 0
    try:
        for _ in range(rounds):
            request_id = uuid.uuid4().hex
            key = streams.stream_key(request_id)
            stop = asyncio.Event()

            async def produce(key: str = key, stop: asyncio.Event = stop) -> None:
                index = 0
                while not stop.is_set():
                    await producer.xadd(key, {"t": streams.DATA, "b": b"data: {}\n\n", "i": index})
                    index += 1
                    if index % 4 == 0:
                        await asyncio.sleep(0)

            async def read(request_id: str = request_id) -> None:
                task = asyncio.current_task()
                assert task is not None
                chunks_after_cancel = 0
                async for _chunk in _StreamReader(upstream, request_id).chunks():
                    if task.cancelling():  # cancelled, yet still reading
                        chunks_after_cancel += 1
                        if chunks_after_cancel > 50:
                            return  # ran on long after its cancellation: lost

            writer = asyncio.ensure_future(produce())
            reader = asyncio.ensure_future(read())
            await asyncio.sleep(random.uniform(0.002, 0.02))
            reader.cancel()
            try:
                async with asyncio.timeout(5):
                    await reader
            except asyncio.CancelledError:
                assert await producer.exists(streams.cancel_key(request_id)) == 1
            else:
                lost += 1
            finally:
                stop.set()
                await writer
                await producer.delete(key, streams.cancel_key(request_id))
        assert lost == 0, f"{lost} of {rounds} cancellations of a stream read were lost"
    finally:
        await producer.aclose()
        for client in upstream._clients.values():
            await client.aclose()
