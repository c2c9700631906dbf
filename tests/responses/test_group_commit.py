"""``responses_app.storage.group_commit.GroupWriter``: writes waiting together commit together, a failing
write fails alone, nothing is dropped; its thread keeps its connection between bursts, and writes
again on a fresh one when the kept one failed."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from conversations_app.models import Item
from gateway.core.db import run_orm
from responses_app.storage.group_commit import GroupWriter

pytestmark = pytest.mark.django_db(transaction=True)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


@pytest.fixture(autouse=True)
def _writers_released(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The writers a test makes give back the connections their threads keep when it ends (else
    each would hold one of the pool's, and the test database, for the rest of the session)."""
    made: list[GroupWriter] = []
    init = GroupWriter.__init__

    def recording(self: GroupWriter, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(GroupWriter, "__init__", recording)
    yield
    for writer in made:
        writer.release()


async def _set(event: threading.Event) -> None:
    """Wait (off the event loop) for ``event``, set on another thread."""
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, 5)


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (a counter or flag another thread moves), at most 5 s."""
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


async def _until_async(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """:func:`_until` for a condition that is itself awaited (a query)."""
    deadline = time.monotonic() + 5
    while not await condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def _drain_done(writer: GroupWriter) -> None:
    """Wait until the writer's thread has ended its drain, whatever the drain does after its
    results (a tidy-up): a job queued behind the drain runs once the drain has returned."""
    deadline = time.monotonic() + 5
    while writer.writing:
        assert time.monotonic() < deadline, "the drain did not end"
        time.sleep(0.005)
    behind = threading.Event()
    writer.jobs.put(behind.set)
    assert behind.wait(5)


# --- GroupWriter: the group commit ----------------------------------------------------------------


class _CountingTransaction:
    """``transaction.atomic`` that counts the batches written together."""

    def __init__(self) -> None:
        self.batches = 0

    def __call__(self) -> Any:
        self.batches += 1
        return transaction.atomic()


def _write_item(
    item_id: str,
    *,
    fail: bool = False,
    gate: threading.Event | None = None,
    started: threading.Event | None = None,
) -> str:
    """A real write, atomic on its own: one item row; ``fail`` raises after writing it (its row must
    be rolled back). The result says whether it joined a batch's transaction. ``started`` is set
    once it runs, ``gate`` holds it (and the writer) until set."""
    if started is not None:
        started.set()
    if gate is not None:
        assert gate.wait(5)
    joined = connection.in_atomic_block
    with transaction.atomic():
        Item.objects.create(id=item_id, owner="o", type="message", data={"id": item_id})
        if fail:
            raise ValueError(f"bad write {item_id}")
    return f"{item_id}:{joined}"


def test_writes_that_wait_together_are_committed_together() -> None:
    """While one write holds the writer, 8 more arrive: they are written in one transaction (one
    batch), and every caller gets its own result, in its own order."""
    atomic = _CountingTransaction()
    writer = GroupWriter(atomic)
    gate, started = threading.Event(), threading.Event()

    async def main() -> list[str]:
        first = asyncio.ensure_future(writer.run(_write_item, "i_first", gate=gate, started=started))
        await _set(started)  # the writer is busy with the first (alone, no batch transaction)
        rest = [asyncio.ensure_future(writer.run(_write_item, f"i_{n}")) for n in range(8)]
        await _until(lambda: len(writer.waiting) == 8, "the eight writes waiting")
        gate.set()
        return [await first, *[await task for task in rest]]

    results = asyncio.run(main())
    assert results[0] == "i_first:False"  # a write alone runs as it is (atomic on its own)
    assert results[1:] == [f"i_{n}:True" for n in range(8)]  # ... the batch inside one transaction
    assert atomic.batches == 1
    assert Item.objects.filter(owner="o").count() == 9


def test_a_failing_write_fails_only_its_own_caller() -> None:
    """A batch with one failing write is rolled back and written again one by one: the others
    are stored, the failing one's caller gets its exception and nothing of it stays."""
    atomic = _CountingTransaction()
    writer = GroupWriter(atomic)
    gate, started = threading.Event(), threading.Event()

    async def main() -> list[Any]:
        first = asyncio.ensure_future(writer.run(_write_item, "i_first", gate=gate, started=started))
        await _set(started)
        rest = [asyncio.ensure_future(writer.run(_write_item, f"i_{n}", fail=n == 3)) for n in range(6)]
        await _until(lambda: len(writer.waiting) == 6, "the six writes waiting")
        gate.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    results = asyncio.run(main())
    assert atomic.batches == 1  # the batch was tried together, then one by one
    assert isinstance(results[4], ValueError) and "i_3" in str(results[4])
    assert [r for i, r in enumerate(results) if i != 4] == ["i_first:False"] + [
        f"i_{n}:False" for n in (0, 1, 2, 4, 5)
    ]
    stored = set(Item.objects.filter(owner="o").values_list("id", flat=True))
    assert stored == {"i_first", "i_0", "i_1", "i_2", "i_4", "i_5"}


def test_a_cancelled_writer_caller_does_not_drop_its_write() -> None:
    writer = GroupWriter(transaction.atomic)
    gate, started = threading.Event(), threading.Event()

    async def main() -> None:
        first = asyncio.ensure_future(writer.run(_write_item, "i_first", gate=gate, started=started))
        await _set(started)
        second = asyncio.ensure_future(writer.run(_write_item, "i_second"))
        await _until(lambda: len(writer.waiting) == 1, "the second write waiting")
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        gate.set()
        await first
        assert await writer.run(lambda: 7) == 7  # the writer still serves, after the cancelled one

    asyncio.run(main())
    assert set(Item.objects.values_list("id", flat=True)) == {"i_first", "i_second"}


def test_a_failing_connection_tidy_up_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """When tidying the thread's connections fails before the work (the database is gone), the
    caller gets the error instead of waiting forever, and the writer goes on serving."""
    import responses_app.storage.group_commit as group_commit

    tidy = group_commit.close_old_connections
    broken = {"left": 1}

    def flaky() -> None:
        if broken["left"]:
            broken["left"] -= 1
            raise RuntimeError("database gone")
        tidy()

    monkeypatch.setattr(group_commit, "close_old_connections", flaky)
    writer = GroupWriter(transaction.atomic)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="database gone"):
            await asyncio.wait_for(writer.run(lambda: 2), 5)
        assert await asyncio.wait_for(writer.run(lambda: 3), 5) == 3

    asyncio.run(main())


def _counting_tidy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each tidy-up of an ORM thread's connections (``close_old_connections``), by thread."""
    import responses_app.storage.group_commit as group_commit

    tidy = group_commit.close_old_connections
    calls: list[str] = []

    def counting() -> None:
        calls.append(threading.current_thread().name)
        tidy()

    monkeypatch.setattr(group_commit, "close_old_connections", counting)
    return calls


def _settled(writer: GroupWriter) -> None:
    """Wait for the writer's thread to end its drain (its last tidy-up comes after the results)."""
    _drain_done(writer)


def _drain_of_two_batches(writer: GroupWriter, first_call: Any) -> tuple[Any, list[Any]]:
    """A first batch held until three more writes wait behind it; they form the second batch."""
    started, gate = threading.Event(), threading.Event()

    def first() -> Any:
        started.set()
        gate.wait(5)
        return first_call()

    async def main() -> tuple[Any, list[Any]]:
        head = asyncio.ensure_future(writer.run(first))
        # The first batch is on its thread, held by the gate, before the others are queued.
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        rest = [asyncio.ensure_future(writer.run(lambda i=i: i)) for i in range(3)]
        deadline = time.monotonic() + 5
        while len(writer.waiting) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert len(writer.waiting) == 3  # the second batch, waiting behind the first
        gate.set()
        outcome = await asyncio.gather(head, return_exceptions=True)
        return outcome[0], await asyncio.gather(*rest)

    return asyncio.run(main())


def test_batches_that_follow_each_other_keep_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain tidies its thread's connections before its first batch, not between batches nor
    after its last (with PostgreSQL's pool, each tidy-up is a return to the pool and a health check
    on the next checkout)."""
    calls = _counting_tidy(monkeypatch)
    writer = GroupWriter(transaction.atomic)
    head, rest = _drain_of_two_batches(writer, lambda: "first")
    assert (head, rest) == ("first", [0, 1, 2])
    _settled(writer)
    assert calls == ["orm-writer"]  # both batches on the writer's own thread


def _bursts(writer: GroupWriter, *fns: Callable[[], Any]) -> list[Any]:
    """Each of ``fns`` written alone, one after the other: each drain ends before the next write."""

    async def main() -> list[Any]:
        outcomes = []
        for fn in fns:
            outcomes.append((await asyncio.gather(writer.run(fn), return_exceptions=True))[0])
            await asyncio.get_running_loop().run_in_executor(None, _drain_done, writer)
        return outcomes

    return asyncio.run(main())


def _connection_id() -> int:
    connection.ensure_connection()
    return id(connection.connection)


def test_a_writer_keeps_its_connection_between_bursts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes that come one burst after another, the writer idle in between, run on one thread and
    one connection, tidied once, before the first."""
    calls = _counting_tidy(monkeypatch)
    writer = GroupWriter(transaction.atomic)
    first, second, third = _bursts(writer, _connection_id, _connection_id, _connection_id)
    assert first == second == third
    assert calls == ["orm-writer"]


def test_a_kept_connection_that_failed_is_written_again_on_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write that fails with a connection error on the connection kept from the last burst (the
    database restarted meanwhile) is written once more on a tidied connection: its caller gets the
    result. On a connection tidied just before, the same error reaches its caller."""
    calls = _counting_tidy(monkeypatch)
    failures = {"left": 1}

    def once_broken() -> str:
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return "written"

    writer = GroupWriter(transaction.atomic)
    assert _bursts(writer, lambda: "first", once_broken) == ["first", "written"]
    assert failures["left"] == 0
    assert len(calls) == 2  # before the first burst, and before the second attempt

    failures["left"] = 1
    fresh = GroupWriter(transaction.atomic)
    (outcome,) = _bursts(fresh, once_broken)
    assert isinstance(outcome, OperationalError)  # not retried: its connection was not a kept one


def _backend_pid() -> int:
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def test_a_kept_connection_the_server_dropped_is_written_again_on_a_fresh_one() -> None:
    """The database drops the connection the writer kept from its last burst (as a restart does):
    the next write fails on it, is written once more on a fresh connection, and is stored."""
    if connection.vendor != "postgresql":
        pytest.skip("a SQLite connection has no server to drop it")
    writer = GroupWriter(transaction.atomic)

    def item_on_backend(item_id: str) -> Callable[[], int]:
        def write() -> int:
            Item.objects.create(id=item_id, owner="o", type="message", data={"id": item_id})
            return _backend_pid()

        return write

    (first,) = _bursts(writer, item_on_backend("i_before"))

    def kill() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [first])
            return bool(cursor.fetchone()[0] == 0)

    async def killed() -> None:
        await run_orm(kill)
        await _until_async(lambda: run_orm(gone), "the backend gone")

    asyncio.run(killed())
    (second,) = _bursts(writer, item_on_backend("i_after"))
    assert isinstance(second, int) and second != first
    assert set(Item.objects.filter(owner="o").values_list("id", flat=True)) == {"i_before", "i_after"}


def test_with_a_pool_of_one_connection_the_writer_gives_it_back_after_each_burst(
    monkeypatch: pytest.MonkeyPatch, gateway_config: Any
) -> None:
    """run_orm's thread needs the one connection too: the writer tidies after each burst."""
    gateway_config(database__pool_min_size=1, database__pool_max_size=1)
    calls = _counting_tidy(monkeypatch)
    writer = GroupWriter(transaction.atomic)
    assert _bursts(writer, lambda: 1, lambda: 2) == [1, 2]
    assert len(calls) == 4  # before and after each burst


def test_a_released_writer_ends_its_thread_and_a_later_write_starts_another() -> None:
    writer = GroupWriter(transaction.atomic)
    (first,) = _bursts(writer, threading.current_thread)
    writer.release()
    first.join(5)
    assert not first.is_alive()
    (second,) = _bursts(writer, threading.current_thread)
    assert second is not first and second.name == "orm-writer"


def test_a_failed_batch_tidies_before_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that failed may have broken the connection: the next batch of the same drain starts
    on a tidied one."""
    calls = _counting_tidy(monkeypatch)
    writer = GroupWriter(transaction.atomic)

    def broken() -> None:
        raise ValueError("bad write")

    head, rest = _drain_of_two_batches(writer, broken)
    assert isinstance(head, ValueError)
    assert rest == [0, 1, 2]
    _settled(writer)
    assert len(calls) == 2  # before the first batch, and before the second (the first failed)


# --- GroupWriter: combined writes ---------------------------------------------------------------


class _Combine:
    """A ``combine`` that stores an item row per value (all in one transaction, atomic on its own),
    records each call's values and whether it ran inside a batch's transaction, and fails the call
    that holds the value ``"bad"``."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], bool]] = []

    def __call__(self, values: list[str]) -> list[str]:
        self.calls.append((list(values), connection.in_atomic_block))
        with transaction.atomic():
            for value in values:
                Item.objects.create(id=value, owner="o", type="message", data={"id": value})
            if "bad" in values:
                raise ValueError("bad value")
        return [f"{value}:{request_id.get()}" for value in values]


def _combined_run(writer: GroupWriter, values: list[str], *, calls: int = 0) -> list[Any]:
    """A first write holds the writer; then ``values`` are put (and ``calls`` plain writes run),
    each from a task with its own request id, and wait together."""
    gate, started = threading.Event(), threading.Event()

    async def put(value: str) -> Any:
        request_id.set(f"req_{value}")
        return await writer.put(value)

    async def main() -> list[Any]:
        first = asyncio.ensure_future(writer.run(_write_item, "i_first", gate=gate, started=started))
        await _set(started)
        tasks = [asyncio.ensure_future(put(value)) for value in values]
        tasks += [asyncio.ensure_future(writer.run(_write_item, f"i_call_{n}")) for n in range(calls)]
        await _until(lambda: len(writer.waiting) == len(tasks), "every write waiting")
        gate.set()
        return await asyncio.gather(first, *tasks, return_exceptions=True)

    return asyncio.run(main())[1:]


def test_combined_writes_that_wait_together_are_one_call_without_the_batch_transaction() -> None:
    atomic = _CountingTransaction()
    combine = _Combine()
    writer = GroupWriter(atomic, combine=combine)
    results = _combined_run(writer, ["a", "b", "c"])
    # One call for the three, outside any batch transaction (combine is atomic on its own); each
    # caller gets its own result (the call runs in the first caller's context).
    assert combine.calls == [(["a", "b", "c"], False)]
    assert atomic.batches == 0
    assert results == ["a:req_a", "b:req_a", "c:req_a"]
    assert set(Item.objects.filter(owner="o").values_list("id", flat=True)) == {"i_first", "a", "b", "c"}


def test_a_failing_combined_call_is_retried_one_value_at_a_time() -> None:
    combine = _Combine()
    writer = GroupWriter(transaction.atomic, combine=combine)
    results = _combined_run(writer, ["a", "bad", "c"])
    assert [values for values, _ in combine.calls] == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert results[0] == "a:req_a" and results[2] == "c:req_c"
    assert isinstance(results[1], ValueError)
    assert set(Item.objects.filter(owner="o").values_list("id", flat=True)) == {"i_first", "a", "c"}


def test_combined_and_plain_writes_of_one_batch_share_its_transaction() -> None:
    atomic = _CountingTransaction()
    combine = _Combine()
    writer = GroupWriter(atomic, combine=combine)
    results = _combined_run(writer, ["a", "b"], calls=2)
    assert atomic.batches == 1
    assert combine.calls == [(["a", "b"], True)]  # inside the batch's transaction
    assert results == ["a:req_a", "b:req_a", "i_call_0:True", "i_call_1:True"]
