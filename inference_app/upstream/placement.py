"""KV-cache-affine placement: every model round of one lineage goes to the inference worker that served
it last, whose vLLM engine still holds the lineage's prefix in its cache.

The record ``inference:placement:<lineage>`` (Redis, so every gateway replica and a restarted gateway
share it) names that worker; each use refreshes its TTL (``routing.placement_ttl_s``). A round goes
to the recorded worker's own queue while the worker is live, serves the model and is under its load
bound; otherwise to the least-loaded live worker serving the model (the lineage moves and the record
with it). A new lineage goes to the worker holding the fewest active lineages (``inference:lineages:
<worker>``, a sorted set by last round), then the least loaded: each worker's cache holds its
lineages' prefixes, so they are evened out across the workers. A worker's load is what its heartbeat advertises (in flight + queued) plus the rounds this
process sent it since that heartbeat and has not seen finish, so a burst of new lineages spreads
instead of herding on one stale heartbeat. Placement is an optimisation only: any failure here
answers None and the round takes the shared queue as without affinity.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from gateway.core.config import Config
from gateway.core.metrics import INFERENCE_PLACEMENTS
from inference_app.upstream import streams

log = logging.getLogger("inference.placement")

HIT, MOVED, NEW, FALLBACK = "hit", "moved", "new", "fallback"
# A lineage with a round in this window counts as active on its worker when new lineages are placed.
ACTIVE_S = 600.0


@dataclass(frozen=True)
class Placed:
    """Where one round goes: a worker, its own queue, and how it was chosen (hit / moved / new)."""

    worker: str
    queue: str
    outcome: str


class Placement:
    """One per ``WorkerUpstream`` (per gateway process): the rounds it sent and has not seen finish."""

    def __init__(self, config: Config) -> None:
        self.config = config
        # worker id → {request id: wall-clock time sent}
        self._sent: dict[str, dict[str, float]] = {}
        # worker id → new lineages this process placed there and has not yet recorded in Redis
        self._unrecorded: dict[str, int] = {}

    # -- load ------------------------------------------------------------------------------------
    def load(self, info: dict[str, Any]) -> int:
        """Requests on ``info``'s worker: its heartbeat's in-flight (taken, running or prefetched) +
        queued, plus this process's own rounds sent after that heartbeat and not yet finished
        (earlier ones the heartbeat counts)."""
        held = max(_int(info.get("running")), _int(info.get("in_flight")))
        advertised = held + _int(info.get("queued"))
        sent = self._sent.get(str(info.get("worker")))
        if not sent:
            return advertised
        beat = info.get("at")
        at = float(beat) if isinstance(beat, int | float) else 0.0
        for request_id in [r for r, t in sent.items() if t <= at]:
            del sent[request_id]  # a heartbeat newer than the send has counted it (or it is done)
        return advertised + len(sent)

    def bound(self, info: dict[str, Any]) -> int:
        """The load at which the worker takes no more placed rounds (0: unbounded)."""
        return self.config.routing.max_worker_load or _int(info.get("max_load"))

    def sent(self, worker: str, request_id: str) -> None:
        self._sent.setdefault(worker, {})[request_id] = time.time()

    def finished(self, worker: str, request_id: str) -> None:
        sent = self._sent.get(worker)
        if sent is not None:
            sent.pop(request_id, None)
            if not sent:
                del self._sent[worker]

    # -- choosing --------------------------------------------------------------------------------
    def choose(
        self,
        previous: str | None,
        live: list[dict[str, Any]],
        model: str,
        lineages: dict[str, int] | None = None,
    ) -> Placed | None:
        """The worker for a round of a lineage last served by ``previous`` (None: a new lineage, placed
        on the worker holding the fewest active lineages (``lineages``), then the least loaded, among
        those under their bound)."""
        alive = {str(w.get("worker")) for w in live}
        for gone in [w for w in self._sent if w not in alive]:
            del self._sent[gone]  # a dead worker's rounds are not waited for (nor kept) here
        candidates = _candidates(live, model)
        if not candidates:
            return None
        loads = {str(w["worker"]): self.load(w) for w in candidates}
        by_id = {str(w["worker"]): w for w in candidates}
        held = by_id.get(previous) if previous is not None else None
        if held is not None:
            bound = self.bound(held)
            if not bound or loads[str(held["worker"])] < bound:
                return Placed(str(held["worker"]), str(held["queue"]), HIT)
        least = min(loads.values())
        if held is not None and loads[str(held["worker"])] == least:
            # Over its bound, but no other worker has more room: moving would only lose the cache.
            return Placed(str(held["worker"]), str(held["queue"]), HIT)
        if previous is None and lineages is not None:
            # A new lineage: even out the lineages (each worker's cache holds its lineages' prefixes),
            # then the load; a worker at its bound takes none while another has room.
            room = [w for w in loads if not self.bound(by_id[w]) or loads[w] < self.bound(by_id[w])]
            ranked = {w: (lineages.get(w, 0) + self._unrecorded.get(w, 0), loads[w]) for w in room or loads}
            best = min(ranked.values())
            chosen = by_id[random.choice([w for w, rank in ranked.items() if rank == best])]
            return Placed(str(chosen["worker"]), str(chosen["queue"]), NEW)
        chosen = by_id[random.choice([w for w, n in loads.items() if n == least])]
        return Placed(str(chosen["worker"]), str(chosen["queue"]), NEW if previous is None else MOVED)

    async def _active_lineages(self, client: Any, live: list[dict[str, Any]], model: str) -> dict[str, int]:
        """Per candidate worker, the lineages placed on it with a round in the last ``ACTIVE_S``."""
        workers = [str(w["worker"]) for w in _candidates(live, model)]
        since = time.time() - self.active_s
        pipe = client.pipeline(transaction=False)
        for worker in workers:
            pipe.zcount(streams.worker_lineages_key(worker), since, "+inf")
        counts = await pipe.execute()
        return {w: int(n) for w, n in zip(workers, counts, strict=True)}

    @property
    def active_s(self) -> float:
        return min(ACTIVE_S, self.config.routing.placement_ttl_s)

    async def place(
        self, client: Any, lineage: str, live: list[dict[str, Any]], model: str, request_id: str
    ) -> Placed | None:
        """Look the lineage up, choose its worker and record it; None (the shared queue) when no worker
        advertises its own queue for ``model`` or Redis fails. The round counts on the chosen worker's
        load from here (:meth:`finished` takes it off), before any further wait, so concurrent
        placements see it."""
        from redis.exceptions import ResponseError

        key = streams.placement_key(lineage)
        placed: Placed | None = None
        ttl = max(1, int(self.config.routing.placement_ttl_s))
        try:
            try:
                raw = await client.getex(key, ex=ttl)
            except ResponseError:  # not a string (garbage): overwritten below
                raw = b"?"
            previous = None if raw is None else bytes(raw).decode("utf-8", "replace")
            counts = await self._active_lineages(client, live, model) if previous is None else None
            placed = self.choose(previous, live, model, counts)
            if placed is None:
                INFERENCE_PLACEMENTS.labels(FALLBACK).inc()
                return None
            self.sent(placed.worker, request_id)
            if placed.outcome == NEW:
                self._unrecorded[placed.worker] = self._unrecorded.get(placed.worker, 0) + 1
            now = time.time()
            held = streams.worker_lineages_key(placed.worker)
            pipe = client.pipeline(transaction=False)
            if placed.worker != previous:
                pipe.set(key, placed.worker, ex=ttl)
                pipe.zremrangebyscore(held, "-inf", now - ttl)  # lineages whose record has expired
                if previous is not None:
                    pipe.zrem(streams.worker_lineages_key(previous), lineage)
            pipe.zadd(held, {lineage: now})
            pipe.expire(held, ttl)
            try:
                await pipe.execute()
            finally:
                if placed.outcome == NEW:
                    self._unrecorded[placed.worker] -= 1
        except Exception as exc:  # placement never fails a request
            log.warning("placing lineage %s failed, using the shared queue: %r", lineage[:8], exc)
            INFERENCE_PLACEMENTS.labels(FALLBACK).inc()
            if placed is not None:
                self.finished(placed.worker, request_id)
            return None
        INFERENCE_PLACEMENTS.labels(placed.outcome).inc()
        return placed


def _candidates(live: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """The live workers that serve ``model`` and take placed rounds on their own queue."""
    return [
        w
        for w in live
        if model in (w.get("models") or ()) and isinstance(w.get("queue"), str) and w.get("worker")
    ]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
