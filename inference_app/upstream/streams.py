"""The wire between the gateway and the inference workers: Redis keys and stream records.

Per request: ``inference:stream:<id>`` (``XADD`` by the worker, ``XREAD BLOCK`` by the gateway;
records ``start`` → ``head`` → ``data``… → ``end``, each indexed so a reader that fell behind the
stream's bound sees the gap), ``inference:cancel:<id>`` and ``inference:claim:<id>`` (``SET NX``:
never run twice). Per worker: ``inference:worker:<id>`` refreshed by a heartbeat, listed in
``inference:workers``; a request whose worker's key expired has lost its worker.
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
