"""``WorkerUpstream``: the upstream when a broker is configured and ``LLM_API_BASE`` is not.

Each request is one Celery task (``inference.generate``) whose worker streams vLLM's answer back on
a Redis Stream (``inference_app.upstream.streams``), relayed unchanged. A round with a lineage
(``lineage.current()``, with ``routing.affinity`` on) goes to the own queue of the worker that served
the lineage last (``placement``); a round placed on a worker that dies before starting it is sent
again, once, to the shared queue. Other rounds take the shared queue (or their model's). No live
worker is a 503; no pickup within the read timeout, or a silent stream, 504; a lost worker 502. A
client disconnect sets the cancel key. ``/v1/models`` and ``/ready`` answer from the workers'
registry (``docs/inference.md``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson

from gateway.core import errors
from gateway.core.aio import keep_cancellation
from gateway.core.config import Config
from inference_app.upstream import lineage, streams
from inference_app.upstream.placement import Placed, Placement
from inference_app.upstream.types import Body, UpstreamResponse, read_body, served_name
from usage_app.tap import request_model

log = logging.getLogger("inference.upstream")

# How long one XREAD blocks before the reader checks on the worker and the deadlines.
_BLOCK_MS = 500
_REGISTRY_TTL_S = 1.0
# Past the TTL and up to this age the cached registry still answers while one refresh runs behind it.
_REGISTRY_STALE_S = 10.0


class WorkerUpstream:
    """Inference on Celery workers that host vLLM (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        from celery import Celery

        from inference_app.upstream.celery_config import configure

        self.config = config
        self.celery = configure(Celery("gateway-inference-client"), config)
        # Results travel on the request's Redis Stream; a result backend here would make each
        # publish subscribe to a result channel (and block the event loop doing so).
        self.celery.conf.update(result_backend=None, task_ignore_result=True)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]
        self._clients = weakref.WeakKeyDictionary()
        self._registry: tuple[float, list[dict[str, Any]]] = (0.0, [])
        # The registry read in progress, per event loop: concurrent callers share it.
        self._reading: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Task[list[dict[str, Any]]]
        ]
        self._reading = weakref.WeakKeyDictionary()
        self.placement = Placement(config)
        # The broker's key prefix (kombu's queues carry it; our own keys do not).
        options = self.celery.conf.broker_transport_options or {}
        self._queue_prefix = str(options.get("global_keyprefix") or "")

    def _redis(self) -> Any:
        """One pooled client per event loop (blocking reads each hold a connection)."""
        import redis.asyncio as aioredis

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = aioredis.Redis.from_url(
                self.config.redis_url, max_connections=self.config.upstream.pool_size
            )
            self._clients[loop] = client
        return client

    # -- the workers' registry -------------------------------------------------------------------
    async def workers(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        """The live workers, cached for a second. Past that a registry still young answers at once and is
        refreshed behind the request (concurrent callers share one read), so a burst of requests reaches
        the engine together instead of each waiting for its own Redis round trips."""
        now = time.monotonic()
        stamp, cached = self._registry
        if not fresh and now - stamp < _REGISTRY_TTL_S:
            return cached
        reading = self._read()
        if not fresh and cached and now - stamp < _REGISTRY_STALE_S:
            return cached
        return await asyncio.shield(reading)

    def _read(self) -> asyncio.Task[list[dict[str, Any]]]:
        """The registry read running on this loop, started if there is none."""
        loop = asyncio.get_running_loop()
        task = self._reading.get(loop)
        if task is None or task.done():
            task = self._reading[loop] = loop.create_task(self._read_registry())
            task.add_done_callback(_log_failure)
        return task

    async def _read_registry(self) -> list[dict[str, Any]]:
        started = time.monotonic()
        redis = self._redis()
        ids = sorted(member.decode() for member in await redis.smembers(streams.WORKERS_SET))
        live: list[dict[str, Any]] = []
        if ids:
            values = await redis.mget([streams.worker_key(i) for i in ids])
            gone = [i for i, v in zip(ids, values, strict=True) if v is None]
            live = [orjson.loads(v) for v in values if v is not None]
            if gone:
                pipe = redis.pipeline(transaction=False)
                pipe.srem(streams.WORKERS_SET, *gone)
                # What is left in a dead worker's own queue has expired by then (its readers sent it
                # again to the shared queue); the list goes with it.
                for worker in gone:
                    pipe.expire(self._queue_prefix + streams.worker_queue(worker), self._dead_queue_ttl)
                await pipe.execute()
        self._registry = (started, live)
        return live

    def expected_models(self) -> list[str]:
        if self.config.inference.models:
            return list(self.config.inference.models)
        if self.config.model or self.config.inference.served_model_name:
            return [served_name(self.config)]
        return []

    async def ready(self, timeout: float) -> None:
        live = await self.workers(fresh=True)
        if not live:
            raise RuntimeError("no inference worker is running")
        served = {name for w in live for name in w.get("models", [])}
        missing = [m for m in self.expected_models() if m not in served]
        if missing:
            raise RuntimeError(f"no inference worker serves {', '.join(missing)}")

    def _models_body(self, live: list[dict[str, Any]]) -> bytes:
        """vLLM's ``/v1/models`` list, merged over the live workers (first card per id)."""
        data: list[Any] = []
        seen: set[str] = set()
        for worker in live:
            for card in worker.get("models_body", {}).get("data", []):
                if card.get("id") not in seen:
                    seen.add(card.get("id"))
                    data.append(card)
        # Starlette's JSONResponse separators, as vLLM's own answer.
        return orjson.dumps({"object": "list", "data": data})

    @property
    def _dead_queue_ttl(self) -> int:
        return max(1, int(self.config.upstream.read_timeout_s) + 1)

    def _queue_for(self, live: list[dict[str, Any]], model: str | None) -> str:
        if all(streams.DEFAULT_QUEUE in w.get("queues", []) for w in live):
            return streams.DEFAULT_QUEUE
        if model is not None and any(model in w.get("models", []) for w in live):
            return streams.model_queue(model)
        if any(streams.DEFAULT_QUEUE in w.get("queues", []) for w in live):
            return streams.DEFAULT_QUEUE
        # Unknown model and no shared queue: any worker answers vLLM's own "model not found".
        return str(live[0]["queues"][0])

    # -- sending ---------------------------------------------------------------------------------
    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        headers: Mapping[str, str] | None = None,
        query: str = "",
    ) -> UpstreamResponse:
        live = await self.workers()
        if not live:
            live = await self.workers(fresh=True)
        if not live:
            raise errors.ServiceUnavailable(
                "No inference worker is running (start one with: celery -A gateway worker -Q inference "
                "-P threads).",
                code="no_inference_worker",
            )
        if method == "GET" and path == "/v1/models" and not query:
            payload = self._models_body(live)
            response_headers = [("content-length", str(len(payload))), ("content-type", "application/json")]
            return UpstreamResponse(200, response_headers, _once(payload))

        data = await read_body(body)
        request_id = uuid.uuid4().hex
        model = request_model(data) or None
        shared = self._queue_for(live, model)
        placed: Placed | None = None
        key = lineage.current()
        if key is not None and model is not None and self.config.routing.affinity:
            placed = await self.placement.place(self._redis(), key, live, model, request_id)
        cfg = self.config.upstream
        header_pairs = [[k, v] for k, v in (headers or {}).items()]
        args = [request_id, method, path, query, header_pairs, base64.b64encode(data).decode()]

        def publish(queue: str) -> None:
            # Publishing is a quick synchronous write to Redis; a thread hop would cost more than it.
            self.celery.send_task(
                streams.TASK_NAME, args=args, queue=queue, expires=cfg.read_timeout_s, ignore_result=True
            )

        try:
            publish(placed.queue if placed is not None else shared)
        except BaseException:
            if placed is not None:
                self.placement.finished(placed.worker, request_id)
            raise
        reader = _StreamReader(self, request_id, placed=placed, republish=lambda: publish(shared))
        try:
            status, response_headers = await reader.head()
        except BaseException:
            await reader.cancel()
            raise
        return UpstreamResponse(status, response_headers, reader.chunks(), close=reader.cancel_soon)


def _log_failure(task: asyncio.Task[Any]) -> None:
    """A registry read that failed behind a request (one awaited raises to its caller as well)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("reading the inference workers' registry failed: %s", task.exception())


async def _once(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


class _StreamReader:
    """Reads one request's stream: head first, then body chunks, then the terminal record."""

    def __init__(
        self,
        upstream: WorkerUpstream,
        request_id: str,
        *,
        placed: Placed | None = None,
        republish: Callable[[], None] | None = None,
    ) -> None:
        self.upstream = upstream
        # The worker whose own queue holds the task, until it starts it; if that worker dies first
        # the task is sent once more to the shared queue (``republish``; the claim key prevents a
        # second run).
        self.placed = placed
        self.republish = republish
        self.redis = upstream._redis()
        self.request_id = request_id
        self.key = streams.stream_key(request_id)
        self.last_id = b"0-0"
        self.worker: str | None = None
        self.pending: list[dict[bytes, bytes]] = []
        self.finished = False
        self.cancelled = False
        self.expected_index = 0

    async def _next_records(self, deadline: float, on_timeout: errors.GatewayError) -> None:
        """Block until at least one record arrives (checking the worker's heartbeat between reads)."""
        inf = self.upstream.config.inference
        silent_since = time.monotonic()
        placed_check = silent_since
        while not self.pending:
            answer = await keep_cancellation(self.redis.xread({self.key: self.last_id}, block=_BLOCK_MS))
            if answer:
                for _key, entries in answer:
                    for entry_id, fields in entries:
                        self.last_id = entry_id
                        self.pending.append(fields)
                return
            now = time.monotonic()
            if self.placed is not None and self.worker is None and now >= placed_check:
                placed_check = now + inf.worker_lost_after_s / 2
                await self._check_placed()
            if (
                self.worker is not None
                and now - silent_since >= inf.worker_lost_after_s / 2
                and not await keep_cancellation(self.redis.exists(streams.worker_key(self.worker)))
            ):
                raise errors.UpstreamError(
                    "The inference worker serving this request stopped before finishing it.",
                    code="inference_worker_lost",
                )
            if now >= deadline:
                raise on_timeout

    async def _check_placed(self) -> None:
        """Send the task again to the shared queue when the worker it was placed on is gone."""
        assert self.placed is not None
        worker = self.placed.worker
        if await keep_cancellation(self.redis.exists(streams.worker_key(worker))):
            return
        self._release()
        if self.republish is not None:
            log.warning(
                "inference worker %s is gone before starting %s: sent to the shared queue",
                worker,
                self.request_id,
            )
            self.republish()

    def _release(self) -> None:
        """This round no longer counts on its placed worker's load (it finished, or left it)."""
        if self.placed is not None:
            self.upstream.placement.finished(self.placed.worker, self.request_id)
            self.placed = None

    def _take(self) -> dict[bytes, bytes]:
        record = self.pending.pop(0)
        first = int(record.get(b"i", b"0"))
        if first != self.expected_index:
            raise errors.UpstreamError(
                "The response outran the bound of its Redis stream (inference.stream_maxlen); "
                "part of it was lost.",
                code="inference_stream_overrun",
            )
        self.expected_index = int(record.get(b"j", record.get(b"i", b"0"))) + 1
        return record

    async def head(self) -> tuple[int, list[tuple[str, str]]]:
        cfg = self.upstream.config.upstream
        deadline = time.monotonic() + cfg.read_timeout_s
        timeout = errors.UpstreamTimeout(
            f"No inference worker answered within {cfg.read_timeout_s:g}s.", code="upstream_timeout"
        )
        while True:
            await self._next_records(deadline, timeout)
            record = self._take()
            kind = record.get(b"t")
            if kind == streams.START:
                self.worker = record[b"w"].decode()
                if self.placed is not None and self.placed.worker != self.worker:
                    self._release()
            elif kind == streams.HEAD:
                pairs = [(str(k), str(v)) for k, v in orjson.loads(record[b"h"])]
                return int(record[b"s"]), pairs
            elif kind == streams.END:
                self.finished = True
                raise _terminal_error(record)

    async def chunks(self) -> AsyncIterator[bytes]:
        stall = self.upstream.config.upstream.stall_timeout_s
        timeout = errors.UpstreamTimeout(
            f"The upstream stream stalled for more than {stall:g}s.", code="upstream_timeout"
        )
        try:
            while True:
                await self._next_records(time.monotonic() + stall, timeout)
                out: list[bytes] = []
                while self.pending:
                    record = self._take()
                    kind = record.get(b"t")
                    if kind == streams.DATA:
                        out.append(record[b"b"])
                    elif kind == streams.END:
                        self.finished = True
                        if out:
                            yield b"".join(out)
                        if record.get(b"s") != streams.OK.encode():
                            raise _terminal_error(record)
                        return
                if out:
                    yield b"".join(out)
        finally:
            self._release()
            if self.finished:
                await keep_cancellation(self.redis.delete(self.key))
            else:
                await self.cancel()

    async def cancel(self) -> None:
        """Tell the worker to abort (it polls this key), and drop the stream."""
        self._release()
        if self.cancelled or self.finished:
            return
        self.cancelled = True
        ttl = self.upstream.config.inference.stream_ttl_s
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(streams.cancel_key(self.request_id), b"1", ex=ttl)
        pipe.delete(self.key)
        await keep_cancellation(pipe.execute())

    def cancel_soon(self) -> None:
        """``UpstreamResponse.aclose`` hook (synchronous): cancel in the background."""
        if not (self.cancelled or self.finished):
            task = asyncio.get_running_loop().create_task(self.cancel())
            _background.add(task)
            task.add_done_callback(_background.discard)


_background: set[asyncio.Task[None]] = set()


def _terminal_error(record: dict[bytes, bytes]) -> errors.GatewayError:
    message = record.get(b"m", b"").decode() or "the inference worker failed"
    if record.get(b"s") == streams.CANCELLED.encode():
        return errors.UpstreamError(f"The inference request was cancelled: {message}", code="cancelled")
    return errors.UpstreamError(f"The inference worker failed: {message}", code="inference_error")
