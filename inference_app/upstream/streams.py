"""The wire between the gateway and the inference workers: Redis keys and stream records.

Per request: ``inference:stream:<id>`` (``XADD`` by the worker, ``XREAD BLOCK`` by the gateway;
records ``start`` → ``head`` → ``data``… → ``end``, each indexed so a reader that fell behind the
stream's bound sees the gap), ``inference:cancel:<id>`` and ``inference:claim:<id>`` (``SET NX``:
never run twice). Per worker: ``inference:worker:<id>`` refreshed by a heartbeat, listed in
``inference:workers``; a request whose worker's key expired has lost its worker. Each worker also
consumes a queue of its own, ``inference.w.<id>``, where the gateway places the rounds of the
lineages it holds (``inference:placement:<lineage>`` → worker id; see ``placement``).

The heartbeat's JSON: ``worker``, ``models``, ``queues``, ``queue`` (its own), ``running`` (requests
in its engine), ``in_flight`` (tasks taken and not finished), ``queued`` (its own queue's depth),
``max_load`` (its load bound), ``at`` (wall-clock time of the beat), ``max_model_len``,
``prefetch_count``, ``outcomes``, ``models_body``.
"""

from __future__ import annotations

TASK_NAME = "inference.generate"
DEFAULT_QUEUE = "inference"
WORKERS_SET = "inference:workers"

# Record types (field ``t``).
START = b"start"
HEAD = b"head"
DATA = b"data"
END = b"end"

OK = "ok"
ERROR = "error"
CANCELLED = "cancelled"


def stream_key(request_id: str) -> str:
    return f"inference:stream:{request_id}"


def cancel_key(request_id: str) -> str:
    return f"inference:cancel:{request_id}"


def claim_key(request_id: str) -> str:
    return f"inference:claim:{request_id}"


def worker_key(worker_id: str) -> str:
    return f"inference:worker:{worker_id}"


def worker_queue(worker_id: str) -> str:
    """The queue only this worker consumes (placed rounds)."""
    return f"{DEFAULT_QUEUE}.w.{worker_id}"


def placement_key(lineage: str) -> str:
    """The worker that served this lineage last (its value), kept ``routing.placement_ttl_s``."""
    return f"inference:placement:{lineage}"


def model_queue(served_name: str) -> str:
    """The queue of the workers serving one model (used when several models are served)."""
    return f"{DEFAULT_QUEUE}.{served_name}"


def worker_lineages_key(worker_id: str) -> str:
    """The lineages placed on this worker (a sorted set scored by their last round's time)."""
    return f"inference:lineages:{worker_id}"
