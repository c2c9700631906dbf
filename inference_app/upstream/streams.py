"""The wire between the gateway and the inference workers: Redis keys and stream records.

Per request (id minted by the gateway):

- ``inference:stream:<id>``: a Redis Stream the worker appends to (``XADD`` with ``MAXLEN ~`` and an
  expiry); the gateway reads it with ``XREAD BLOCK``. Records, in order:
  ``start`` (``w``: the worker id) → ``head`` (``s``: HTTP status, ``h``: JSON header pairs) →
  ``data`` (``b``: body bytes, exactly as vLLM produced them; adjacent chunks may be merged) … →
  a terminal ``end`` (``s``: ``ok`` | ``error`` | ``cancelled``, ``m``: a message on error).
  Every record carries its index ``i`` (merged data records also the last one, ``j``), so a reader
  that fell further behind than the stream's bound notices the gap instead of relaying a hole.
- ``inference:cancel:<id>``: set by the gateway when the client goes away; the worker polls it and
  aborts the request in the engine.
- ``inference:claim:<id>``: set once (``SET NX``) by the worker that runs the request, so a message
  redelivered after a worker died is never run a second time.

Per worker: ``inference:worker:<worker id>`` (JSON: served models, queues, vLLM's ``/v1/models``
body) with a short expiry refreshed by a heartbeat, and its id in the set ``inference:workers``. A
request whose worker's key has expired has lost its worker.
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


def model_queue(served_name: str) -> str:
    """The queue of the workers serving one model (used when several models are served)."""
    return f"{DEFAULT_QUEUE}.{served_name}"
