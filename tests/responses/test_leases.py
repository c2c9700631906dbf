"""Leases of background responses, the sweep, redelivered tasks and crashes (docs/operations.md).

The process-level faults (kill -9, database restart, SIGTERM) are in ``test_faults.py``; these are
the rules themselves, on the test database.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import sys
from typing import Any

import orjson
import pytest
from django.utils import timezone

from gateway.core import errors, runner
from gateway.core.config import get_config, replace
from inference_app.tools.base import ToolCall
from inference_app.tools.dispatch import run_gateway_calls
from responses_app import tasks
from responses_app.models import Response, ResponseEvent
from responses_app.protocol.schemas import ResponseCreateRequest
from responses_app.storage import leases, prepare, services, writes
from tests.servers import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def _row(status: str, *, lease_owner: str = "", expires_in: float | None = None) -> Response:
    rid = f"resp_{os.urandom(8).hex()}"
    expires = None if expires_in is None else timezone.now() + datetime.timedelta(seconds=expires_in)
    row = Response.objects.create(
        id=rid,
        owner="tester",
        status=status,
        model="m",
        background=True,
        request={"model": "m", "input": "x", "background": True},
        snapshot={"id": rid, "object": "response", "status": status, "output": [], "error": None},
        lease_owner=lease_owner,
        lease_expires_at=expires,
    )
    ResponseEvent.objects.create(
        response=row, sequence_number=0, data=orjson.dumps({"type": "response.created"}).decode()
    )
    return row


def _dead_pid() -> int:
    pid = os.fork()  # a child that exits at once: no interpreter to start, no `process` mark
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_the_sweep_fails_expired_leases_and_dead_local_runners_only() -> None:
    expired = _row("in_progress", lease_owner="elsewhere/12/ab", expires_in=-1)
    live = _row("in_progress", lease_owner="elsewhere/13/ab", expires_in=60)
    orphan = _row("queued", lease_owner=f"{runner.HOST}/{_dead_pid()}/cd", expires_in=60)
    mine = _row("in_progress", lease_owner=leases.runner_id(), expires_in=60)
    finished = _row("completed", lease_owner="elsewhere/14/ab", expires_in=-1)

    assert tasks.sweep_once() == 2

    def status(row: Response) -> str:
        return str(Response.objects.get(id=row.id).status)

    assert status(expired) == "failed" and status(orphan) == "failed"
    assert status(live) == "in_progress" and status(mine) == "in_progress"
    assert status(finished) == "completed"
    failed = Response.objects.get(id=expired.id)
    assert failed.error == {"code": "server_error", "message": services.LEASE_EXPIRED_MESSAGE}
    assert failed.snapshot["status"] == "failed" and failed.snapshot["error"] == failed.error
    assert Response.objects.get(id=orphan.id).error["message"] == services.ORPHAN_MESSAGE
    # The stored stream ends with the terminal event (a tailing client stops there).
    events = [orjson.loads(e.data) for e in ResponseEvent.objects.filter(response_id=expired.id)]
    assert [(e["type"], e.get("sequence_number", 0)) for e in events] == [
        ("response.created", 0),
        ("response.failed", 1),
    ]
    assert events[-1]["response"]["status"] == "failed"
    assert tasks.sweep_once() == 0  # nothing twice


def test_a_heartbeat_keeps_the_lease_and_a_lost_lease_is_reported() -> None:
    me = leases.runner_id()
    row = _row("in_progress", lease_owner=me, expires_in=-1)
    other = _row("queued", lease_owner=me, expires_in=-1)

    def renew(*ids: str, owner: str = me) -> set[str]:
        return services.response_leases_renew(ids=list(ids), lease_owner=owner, lease_s=30)

    assert renew(row.id, other.id, "resp_unknown") == {row.id, other.id}
    assert tasks.sweep_once() == 0
    assert Response.objects.get(id=row.id).lease_expires_at > timezone.now()
    assert renew(row.id, owner="someone/else/x") == set()
    Response.objects.filter(id=row.id).update(status="cancelled")
    before = Response.objects.get(id=row.id).lease_expires_at
    assert renew(row.id, other.id) == {other.id}
    assert Response.objects.get(id=row.id).lease_expires_at == before  # a finished row is left alone


def test_the_leases_held_on_one_loop_are_renewed_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """One renewal for every lease due at once (not a task and a statement per response); a lease
    found gone is reported lost once and no longer renewed; a cancelled one is not renewed again; a
    lease with a shorter heartbeat that arrives later is renewed on its own time."""
    from gateway.core.db import run_orm

    config = get_config()
    # The slow heartbeat leaves the steps before its first renewal a second of slack on a busy
    # machine; the test waits for what it checks instead of sleeping fixed times.
    slow = replace(config, responses__heartbeat_s=1.0, responses__lease_s=30.0)
    fast = replace(config, responses__heartbeat_s=0.05, responses__lease_s=30.0)
    me = leases.runner_id()
    rows = [_row("in_progress", lease_owner=me, expires_in=1) for _ in range(3)]
    quick = _row("in_progress", lease_owner=me, expires_in=1)
    lost: list[str] = []
    calls: list[list[str]] = []
    renew = services.response_leases_renew

    def counted(**kwargs: Any) -> set[str]:
        calls.append(sorted(kwargs["ids"]))
        return renew(**kwargs)

    monkeypatch.setattr(services, "response_leases_renew", counted)

    def expires(row: Response) -> datetime.datetime:
        found = Response.objects.get(id=row.id).lease_expires_at
        assert found is not None
        return found

    async def until(done: Any) -> None:
        for _ in range(200):
            if done():
                return
            await asyncio.sleep(0.025)
        raise AssertionError("not within 5 s")

    async def run() -> None:
        beats = [leases.start_heartbeat(r.id, slow, lambda r=r: lost.append(r.id)) for r in rows]
        quick_beat = leases.start_heartbeat(quick.id, fast, lambda: lost.append(quick.id))
        await until(lambda: len(calls) >= 2)  # the quick lease came due twice on its own
        quick_beat.cancel()
        assert all(ids == [quick.id] for ids in calls)
        await run_orm(lambda: Response.objects.filter(id=rows[0].id).update(status="failed"))  # swept
        beats[1].cancel()
        seen = len(calls)
        await until(lambda: lost)  # the slow leases came due: rows[0] and rows[2] together
        assert calls[seen:] == [sorted([rows[0].id, rows[2].id])]
        await until(lambda: len(calls) > seen + 1)  # the next beat: rows[2] only (rows[0] was lost)
        beats[2].cancel()

    asyncio.run(run())
    assert lost == [rows[0].id]
    assert calls[-1] == [rows[2].id]
    soon = timezone.now() + datetime.timedelta(seconds=5)
    assert expires(rows[2]) > soon and expires(quick) > soon
    assert expires(rows[1]) < soon  # cancelled before its first renewal
    assert Response.objects.get(id=rows[0].id).status == "failed"


def test_a_closed_event_loop_leaves_no_renewals_behind() -> None:
    """A Celery worker runs each background response in an ``asyncio.run`` of its own: the leases'
    shared timer must not keep those loops alive, also when one closes with a lease still held."""
    import gc
    import weakref

    row = _row("in_progress", lease_owner=leases.runner_id(), expires_in=60)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def hold(cancel: bool) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        heartbeat = leases.start_heartbeat(row.id, get_config(), lambda: None)
        if cancel:
            heartbeat.cancel()

    asyncio.run(hold(True))
    asyncio.run(hold(False))  # closes with the lease held
    asyncio.run(hold(True))
    gc.collect()
    assert [ref() for ref in loops[:2]] == [None, None]


def test_a_redelivered_task_fails_an_expired_row_and_leaves_a_live_one() -> None:
    expired = _row("in_progress", lease_owner="elsewhere/12/ab", expires_in=-1)
    live = _row("in_progress", lease_owner="elsewhere/13/ab", expires_in=60)
    asyncio.run(tasks._run_stored(expired.id))
    asyncio.run(tasks._run_stored(live.id))
    assert Response.objects.get(id=expired.id).status == "failed"
    assert Response.objects.get(id=live.id).status == "in_progress"


def _stored_stream(**extra: Any) -> Any:
    raw = {"model": "m", "input": "x", "stream": True, **extra}
    return prepare.response_prepare(
        request=ResponseCreateRequest.model_validate(raw),
        raw=raw,
        owner="tester",
        headers={},
        config=get_config(),
    )


def test_a_stored_streams_early_row_is_leased_unfinished_and_swept_without_events() -> None:
    """The row a stored stream writes before ``response.created``: in_progress under the lease, not
    continuable (cached history or not), failed by the sweep once expired (no event stream: it is
    not a background response), and a late final store does not overwrite the failure."""
    from responses_app.storage.history_cache import history_cache

    prepared = _stored_stream()
    snapshot = {"id": prepared.response_id, "object": "response", "status": "in_progress", "error": None}
    writes.response_create_in_progress(
        prepared=prepared, snapshot=snapshot, lease_owner="elsewhere/9/ab", lease_s=30
    )
    row = Response.objects.get(id=prepared.response_id)
    assert (row.status, row.background, row.lease_owner) == ("in_progress", False, "elsewhere/9/ab")
    assert row.lease_expires_at is not None and row.lease_expires_at > timezone.now()
    assert row.snapshot == snapshot and row.history_item_ids == [] and row.completed_at is None
    assert tasks.sweep_once() == 0  # a live lease
    history_cache.put(prepared.response_id, "tester", [{"id": "msg_x", "type": "message"}])
    for _ in range(2):  # with the cache entry, then without
        with pytest.raises(errors.BadRequest) as refused:
            _stored_stream(previous_response_id=prepared.response_id)
        assert refused.value.code == "previous_response_in_progress"
        assert refused.value.param == "previous_response_id"
        history_cache.discard(prepared.response_id)

    Response.objects.filter(id=row.id).update(lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    assert tasks.sweep_once() == 1
    failed = Response.objects.get(id=row.id)
    assert failed.status == "failed" and failed.lease_expires_at is None
    assert failed.error == {"code": "server_error", "message": services.LEASE_EXPIRED_MESSAGE}
    assert failed.snapshot["status"] == "failed" and failed.snapshot["error"] == failed.error
    assert not ResponseEvent.objects.filter(response_id=row.id).exists()
    outcome = writes.Outcome("completed", {**snapshot, "status": "completed"}, [])
    assert writes.response_store_final(prepared=prepared, outcome=outcome) is False
    assert Response.objects.get(id=row.id).status == "failed"


def _drive(executor: Any) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Run ``executor`` through ``runs.drive``; its events and the row as each event was sent."""
    from gateway.core.db import run_orm
    from responses_app.engine import runs

    events: list[dict[str, Any]] = []
    rows: list[tuple[str, str]] = []

    async def on_event(event: Any) -> None:
        events.append(event.data)
        found = await run_orm(lambda: Response.objects.filter(id=executor.p.response_id).first())
        rows.append((found.status, found.lease_owner) if found is not None else ("", ""))

    asyncio.run(runs.drive(executor, on_event))
    return events, rows


class _Hanging:
    """An upstream that never answers."""

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(3600)


def test_a_stored_stream_whose_lease_is_lost_ends_failed() -> None:
    """The sweep failed the row meanwhile (this process could not renew it): the next heartbeat
    interrupts the run, which ends with ``response.failed``; the sweep's row stays."""
    from responses_app.engine import runs
    from responses_app.engine.executor import Executor

    config = get_config()
    config = replace(config, responses__heartbeat_s=0.05, responses__lease_s=5.0)
    executor = Executor(_stored_stream(), config, upstream=_Hanging())
    rid = executor.p.response_id
    swept: list[bool] = []

    async def run() -> list[dict[str, Any]]:
        from gateway.core.db import run_orm

        events: list[dict[str, Any]] = []

        async def on_event(event: Any) -> None:
            events.append(event.data)
            if event.data["type"] == "response.created":
                row = await run_orm(lambda: Response.objects.get(id=rid))
                assert (row.status, row.lease_owner) == ("in_progress", leases.runner_id())
                swept.append(
                    await run_orm(
                        services.response_fail_unfinished, id=rid, message=services.LEASE_EXPIRED_MESSAGE
                    )
                )

        await asyncio.wait_for(runs.drive(executor, on_event), 10)
        return events

    events = asyncio.run(run())
    assert swept == [True]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1]["response"]["error"]["message"] == runs.LEASE_LOST_MESSAGE
    row = Response.objects.get(id=rid)
    assert row.status == "failed" and row.error["message"] == services.LEASE_EXPIRED_MESSAGE


def test_a_stored_stream_refused_at_commit_is_stored_failed_with_the_refusal() -> None:
    """A commit-time refusal (409 conversation_locked) ends the announced row failed with that
    error at once, instead of leaving it in_progress until its lease expires (or 404)."""
    from conversations_app import services as conversation_services
    from conversations_app.models import Conversation
    from responses_app.engine.executor import Executor

    conversation, _ = conversation_services.conversation_create(owner="tester", metadata={}, items=[])
    prepared = _stored_stream(conversation=conversation.id)
    Conversation.objects.filter(id=conversation.id).update(revision=7)  # another writer appended
    events, rows = _drive(Executor(prepared, get_config(), upstream=_Exploding()))
    assert rows[0] == ("in_progress", leases.runner_id())  # written before response.created
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "error"
    assert events[-1]["code"] == "conversation_locked"
    row = Response.objects.get(id=prepared.response_id)
    assert row.status == "failed" and row.lease_expires_at is None
    assert row.error is not None and row.error["code"] == "conversation_locked"
    assert row.snapshot["status"] == "failed"


class _Exploding:
    """An upstream whose transport breaks with an unexpected exception."""

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")


class _Recorded:
    """An upstream that records when it is asked, then breaks once told to (the run ends ``failed``)."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.go = asyncio.Event()

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        self.asked.set()
        await self.go.wait()
        raise RuntimeError("boom")


def test_an_sse_streams_work_starts_while_its_row_is_written_and_nothing_is_sent_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stored SSE stream (``runs.detached``): the upstream is asked while the in_progress row is
    still being written, but the client gets its first event only once that row is committed; the
    final row follows it."""
    import threading

    from gateway.core.db import run_orm
    from responses_app.engine import runs
    from responses_app.engine.executor import Executor

    upstream = _Recorded()
    executor = Executor(_stored_stream(), get_config(), upstream=upstream)
    rid = executor.p.response_id
    real = writes.final_writes.combine
    assert real is not None
    release = threading.Event()

    def held(batch: list[Any]) -> list[bool]:
        if any(isinstance(write, writes.InProgressWrite) for write in batch):
            assert release.wait(10)
        return real(batch)

    monkeypatch.setattr(writes.final_writes, "combine", held)

    async def run() -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        events = runs.detached(executor)
        first = asyncio.ensure_future(anext(events))
        await asyncio.wait_for(upstream.asked.wait(), 10)  # the work started, the row not written
        await asyncio.sleep(0.05)
        assert not first.done()
        assert not await run_orm(lambda: Response.objects.filter(id=rid).exists())
        release.set()
        event = await asyncio.wait_for(first, 10)
        while True:
            row = await run_orm(lambda: Response.objects.get(id=rid))
            seen.append((event.type, row.status))
            upstream.go.set()
            try:
                event = await asyncio.wait_for(anext(events), 10)
            except StopAsyncIteration:
                return seen

    seen = asyncio.run(run())
    assert seen[0] == ("response.created", "in_progress")
    assert [kind for kind, _ in seen] == ["response.created", "response.in_progress", "response.failed"]
    row = Response.objects.get(id=rid)
    assert row.status == "failed" and row.lease_expires_at is None


def _behind_a_busy_writer(executor: Any, final_waits: Any) -> list[Any]:
    """Run ``executor`` through ``runs.detached`` while the stored-response writer is busy with
    another write, until ``final_waits(waiting)`` says its final store waits alone (its in_progress
    row taken back); nothing may have been sent by then. Every event of the stream."""
    import threading

    from responses_app.engine import runs

    busy, release = threading.Event(), threading.Event()

    def occupy() -> None:
        busy.set()
        assert release.wait(10)

    blocker = threading.Thread(target=lambda: asyncio.run(writes.final_writes.run(occupy)))
    blocker.start()
    assert busy.wait(10)

    async def run() -> list[Any]:
        events = runs.detached(executor)
        first = asyncio.ensure_future(anext(events))
        for _ in range(200):
            if final_waits(writes.final_writes.waiting):
                break
            await asyncio.sleep(0.01)
        assert final_waits(writes.final_writes.waiting)
        assert not first.done()
        release.set()
        return [await asyncio.wait_for(first, 10)] + [event async for event in events]

    try:
        return asyncio.run(run())
    finally:
        release.set()
        blocker.join(10)


def test_a_final_row_ready_before_the_in_progress_row_was_taken_replaces_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer is busy until the stream's work has ended: its in_progress row, still waiting, is
    withdrawn and never written; the final row is written alone and the client gets every event."""

    from responses_app.engine.executor import Executor

    upstream = _Recorded()
    upstream.go.set()  # the run ends at once (failed): its final row is ready right away
    executor = Executor(_stored_stream(), get_config(), upstream=upstream)
    rid = executor.p.response_id
    real = writes.final_writes.combine
    assert real is not None
    written: list[list[str]] = []

    def recording(batch: list[Any]) -> list[bool]:
        written.append([type(write).__name__ for write in batch])
        return real(batch)

    monkeypatch.setattr(writes.final_writes, "combine", recording)
    events = _behind_a_busy_writer(
        executor, lambda waiting: [type(write.value).__name__ for write in waiting] == ["FinalWrite"]
    )
    kinds = [event.type for event in events]
    assert kinds == ["response.created", "response.in_progress", "response.failed"]
    assert written == [["FinalWrite"]]
    row = Response.objects.get(id=rid)
    assert row.status == "failed" and row.lease_expires_at is None and row.lease_owner == ""


def test_a_refused_final_store_that_replaced_the_in_progress_row_is_the_streams_one_event() -> None:
    """The writer is busy until the run ended, so the in_progress row is withdrawn; the final store
    is then refused at commit (``409 conversation_locked``): nothing was announced and nothing is
    stored, and the client gets that refusal as the stream's one event (not a generic error)."""

    from conversations_app import services as conversation_services
    from conversations_app.models import Conversation
    from responses_app.engine.executor import Executor

    conversation, _ = conversation_services.conversation_create(owner="tester", metadata={}, items=[])
    prepared = _stored_stream(conversation=conversation.id)
    Conversation.objects.filter(id=conversation.id).update(revision=7)  # another writer appended
    upstream = _Recorded()
    upstream.go.set()
    executor = Executor(prepared, get_config(), upstream=upstream)
    events = [
        event.data
        for event in _behind_a_busy_writer(
            executor, lambda waiting: len(waiting) == 1 and waiting[0].value is None
        )
    ]
    assert [(e["type"], e["code"], e["sequence_number"]) for e in events] == [
        ("error", "conversation_locked", 0)
    ]
    assert not Response.objects.filter(id=prepared.response_id).exists()


@pytest.mark.parametrize("reader", ["events", "frames"])
@pytest.mark.parametrize("final_store", ["works", "fails"])
def test_an_sse_stream_whose_row_cannot_be_written_is_not_announced_as_running(
    monkeypatch: pytest.MonkeyPatch, final_store: str, reader: str
) -> None:
    """The in_progress row's write fails: the run is interrupted. When its final row cannot be
    stored either, the client gets one ``error`` event (``storage_error``) and no id; when it can,
    the client gets the events that row stands for, ending ``response.failed``. The same through
    ``runs.detached_frames`` (what an SSE client is sent): each event's frame."""
    from django.db import OperationalError

    from responses_app.engine import runs
    from responses_app.engine.executor import Executor

    real = writes.final_writes.combine
    assert real is not None

    def failing(batch: list[Any]) -> list[bool]:
        if final_store == "fails" or any(isinstance(w, writes.InProgressWrite) for w in batch):
            raise OperationalError("the database is down")
        return real(batch)

    monkeypatch.setattr(writes.final_writes, "combine", failing)
    executor = Executor(_stored_stream(), get_config(), upstream=_Hanging())
    rid = executor.p.response_id

    async def run() -> list[dict[str, Any]]:
        if reader == "events":
            return [event.data async for event in runs.detached(executor)]
        frames = [frame async for frame in runs.detached_frames(executor)]
        out = []
        for frame in frames:
            head, _, data = frame.partition(b"\ndata: ")
            assert frame.endswith(b"\n\n")
            out.append(orjson.loads(data))
            assert head == b"event: " + out[-1]["type"].encode()
        return out

    events = asyncio.run(asyncio.wait_for(run(), 20))
    message = "The response could not be stored: OperationalError."
    if final_store == "fails":
        assert [(e["type"], e["code"], e["message"]) for e in events] == [("error", "storage_error", message)]
        assert events[0]["sequence_number"] == 0
        assert not Response.objects.filter(id=rid).exists()
    else:
        assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
        assert events[-1]["response"]["error"]["message"] == message
        assert Response.objects.get(id=rid).status == "failed"


def test_an_exception_in_background_work_stores_failed_with_an_error() -> None:
    config = get_config()
    request = ResponseCreateRequest.model_validate({"model": "m", "input": "x", "background": True})
    prepared = prepare.response_prepare(
        request=request,
        raw={"model": "m", "input": "x", "background": True},
        owner="tester",
        headers={},
        config=config,
    )
    services.response_create_queued(prepared=prepared, lease_owner=leases.runner_id(), lease_s=30)
    asyncio.run(tasks.run_background(prepared, config, upstream=_Exploding()))
    row = Response.objects.get(id=prepared.response_id)
    assert row.status == "failed"
    assert row.error is not None and row.error["code"] == "server_error" and row.error["message"]
    assert row.snapshot["status"] == "failed"
    last = ResponseEvent.objects.filter(response_id=row.id).order_by("-sequence_number").first()
    assert last is not None and orjson.loads(last.data)["type"] in ("response.failed", "error")


@pytest.mark.process
def test_the_celery_app_is_loaded_wherever_tasks_are_sent() -> None:
    """A process that only imports the Responses tasks sends them through the gateway's app and
    its Redis broker, never Celery's default app (AMQP on localhost)."""
    code = (
        "import django; django.setup()\n"
        "from responses_app.tasks import run_background_task as t\n"
        "print(t.app.main, t.app.conf.broker_url)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LLM_API_BASE")}
    env.update(DJANGO_SETTINGS_MODULE="gateway.settings", REDIS_URL="redis://127.0.0.1:6379/12")
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["gateway", "redis://127.0.0.1:6379/12"]


def test_mcp_calls_with_credentials_never_enter_a_broker_message() -> None:
    from celery import Celery

    from gateway.celery import configure

    config = replace(get_config(), redis_url="redis://127.0.0.1:1/0")  # a broker that refuses everything
    app = configure(Celery("unreachable"), config)

    def mcp(headers: dict[str, str]) -> ToolCall:
        server = {
            "label": "s",
            "url": "http://127.0.0.1:1/mcp",
            "tool_index": 0,
            "transport": "streamable_http",
        }
        return ToolCall(
            call_id="call_1",
            name="mcp__s__t",
            kind="mcp",
            arguments="{}",
            tool={**server, "operator": False, "headers": headers},
            server_label="s",
            mcp_tool_name="t",
        )

    with_credentials, without = asyncio.run(
        run_gateway_calls([mcp({"authorization": "Bearer secret"}), mcp({})], config=config, celery_app=app)
    )
    assert without.error is not None and "could not be dispatched" in without.error  # went to the broker
    assert with_credentials.error is not None and "could not be dispatched" not in with_credentials.error


def test_waiting_for_a_streams_row_neither_raises_its_failure_nor_cancels_it() -> None:
    """``runs._settled``, the wait of a stream's reader for its row: it returns once the write is
    done, failed or not; a reader cancelled meanwhile leaves the write running; a done write does
    not suspend the reader."""
    from responses_app.engine import runs

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        failing = loop.create_future()
        loop.call_later(0.01, failing.set_exception, RuntimeError("the write failed"))
        await asyncio.wait_for(runs._settled(failing), 5)
        assert failing.done() and isinstance(failing.exception(), RuntimeError)

        running = loop.create_future()
        waiter = asyncio.ensure_future(runs._settled(running))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not running.cancelled() and not running.done()
        running.set_result(None)  # nothing waits on it any more: no callback left behind
        await asyncio.sleep(0)

        done = loop.create_future()
        done.set_result("row")
        step = runs._settled(done).__await__()
        with pytest.raises(StopIteration):
            step.send(None)  # finished without suspending

    asyncio.run(scenario())
