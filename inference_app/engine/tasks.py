"""The inference worker: a Celery task on the ``inference`` queue, served by the process's one engine.

Run ``celery -A gateway worker -Q inference -P threads -c 32``: the pool must be ``threads`` (or
``solo``) because vLLM spawns its engine core, which a daemonic prefork child may not. The engine
loads once at ``worker_init``; the stream writer, heartbeat and cancel watcher run on its loop.
``acks_late`` plus a ``claim`` key: a redelivered request is never run twice. Besides the shared
queue (and its model's queue) each worker consumes a queue of its own, ``inference.w.<host:pid>``,
where the gateway places the rounds of lineages whose prefix its engine caches; the heartbeat
advertises that queue, its depth, the requests it holds and the worker's load bound.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import threading
import time
from typing import Any

import orjson
from celery import shared_task
from celery.signals import worker_init, worker_shutdown
from celery.worker import state as worker_state

from gateway.core import tracing
from gateway.core.aio import keep_cancellation
from gateway.core.config import Config, get_config
from inference_app.engine.host import EngineHost, get_engine_host
from inference_app.upstream import streams

log = logging.getLogger("inference.worker")

Record = dict[bytes, bytes]

# Minimum prefetch multiplier of an inference worker (see _load_engine_at_worker_start).
PREFETCH_MULTIPLIER = 4


def worker_id() -> str:
    """This worker process's id in the registry (and in its own queue's name)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkerRuntime:
    """Per worker process: the engine host plus the Redis side of every request it serves."""

    def __init__(self, config: Config, queues: list[str], *, key_prefix: str = "") -> None:
        self.config = config
        self.queues = queues
        self.worker_id = worker_id()
        self.own_queue = streams.worker_queue(self.worker_id)
        # The broker's ``global_keyprefix``: kombu's Redis lists carry it, our own keys do not.
        self.key_prefix = key_prefix
        self.host: EngineHost = get_engine_host(config)
        self.redis: Any = None
        self._writes: asyncio.Queue[tuple[str, Record, bool, asyncio.Future[None] | None]] | None = None
        self._inflight: dict[str, asyncio.Event] = {}
        self._loops: list[asyncio.Task[None]] = []
        self.outcomes: dict[str, int] = {streams.OK: 0, streams.ERROR: 0, streams.CANCELLED: 0}
        self.started = threading.Event()
        self._stopping = threading.Event()
        self.prefetch_count = 0

    # -- start / stop ----------------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> None:
        self.host.start_blocking(timeout)
        self.host.run(self._start_loops()).result(timeout)
        import redis

        self._heartbeat_once(redis.Redis.from_url(self.config.redis_url))
        threading.Thread(target=self._heartbeat, name="inference-heartbeat", daemon=True).start()
        self.started.set()
        log.info("inference worker %s serves %s on %s", self.worker_id, self.host.served_name, self.queues)

    async def _start_loops(self) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.Redis.from_url(self.config.redis_url, max_connections=64)
        self._writes = asyncio.Queue()
        for loop in (self._writer(), self._cancel_watcher()):
            self._loops.append(asyncio.get_running_loop().create_task(loop))

    def stop(self) -> None:
        self._stopping.set()

        async def _stop() -> None:
            for task in self._loops:
                task.cancel()
            if self.redis is not None:
                await self.redis.srem(streams.WORKERS_SET, self.worker_id)
                await self.redis.delete(streams.worker_key(self.worker_id))
                await self.redis.aclose()

        try:
            self.host.run(_stop()).result(5)
        except Exception:  # best effort on the way out
            log.warning("inference worker: could not deregister cleanly", exc_info=True)

    # -- the loops -------------------------------------------------------------------------------
    @property
    def max_load(self) -> int:
        """In-flight plus queued requests past which the gateway places no more lineages here
        (``routing.max_worker_load``, else the engine's ``max_num_seqs``; 0: no bound known)."""
        return self.config.routing.max_worker_load or self.host.max_num_seqs

    def _heartbeat_once(self, client: Any) -> None:
        inf = self.config.inference
        own = self.own_queue in self.queues
        # kombu's Redis transport keeps a queue as a list under its name (priority 0, the only one used).
        queued = int(client.llen(self.key_prefix + self.own_queue)) if own else 0
        info = {
            "worker": self.worker_id,
            "models": [self.host.served_name],
            "queues": self.queues,
            "queue": self.own_queue if own else None,
            "running": self.host.unfinished_requests,
            # Tasks taken from the queues and not finished: running, or prefetched and waiting for a
            # thread (with acks_late and a prefetch multiplier these can be many, and no queue shows them).
            "in_flight": len(worker_state.reserved_requests),
            "queued": queued,
            "max_load": self.max_load,
            "at": time.time(),
            "max_model_len": self.host.max_model_len,
            "prefetch_count": self.prefetch_count,
            "outcomes": dict(self.outcomes),
            "models_body": orjson.loads(self.host.models_body),
        }
        pipe = client.pipeline(transaction=False)
        pipe.set(
            streams.worker_key(self.worker_id), orjson.dumps(info), px=int(inf.worker_lost_after_s * 1000)
        )
        pipe.sadd(streams.WORKERS_SET, self.worker_id)
        pipe.execute()

    def _heartbeat(self) -> None:
        """A plain thread, not a coroutine: a busy engine loop must not make a live worker look dead."""
        import redis

        client = redis.Redis.from_url(self.config.redis_url)
        while not self._stopping.wait(self.config.inference.heartbeat_interval_s):
            if self.host.dead:
                # A dead engine stops vouching for itself: its requests fail, /ready says so.
                log.error("inference worker %s: the vLLM engine died", self.worker_id)
                client.delete(streams.worker_key(self.worker_id))
                return
            try:
                self._heartbeat_once(client)
            except Exception:  # Redis blips must not stop the heartbeat
                log.warning("inference worker: heartbeat failed", exc_info=True)

    async def _cancel_watcher(self) -> None:
        while True:
            await asyncio.sleep(self.config.inference.cancel_poll_interval_s)
            if not self._inflight:
                continue
            ids = list(self._inflight)
            try:
                flags = await keep_cancellation(self.redis.mget([streams.cancel_key(i) for i in ids]))
            except Exception:
                log.warning("inference worker: cancel poll failed", exc_info=True)
                continue
            for request_id, flag in zip(ids, flags, strict=True):
                event = self._inflight.get(request_id)
                if flag is not None and event is not None:
                    event.set()

    async def _writer(self) -> None:
        """One pipeline per loop turn for every record of every request (merging adjacent data)."""
        assert self._writes is not None
        inf = self.config.inference
        while True:
            batch = [await self._writes.get()]
            while not self._writes.empty():
                batch.append(self._writes.get_nowait())
            pipe = self.redis.pipeline(transaction=False)
            pending: tuple[str, Record] | None = None
            waiters: list[asyncio.Future[None]] = []

            def flush(item: tuple[str, Record] | None, pipe: Any = pipe) -> None:
                if item is not None:
                    pipe.xadd(item[0], item[1], maxlen=inf.stream_maxlen, approximate=True)

            for key, record, expire, waiter in batch:
                if (
                    pending is not None
                    and pending[0] == key
                    and record[b"t"] == streams.DATA
                    and pending[1][b"t"] == streams.DATA
                ):
                    pending[1][b"b"] += record[b"b"]
                    pending[1][b"j"] = record[b"i"]
                else:
                    flush(pending)
                    pending = (key, dict(record))
                if expire:
                    flush(pending)
                    pending = None
                    pipe.expire(key, inf.stream_ttl_s)
                if waiter is not None:
                    waiters.append(waiter)
            flush(pending)
            try:
                await keep_cancellation(pipe.execute())
            except Exception as exc:  # reported to the requests that wait
                log.warning("inference worker: stream write failed", exc_info=True)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                continue
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _emit(self, key: str, record: Record, *, expire: bool = False, wait: bool = False) -> Any:
        assert self._writes is not None
        waiter = asyncio.get_running_loop().create_future() if wait else None
        self._writes.put_nowait((key, record, expire, waiter))
        return waiter

    # -- one request -----------------------------------------------------------------------------
    async def handle(
        self, request_id: str, method: str, path: str, query: str, headers: list[list[str]], body: bytes
    ) -> str:
        """Serve one request on the engine loop, streaming its answer to ``inference:stream:<id>``."""
        ttl = self.config.inference.stream_ttl_s
        claimed = await self.redis.set(streams.claim_key(request_id), self.worker_id, nx=True, ex=ttl)
        if not claimed:
            log.warning("inference request %s was already started; not running it again", request_id)
            return "duplicate"
        if await self.redis.exists(streams.cancel_key(request_id)):
            return streams.CANCELLED
        key = streams.stream_key(request_id)
        index = 0

        def emit(record: Record, **kwargs: bool) -> Any:
            # Every record is numbered, so a reader notices records the stream bound trimmed away.
            nonlocal index
            record[b"i"] = str(index).encode()
            index += 1
            return self._emit(key, record, **kwargs)

        disconnect = asyncio.Event()
        self._inflight[request_id] = disconnect
        outcome, message = streams.OK, ""
        try:
            emit({b"t": streams.START, b"w": self.worker_id.encode()}, expire=True)
            served = await self.host.serve(
                method, path, query, [(k, v) for k, v in headers], body, disconnect=disconnect
            )
            emit({b"t": streams.HEAD, b"s": str(served.status).encode(), b"h": orjson.dumps(served.headers)})
            async for chunk in served.chunks:
                emit({b"t": streams.DATA, b"b": chunk})
            if disconnect.is_set():
                outcome = streams.CANCELLED
        except Exception as exc:  # becomes the terminal record
            outcome = streams.CANCELLED if disconnect.is_set() else streams.ERROR
            message = str(exc) or type(exc).__name__
            if outcome == streams.ERROR:
                log.exception("inference request %s failed", request_id)
        finally:
            self._inflight.pop(request_id, None)
        self.outcomes[outcome] += 1
        end = {b"t": streams.END, b"s": outcome.encode(), b"m": message.encode()}
        await emit(end, expire=True, wait=True)
        return outcome


_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> WorkerRuntime:
    """The process's worker runtime, started on first use (normally at worker start)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = WorkerRuntime(get_config(), [streams.DEFAULT_QUEUE])
            _runtime.start()
        return _runtime


@shared_task(name=streams.TASK_NAME, acks_late=True, ignore_result=True)
def generate_task(
    request_id: str, method: str, path: str, query: str, headers: list[list[str]], body_b64: str
) -> str:
    """Run one OpenAI request through this worker's engine; the answer goes to the request's stream."""
    runtime = get_runtime()
    body = base64.b64decode(body_b64)
    started = time.monotonic()
    # The task's span (Celery's instrumentation) is the engine request's parent: the engine loop's
    # thread does not see it, so it travels in the headers as for an HTTP upstream.
    traced = [[k, v] for k, v in tracing.with_trace_headers([(k, v) for k, v in headers])]
    outcome = runtime.host.run(runtime.handle(request_id, method, path, query, traced, body)).result()
    log.info(
        "inference request %s %s %s: %s in %.3fs",
        request_id,
        method,
        path,
        outcome,
        time.monotonic() - started,
    )
    return outcome


def _consumes_inference(sender: Any) -> list[str]:
    try:
        names = list(sender.app.amqp.queues.consume_from)
    except Exception:  # no queue information: not an inference worker
        return []
    return [n for n in names if n == streams.DEFAULT_QUEUE or n.startswith(streams.DEFAULT_QUEUE + ".")]


@worker_init.connect
def _load_engine_at_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """Load the engine before the worker takes tasks, when it consumes an inference queue."""
    global _runtime
    queues = _consumes_inference(sender)
    if not queues:
        return
    pool = getattr(sender, "pool_cls", None)
    pool_name = getattr(pool, "__module__", str(pool))
    if "prefork" in pool_name:
        raise RuntimeError(
            "the inference worker needs `-P threads` (or solo): vLLM cannot start its engine in a "
            "prefork child. Start it with: celery -A gateway worker -Q inference -P threads -c 32"
        )
    # With acks_late a finished task counts against the prefetch limit until its ack is sent; headroom
    # keeps new requests flowing into the engine's batch meanwhile.
    sender.prefetch_multiplier = max(int(sender.prefetch_multiplier or 1), PREFETCH_MULTIPLIER)
    config = get_config()
    # The model's queue, and this worker's own (where the gateway places lineages it serves).
    for own_queue in (
        streams.model_queue(get_engine_host(config).served_name),
        streams.worker_queue(worker_id()),
    ):
        if own_queue not in queues:
            sender.app.amqp.queues.select_add(own_queue)
            queues.append(own_queue)
    options = sender.app.conf.broker_transport_options or {}
    with _runtime_lock:
        if _runtime is None:
            _runtime = WorkerRuntime(config, queues, key_prefix=str(options.get("global_keyprefix") or ""))
            _runtime.prefetch_count = int(sender.concurrency or 0) * sender.prefetch_multiplier
            _runtime.start()


@worker_shutdown.connect
def _unregister_at_worker_stop(**kwargs: Any) -> None:
    global _runtime
    with _runtime_lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.stop()
        runtime.host.shutdown()
