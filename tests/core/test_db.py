"""``gateway.core.db.run_orm``: results, errors and context travel; calls overlap; cancellation is safe;
connections are tidied before and after each call."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from gateway.core.db import run_orm

# The pool threads tidy their connections before and after every call.
pytestmark = pytest.mark.django_db(transaction=True)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def test_result_error_and_context_travel() -> None:
    def work(a: int, *, b: int) -> tuple[int, str, str]:
        return a + b, request_id.get(), threading.current_thread().name

    def broken() -> None:
        raise ValueError("nope")

    async def main() -> None:
        request_id.set("req_1")
        total, seen, thread = await run_orm(work, 1, b=2)
        assert (total, seen) == (3, "req_1")
        assert thread != threading.current_thread().name
        with pytest.raises(ValueError, match="nope"):
            await run_orm(broken)

    asyncio.run(main())


def test_unrelated_calls_overlap() -> None:
    """Eight calls that each wait until all eight are running (bounded): side by side they meet;
    funnelled through one thread the peak would be 1. Counted, not timed."""
    count = 8
    lock = threading.Condition()
    state = {"in_flight": 0, "peak": 0}

    def meet() -> None:
        with lock:
            state["in_flight"] += 1
            state["peak"] = max(state["peak"], state["in_flight"])
            lock.notify_all()
            lock.wait_for(lambda: state["peak"] >= count, timeout=5)
            state["in_flight"] -= 1

    async def main() -> None:
        await asyncio.gather(*(run_orm(meet) for _ in range(count)))

    asyncio.run(main())
    assert state["peak"] == count


def test_a_cancelled_caller_stops_waiting_and_the_work_finishes() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(5)
        finished.set()

    async def main() -> None:
        task = asyncio.ensure_future(run_orm(slow))
        await _set(started)  # the work runs on its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not finished.is_set()
        assert await run_orm(lambda: 7) == 7  # the pool still serves
        release.set()

    asyncio.run(main())
    assert finished.wait(5)


async def _set(event: threading.Event) -> None:
    """Wait (off the event loop) for ``event``, set on another thread."""
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, 5)


def test_connections_are_tidied_before_and_after_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """``close_old_connections`` runs on the call's thread before and after the work; when it fails
    (the database is gone) the caller gets the error instead of waiting forever."""
    import channels.db

    tidy = channels.db.close_old_connections
    seen: list[str] = []
    broken = {"left": 0}

    def recording() -> None:
        seen.append(threading.current_thread().name)
        if broken["left"]:
            broken["left"] -= 1
            raise RuntimeError("database gone")
        tidy()

    monkeypatch.setattr(channels.db, "close_old_connections", recording)

    def work() -> str:
        seen.append("work")
        return threading.current_thread().name

    async def main() -> None:
        thread = await run_orm(work)
        assert thread.startswith("orm") and seen == [thread, "work", thread]
        broken["left"] = 1
        with pytest.raises(RuntimeError, match="database gone"):
            await asyncio.wait_for(run_orm(work), 5)
        assert await run_orm(lambda: 7) == 7

    asyncio.run(main())
