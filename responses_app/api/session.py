"""The state of one ``WS /v1/responses`` connection: lanes, checkpoints, limits and steering.

Requests with the same ``stream_id`` (or none: the default lane) run first in, first out; different
lanes run concurrently. Each lane keeps its latest response as a connection-local checkpoint (its
whole item history), so ``previous_response_id`` continues ``store: false`` responses without the
database; the checkpoint dies with the connection. Every limit of ``[websocket]`` is enforced here:
outstanding requests and their bytes (429), lanes (429), checkpoint items/bytes and the
connection's checkpoint budget (413, checked before any state is written).

Steering (``responses_app.features.steering``): a steer for a generating response is accepted into
its target's batch and the executor stops at its next safe boundary; when the parent ends, the batch
becomes an automatic successor on the same lane, waits for the client's outputs, or fails. Failure
echoes count against their own budget until written; exhausting it closes the connection (1008).
Events go out through :attr:`WebSocketSession.outbound`, which the consumer's writer drains.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from gateway.core import errors, memory, tracing
from gateway.core.auth.websocket import ensure_not_expired
from gateway.core.config import Config
from gateway.core.db import run_orm
from gateway.core.lifecycle import keep_running
from gateway.core.principal import scope_principal
from gateway.core.sse import Event, EventSink, EventTooLarge
from inference_app.upstream.http import forward_headers
from responses_app.engine import runs
from responses_app.engine.domain import Prepared, base_snapshot
from responses_app.engine.executor import Executor
from responses_app.features import steering
from responses_app.features.steering import SteerFailure, Target
from responses_app.protocol.schemas import ResponseCreateRequest, parse_create_request
from responses_app.storage import prepare, writes

log = logging.getLogger("responses.websocket")

MAX_STREAM_ID = 256
STEER_FAILURES_REASON = "steering failure echoes exceed the connection's delivery budget"
# Identity and tracing headers that travel upstream with the executor's own body (as over HTTP).
_UPSTREAM_HEADERS = ("authorization", "x-api-key", "openai-organization", "openai-project", "x-request-id")


class Connection(Protocol):
    """What the session asks of its transport: a policy close (1008) when a budget is exhausted."""

    async def close_policy(self, reason: str) -> None: ...


@dataclass
class Checkpoint:
    """A response's whole item history, held in memory for continuation on this connection."""

    response_id: str
    items: list[dict[str, Any]]
    size: int
    lineage: str | None = None  # its model rounds' lineage: a continuation's rounds keep it


@dataclass
class Job:
    stream_id: str | None
    request: ResponseCreateRequest
    raw: dict[str, Any]
    generate: bool
    size: int  # bytes of the client frame, held against the outstanding-bytes budget
    successor_of: Target | None = None  # an automatic successor: built from this target when it runs
    steered: Target | None = None  # an explicit continuation that carries this target's steering
    quota: Any = None  # the quota ticket (usage_app.quotas): its concurrency slot until the job ends


@dataclass
class Lane:
    key: str | None
    queue: deque[Job] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    latest: str | None = None  # response id of this lane's cached checkpoint
    storing: bool = False  # its current job generates a stored response (finished if the client leaves)


class _Refused(Exception):
    """A request that failed before execution; ``evict`` says whether the failure rules apply."""

    def __init__(self, error: errors.GatewayError, *, evict: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.evict = evict


def _size(items: list[dict[str, Any]]) -> int:
    return len(orjson.dumps(items))


def _streamed(fields: dict[str, Any]) -> tuple[ResponseCreateRequest, dict[str, Any]]:
    """A request the session builds itself (steering successors), parsed as a client's would be."""
    request, raw = parse_create_request(orjson.dumps(fields))
    raw["stream"] = True
    return request.model_copy(update={"stream": True}), raw


@dataclass
class Counted:
    """An outbound failure echo: its bytes stay on the failure-delivery budget until written."""

    frame: bytes
    size: int


class WebSocketSession:
    """One connection's lanes, checkpoints and budgets; the consumer feeds it client events."""

    def __init__(self, scope: dict[str, Any], config: Config, connection: Connection) -> None:
        self.scope = scope
        self.config = config
        self.limits = config.websocket
        self.principal = scope_principal(scope)
        self.owner = self.principal.owner
        # A weak reference: the consumer holds the session, so a strong one would be a cycle.
        self.connection = weakref.ref(connection)
        self.lanes: dict[str | None, Lane] = {}
        self.checkpoints: dict[str, Checkpoint] = {}
        self.checkpoint_bytes = 0  # cached checkpoints
        self.reserved_bytes = 0  # active parents and prepared checkpoints of running requests
        self.outstanding = 0
        self.outstanding_bytes = 0
        self.outbound: asyncio.Queue[bytes | Counted] = asyncio.Queue(self.limits.outbound_queue_events)
        self.steering = steering.Steering(
            steering.Limits(
                max_queued=self.limits.steer_max_queued,
                input_bytes=self.limits.steer_input_bytes,
                settings_bytes=self.limits.steer_settings_bytes,
                failure_bytes=self.limits.steer_failure_bytes,
                target_ttl_s=self.limits.steer_target_ttl_s,
            )
        )
        self.closing = False
        self.draining = False

    def enqueue(self, job: Job) -> None:
        """Queue an admitted job on its lane, starting the lane's runner if it is idle."""
        lane = self.lanes.get(job.stream_id)
        if lane is None:
            lane = self.lanes[job.stream_id] = Lane(job.stream_id)
        lane.queue.append(job)
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._run_lane(lane))

    def end(self) -> list[asyncio.Task[None]]:
        """The client left: unapplied steering dies, stored responses finish and are stored (as over
        HTTP; their events are no longer sent); returns the lane tasks to cancel."""
        self.closing = True
        self.steering.discard()
        tasks = []
        for lane in self.lanes.values():
            if lane.task is None:
                continue
            if lane.storing and not lane.task.done():
                keep_running(lane.task)
                lane.task.add_done_callback(lambda _: memory.connection_closed())
            else:
                tasks.append(lane.task)
        return tasks

    def cancel_lanes(self) -> None:
        """A policy close: running work ends, nothing more is sent."""
        self.closing = True
        current = asyncio.current_task()
        for lane in self.lanes.values():
            if lane.task is not None and lane.task is not current:
                lane.task.cancel()

    def parse(self, content: dict[str, Any], size: int) -> Job:
        """A ``response.create`` event as a job: the HTTP request model, streaming implied."""
        fields = dict(content)
        fields.pop("type")
        stream_id = fields.pop("stream_id", None)
        if stream_id is not None:
            if not isinstance(stream_id, str):
                raise errors.BadRequest(
                    "Invalid type for 'stream_id': expected a string.", param="stream_id", code="invalid_type"
                )
            if not 0 < len(stream_id) <= MAX_STREAM_ID:
                raise errors.BadRequest(
                    f"Invalid 'stream_id': it must contain between 1 and {MAX_STREAM_ID} characters.",
                    param="stream_id",
                    code="invalid_value",
                )
        generate = fields.pop("generate", None)
        if generate is not None and not isinstance(generate, bool):
            raise errors.BadRequest(
                "Invalid type for 'generate': expected a boolean.", param="generate", code="invalid_type"
            )
        fields.pop("stream", None)  # implicit: every WebSocket response streams
        request, raw = parse_create_request(orjson.dumps(fields))
        if request.background:
            raise errors.BadRequest(
                "Background responses are not supported over WebSocket; use POST /v1/responses.",
                param="background",
                code="unsupported_parameter",
            )
        multi_agent = raw.get("multi_agent")
        if isinstance(multi_agent, dict) and multi_agent.get("enabled"):
            raise errors.BadRequest(
                "multi_agent is not supported with WebSocket response sessions; use the HTTP Responses API.",
                param="multi_agent",
                code="unsupported_parameter",
            )
        raw["stream"] = True
        request = request.model_copy(update={"stream": True})
        return Job(stream_id, request, raw, generate is not False, size)

    def admit(self, job: Job) -> None:
        """Admission control: nothing is queued, and no state changes, when this refuses."""
        limits = self.limits
        if self.outstanding >= limits.max_outstanding_requests:
            raise errors.RateLimited(
                f"Too many outstanding requests on this WebSocket connection (at most "
                f"{limits.max_outstanding_requests}); wait for a response to finish."
            )
        if self.outstanding_bytes + job.size > limits.max_outstanding_request_bytes:
            raise errors.RateLimited(
                f"Outstanding request data on this WebSocket connection would exceed "
                f"{limits.max_outstanding_request_bytes} bytes; wait for a response to finish."
            )
        if job.stream_id not in self.lanes and len(self.lanes) >= limits.max_lanes:
            raise errors.RateLimited(
                f"This WebSocket connection already has {limits.max_lanes} lanes (stream_id values, "
                "the default lane included); reconnect to start new lanes."
            )
        self.outstanding += 1
        self.outstanding_bytes += job.size

    def withdraw(self, job: Job) -> None:
        """Undo :meth:`admit` for a job refused afterwards (a quota), before it was queued."""
        self.outstanding -= 1
        self.outstanding_bytes -= job.size

    # --- lanes -----------------------------------------------------------------------------

    async def _run_lane(self, lane: Lane) -> None:
        try:
            while lane.queue and not self.closing:
                job = lane.queue.popleft()
                try:
                    # Each response is a trace of its own: the connection may live for hours.
                    with tracing.websocket_response_span(self.scope):
                        await self._execute(lane, job)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("WebSocket request on lane %r failed", lane.key)
                    await self.error(errors.server_error(), job.stream_id)
                finally:
                    self.outstanding -= 1
                    self.outstanding_bytes -= job.size
                    if job.quota is not None:
                        job.quota.release()
        finally:
            if self.closing:  # jobs that will never run give their concurrency slots back
                for job in lane.queue:
                    if job.quota is not None:
                        job.quota.release()

    async def _execute(self, lane: Lane, job: Job) -> None:
        if job.successor_of is not None:
            successor = await self._successor_job(job)
            if successor is None:
                return
            job = successor
        else:
            try:
                job = self._with_pending_steering(lane, job)
            except errors.GatewayError as exc:  # pending steering stays for a corrected submission
                await self.error(exc, job.stream_id)
                return
        parent_id = job.request.previous_response_id
        # A same-lane continuation of the lane's cached latest response; anything else is a fork.
        same_lane = parent_id is not None and parent_id == lane.latest
        try:
            prepared, reserved = await self._prepare(job)
        except _Refused as refused:
            if job.successor_of is not None:
                await self._fail_batch(
                    job.successor_of, steering.SUCCESSOR_CREATION_FAILED, refused.error.message
                )
                return
            if refused.evict and same_lane and job.steered is None:
                self._evict(lane)
            await self.error(refused.error, job.stream_id)
            return
        lane.storing = job.generate and prepared.store
        try:
            if job.generate:
                ok, items = await self._generate(prepared, job)
            else:
                ok, items = await self._prewarm(prepared, job)
        finally:
            lane.storing = False
            self.reserved_bytes -= reserved
        if ok and items is not None:
            self._retain(lane, prepared.response_id, items, prepared.lineage)
        elif not ok and same_lane and not (job.steered is not None and job.steered.batch):
            self._evict(lane)

    async def _prepare(self, job: Job) -> tuple[Prepared, int]:
        """Re-check identity, look the parent up now, prepare, and reserve checkpoint budget."""
        try:
            ensure_not_expired(self.scope)
        except errors.GatewayError as exc:
            raise _Refused(exc, evict=False) from None
        parent_id = job.request.previous_response_id
        cached = self.checkpoints.get(parent_id) if parent_id is not None else None
        try:
            prepared: Prepared = await run_orm(
                prepare.response_prepare,
                request=job.request,
                raw=job.raw,
                owner=self.owner,
                headers=self._upstream_headers(),
                config=self.config,
                cached_history=cached.items if cached is not None else None,
                cached_lineage=cached.lineage if cached is not None else None,
                principal=self.principal,
            )
        except errors.GatewayError as exc:
            if exc.code == "previous_response_not_found":
                exc.status = 400  # the WebSocket transport answers 400 (spec)
            raise _Refused(exc, evict=True) from None
        if prepared.agent_tree is not None:  # continuing a multi-agent response (HTTP only)
            refusal = errors.BadRequest(
                "Multi-agent responses continue over the HTTP Responses API only, not WebSocket.",
                param="previous_response_id",
                code="unsupported_parameter",
            )
            raise _Refused(refusal, evict=False)
        checkpoint = [*prepared.history, *prepared.new_items]
        self._check_checkpoint(len(checkpoint), _size(checkpoint))
        prepared_bytes = _size(checkpoint)
        parent_bytes = 0 if cached is not None or not prepared.history else _size(prepared.history)
        reserve = prepared_bytes + parent_bytes
        budget = self.limits.max_connection_checkpoint_bytes
        if self.checkpoint_bytes + self.reserved_bytes + reserve > budget:
            raise _Refused(
                errors.PayloadTooLarge(
                    f"This request's checkpoint ({prepared_bytes} bytes) would exceed the "
                    f"connection's checkpoint budget of {budget} bytes (cached, active-parent and "
                    "prepared checkpoints); continue on a new connection by replaying the history.",
                    code="checkpoint_budget_exceeded",
                ),
                evict=False,
            )
        self.reserved_bytes += reserve
        return prepared, reserve

    def _check_checkpoint(self, count: int, size: int) -> None:
        limits = self.limits
        if count > limits.max_checkpoint_items:
            raise _Refused(
                errors.PayloadTooLarge(
                    f"The response checkpoint would hold {count} items; at most "
                    f"{limits.max_checkpoint_items} items are retained per checkpoint.",
                    code="checkpoint_too_large",
                ),
                evict=False,
            )
        if size > limits.max_checkpoint_bytes:
            raise _Refused(
                errors.PayloadTooLarge(
                    f"The response checkpoint would be {size} bytes; at most "
                    f"{limits.max_checkpoint_bytes} bytes are retained per checkpoint.",
                    code="checkpoint_too_large",
                ),
                evict=False,
            )

    async def _generate(self, prepared: Prepared, job: Job) -> tuple[bool, list[dict[str, Any]] | None]:
        """Run the shared executor; every event goes out with the request's ``stream_id``."""
        executor = Executor(prepared, self.config, event_fields=self._tag(job))
        registered: list[Target] = []
        # The executor stops at its next safe boundary while its target holds accepted steering.
        executor.steer.requested = lambda: bool(registered and registered[0].batch)

        async def on_event(event: Event) -> None:
            if event is executor.failure_event:
                await self._execution_error(event.data, job.stream_id)
                return
            if event.type == "response.created":
                registered.append(self._register(job, prepared, executor.sink))
            await self._send(event.json)

        await runs.drive(executor, on_event)  # the shutdown deadline ends it failed
        final = executor.final
        if registered:
            status = final.get("status", "failed") if final is not None else "failed"
            await self._parent_ended(registered[0], status, executor.output)
        elif job.successor_of is not None:  # it failed before its response.created
            await self._fail_batch(
                job.successor_of,
                steering.SUCCESSOR_CREATION_FAILED,
                "The successor response could not be created.",
            )
        if executor.failure_event is not None or final is None or final.get("status") == "failed":
            return False, None
        return True, executor.checkpoint()  # after a compaction: the window

    async def _prewarm(self, prepared: Prepared, job: Job) -> tuple[bool, list[dict[str, Any]] | None]:
        """``generate: false``: both lifecycle events are built and checked before anything else."""
        sink = EventSink(self.config.responses.max_stream_event_bytes, extra=self._tag(job))
        completed = base_snapshot(prepared, "completed")
        completed["completed_at"] = int(time.time())
        try:
            created_event = sink.make("response.created", response=base_snapshot(prepared, "in_progress"))
            completed_event = sink.make("response.completed", response=completed)
        except EventTooLarge as exc:
            await self.error(errors.PayloadTooLarge(exc.message, code="event_too_large"), job.stream_id)
            return False, None
        if prepared.store:
            await writes.store_final(prepared, writes.Outcome("completed", completed, []))
        self._register(job, prepared, sink)
        await self._send(created_event.json)
        await self._send(completed_event.json)
        return True, [*prepared.history, *prepared.new_items]

    # --- steering ---------------------------------------------------------------------------

    async def steer(self, content: dict[str, Any]) -> None:
        """``response.steer``: accepted into the target's batch, or ``response.steer.failed``."""
        pid, submitted = steering.submitted(content)
        try:
            _, items = steering.parse_steer(content)
            if self.draining:
                raise SteerFailure(
                    steering.RESPONSE_NOT_ACTIVE, "The server is shutting down; no steering is accepted."
                )
            target, steer = self.steering.submit(pid, submitted, items)
        except SteerFailure as failure:
            await self._steer_failed(failure, self.steering.targets.get(pid), pid, submitted, None)
            return
        await self._control(steering.accepted_event(steer, self._sequence(target), target.lane))
        if target.state == "waiting":
            await self._pending(target)
        elif target.state == "ended":
            self._schedule_successor(target)

    def _register(self, job: Job, prepared: Prepared, sink: EventSink) -> Target:
        """A ``response.created`` on the job's lane: the response becomes a steering target, and the
        steering a successor or explicit continuation carries is committed to it."""
        for source in (job.successor_of, job.steered):
            if source is not None:  # committed first: the parent's settings make room for these
                self.steering.commit(source)
        refusal = steering.eligibility(
            job.raw, generate=job.generate, conversation_id=prepared.conversation_id
        )
        target = self.steering.register(
            prepared.response_id, job.stream_id, steering.settings_of(job.raw), refusal
        )

        def next_sequence() -> int:
            number = sink.sequence_number
            sink.sequence_number += 1
            return number

        target.next_sequence = next_sequence
        return target

    async def _parent_ended(self, target: Target, status: str, output: list[dict[str, Any]]) -> None:
        """Control events after the target's terminal event: failures, pending, or a successor."""
        for steer in self.steering.ended(target, status, output):
            assert target.refusal is not None
            await self._steer_failed(
                target.refusal, target, steer.previous_response_id, steer.input, steer.id
            )
        if target.state == "waiting":
            await self._pending(target)
        elif target.state == "ended" and target.batch:
            self._schedule_successor(target)

    async def _pending(self, target: Target) -> None:
        for steer in target.batch:
            if not steer.notified:
                steer.notified = True
                event = steering.pending_event(steer, target.required, self._sequence(target), target.lane)
                await self._control(event)

    async def _fail_batch(self, target: Target, code: str, message: str) -> None:
        """Accepted steering that cannot be committed goes back with its steering IDs."""
        target.state = "closed"
        failure = SteerFailure(code, message)
        for steer in self.steering.take(target):
            await self._steer_failed(failure, target, steer.previous_response_id, steer.input, steer.id)

    def _schedule_successor(self, target: Target) -> None:
        """Queue the automatic successor first on the target's lane (it builds itself when it runs,
        so steering accepted until then joins it)."""
        if target.successor_scheduled or self.closing:
            return
        target.successor_scheduled = True
        lane = self.lanes.get(target.lane)
        if lane is None:
            lane = self.lanes[target.lane] = Lane(target.lane)
        placeholder = ResponseCreateRequest.model_construct()
        lane.queue.appendleft(Job(target.lane, placeholder, {}, True, 0, successor_of=target))
        self.outstanding += 1
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._run_lane(lane))

    async def _successor_job(self, job: Job) -> Job | None:
        """The successor's request: the parent's settings, its id, the batch in acceptance order."""
        target = job.successor_of
        assert target is not None
        if not target.batch:
            return None
        if target.settings is None:
            await self._fail_batch(
                target, steering.SUCCESSOR_CREATION_FAILED, "The parent's settings are no longer retained."
            )
            return None
        target.state = "succeeding"
        try:
            request, raw = _streamed(steering.successor_fields(target))
        except errors.GatewayError as exc:
            await self._fail_batch(target, steering.SUCCESSOR_CREATION_FAILED, exc.message)
            return None
        return Job(target.lane, request, raw, True, 0, successor_of=target)

    def _with_pending_steering(self, lane: Lane, job: Job) -> Job:
        """An explicit continuation of a parent with pending steering: it must answer every
        required call, and the accepted steering is prepended to its input."""
        target = self.steering.waiting_for(lane.key, job.request.previous_response_id)
        if target is None or not job.generate:
            return job
        request, raw = _streamed(steering.steered_fields(target, job.raw))
        return Job(job.stream_id, request, raw, True, job.size, steered=target)

    def _sequence(self, target: Target | None) -> int:
        return target.next_sequence() if target is not None and target.next_sequence is not None else 0

    async def _control(self, event: dict[str, Any]) -> None:
        await self._send(orjson.dumps(event))

    async def _steer_failed(
        self, failure: SteerFailure, target: Target | None, pid: str, submitted: Any, steer_id: str | None
    ) -> None:
        event = steering.failed_event(
            failure,
            previous_response_id=pid,
            submitted_input=submitted,
            steer_id=steer_id,
            sequence_number=self._sequence(target),
            stream_id=target.lane if target is not None else None,
        )
        frame = orjson.dumps(event)
        if self.closing:
            return
        if not self.steering.reserve_failure(len(frame)):
            log.warning("closing a WebSocket: steering failure echoes exceed steer_failure_bytes")
            connection = self.connection()
            if connection is not None:
                await connection.close_policy(STEER_FAILURES_REASON)
            return
        await self.outbound.put(Counted(frame, len(frame)))

    # --- connection-local state -------------------------------------------------------------

    def _retain(
        self, lane: Lane, response_id: str, items: list[dict[str, Any]], lineage: str | None = None
    ) -> None:
        """Make ``response_id`` the lane's latest checkpoint, if it fits; else keep the old one."""
        size = _size(items)
        old = self.checkpoints.get(lane.latest) if lane.latest is not None else None
        freed = old.size if old is not None else 0
        limits = self.limits
        if (
            len(items) > limits.max_checkpoint_items
            or size > limits.max_checkpoint_bytes
            or self.checkpoint_bytes - freed + self.reserved_bytes + size
            > limits.max_connection_checkpoint_bytes
        ):
            log.warning("response %s is not retained: its checkpoint is over budget", response_id)
            return
        self._evict(lane)
        self.checkpoints[response_id] = Checkpoint(response_id, items, size, lineage)
        self.checkpoint_bytes += size
        lane.latest = response_id

    def _evict(self, lane: Lane) -> None:
        if lane.latest is None:
            return
        old = self.checkpoints.pop(lane.latest, None)
        if old is not None:
            self.checkpoint_bytes -= old.size
        lane.latest = None

    # --- outbound ----------------------------------------------------------------------------

    @staticmethod
    def _tag(job: Job) -> dict[str, Any] | None:
        return {"stream_id": job.stream_id} if job.stream_id is not None else None

    def _upstream_headers(self) -> dict[str, str]:
        incoming = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope.get("headers", ())]
        consumed = bool(self.scope.get("credential_consumed", False))
        headers = forward_headers(incoming, self.config, caller_credential_consumed=consumed)
        return {k: v for k, v in headers.items() if k in _UPSTREAM_HEADERS}

    async def error(self, exc: errors.GatewayError, stream_id: str | None) -> None:
        await self._send(orjson.dumps(errors.ws_error_event(exc, stream_id)))

    async def _execution_error(self, data: dict[str, Any], stream_id: str | None) -> None:
        """The executor's ``error`` stream event in the WebSocket error shape, tagged with the lane."""
        code = data.get("code")
        status = 413 if code == "event_too_large" else 500
        exc = errors.GatewayError(str(data.get("message")), param=data.get("param"), code=code, status=status)
        event = errors.ws_error_event(exc, stream_id)
        event["sequence_number"] = data.get("sequence_number")
        await self._send(orjson.dumps(event))

    async def _send(self, frame: bytes) -> None:
        """Queue one event; waits (backpressure to the producer) while the queue is full."""
        if not self.closing:
            await self.outbound.put(frame)
