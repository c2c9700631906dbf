"""The Celery worker path: batching, readiness, cancellation, a worker killed mid-stream.

One real worker for the session (``worker`` fixture); the last test kills it, so it stays last.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from gateway.core import config as config_module
from tests.inference.conftest import (
    INFERENCE_REDIS_URL,
    SERVED,
    Gateway,
    WorkerProcess,
    engine_config,
    worker_info,
)

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
# vLLM's default --max-num-seqs on a CPU (the worker's own load bound for placement).
MAX_NUM_SEQS = 128
# 128 sequences of 490 tokens: many seconds of work, so the worker is killed mid-generation.
LONG: dict[str, object] = {
    "model": SERVED,
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 490,
    "n": 128,
    "ignore_eos": True,
    "stream": True,
}


def test_worker_registers_what_it_serves(worker_gateway: Gateway) -> None:
    info = worker_info()
    assert info["prefetch_count"] == 8 * 4  # concurrency x the inference worker's multiplier
    assert info["models"] == [SERVED]
    # The shared queue, the model's, and its own (where the gateway places lineages it served).
    assert info["queues"] == ["inference", f"inference.{SERVED}", f"inference.w.{info['worker']}"]
    assert info["queue"] == f"inference.w.{info['worker']}"
    assert info["max_model_len"] == 512
    assert info["max_load"] == MAX_NUM_SEQS  # the engine's own bound
    assert (info["running"], info["queued"]) == (0, 0)


def test_eight_concurrent_requests_are_batched(
    worker_gateway: Gateway, worker: WorkerProcess, tiny_model_dir: Path
) -> None:
    """Eight requests the worker holds at once are generated together: it writes the first token of
    every one of them before it writes the last token of any.

    Done one after the other (a worker that takes one task at a time, or an engine that does not
    batch), the second request's first token would come after the first request's last. The check
    is on the order of events, not on a speed, and the times are the Redis server's (each stream
    entry's id is the millisecond it was written).

    The engine's processes are paused while the eight are published and taken: on a 2-core machine
    the engine generating the first request starves the worker's Celery consumer of CPU, which then
    takes the next task from Redis only every half second or so (seen with ``redis-cli monitor``).
    """
    import psutil

    from inference_app.upstream import streams
    from inference_app.upstream.worker import WorkerUpstream

    upstream = WorkerUpstream(engine_config(tiny_model_dir, REDIS_URL=INFERENCE_REDIS_URL))
    body = {"model": SERVED, "prompt": "def", "max_tokens": 400, "ignore_eos": True, "stream": True}
    encoded = base64.b64encode(json.dumps(body).encode()).decode()
    headers = [["content-type", "application/json"]]
    ids = [uuid.uuid4().hex for _ in range(8)]
    keys = [streams.stream_key(request_id) for request_id in ids]
    client = redis.Redis.from_url(INFERENCE_REDIS_URL)

    def taken() -> int:
        """How many of the eight the worker has started (each stream's first record)."""
        return sum(1 for key in keys if client.xrange(key, count=1))

    engine = psutil.Process(worker.proc.pid).children(recursive=True)
    assert engine, "the worker's engine runs in child processes"
    for process in engine:
        process.send_signal(signal.SIGSTOP)
    try:
        for request_id in ids:
            upstream.celery.send_task(
                streams.TASK_NAME,
                args=[request_id, "POST", "/v1/completions", "", headers, encoded],
                queue=streams.model_queue(SERVED),
                ignore_result=True,
            )
        deadline = time.monotonic() + 15
        while taken() < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"taken by the worker before the engine resumed: {taken()}")
        time.sleep(0.5)  # their requests reach the engine's queue
    finally:
        for process in engine:
            process.send_signal(signal.SIGCONT)

    first_data: list[int] = []
    end: list[int] = []
    deadline = time.monotonic() + 120
    try:
        for request_id, key in zip(ids, keys, strict=True):
            while True:
                entries = client.xrange(key)
                ends = [fields for _, fields in entries if fields[b"t"] == streams.END]
                if ends:
                    break
                assert time.monotonic() < deadline, f"request {request_id} did not finish"
                time.sleep(0.1)
            assert ends[0][b"s"] == streams.OK.encode(), ends[0]
            data = [entry_id for entry_id, fields in entries if fields[b"t"] == streams.DATA]
            text = b"".join(fields[b"b"] for _, fields in entries if fields[b"t"] == streams.DATA)
            assert text.count(b'"text"') >= 1 and text.rstrip().endswith(b"data: [DONE]"), text[-200:]
            first_data.append(int(data[0].split(b"-")[0]))
            end.append(int(entries[-1][0].split(b"-")[0]))
            client.delete(key)
    finally:
        client.close()
    start = min(first_data)
    print(f"first tokens written within {max(first_data) - start} ms; first end at +{min(end) - start} ms")
    assert max(first_data) <= min(end), (first_data, end)


@pytest.mark.django_db(transaction=True)
def test_ready_reports_workers_per_configured_model(worker_gateway: Gateway) -> None:
    r = httpx.get(f"{worker_gateway.url}/ready", timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["checks"]["upstream"] == {"status": "ok"}

    from inference_app.upstream import http as upstream

    current = config_module.get_config()
    try:
        config_module.set_config(config_module.replace(current, inference__models=(SERVED, "other-model")))
        upstream._upstreams.clear()
        r = httpx.get(f"{worker_gateway.url}/ready", timeout=10)
        assert r.status_code == 503
        assert r.json()["checks"]["upstream"] == {
            "status": "fail",
            "error": "no inference worker serves other-model",
        }
    finally:
        config_module.set_config(current)
        upstream._upstreams.clear()


def test_no_worker_is_503(tiny_model_dir: Path) -> None:
    """With the broker configured but no worker registered, the gateway answers 503 at once."""
    from inference_app.upstream.worker import WorkerUpstream

    config = engine_config(tiny_model_dir, REDIS_URL="redis://127.0.0.1:6379/11")
    upstream = WorkerUpstream(config)

    async def call() -> None:
        await upstream.send("POST", CHAT, body=b"{}", headers={"content-type": "application/json"})

    from gateway.core import errors

    with pytest.raises(errors.ServiceUnavailable) as info:
        asyncio.run(call())
    assert info.value.code == "no_inference_worker"


def test_killing_the_worker_mid_stream_gives_the_client_an_error_promptly(
    worker_gateway: Gateway, worker: WorkerProcess
) -> None:
    """SIGKILL (worker and engine core) while streaming: the client gets an error event within
    ``worker_lost_after_s`` (2 s here) plus one read interval, not a hung stream."""
    lines: list[str] = []
    with httpx.stream("POST", f"{worker_gateway.url}{CHAT}", json=LONG, timeout=60) as r:
        assert r.status_code == 200
        iterator = r.iter_lines()
        lines.append(next(iterator))
        worker.kill()
        killed = time.monotonic()
        for line in iterator:
            if line:
                lines.append(line)
        elapsed = time.monotonic() - killed
    assert elapsed < 5, f"the client waited {elapsed:.1f}s"
    # Like vLLM's own mid-stream failures: an error chunk, then the stream's terminator.
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][len("data: ") :])
    assert error == {
        "error": {
            "message": "The inference worker serving this request stopped before finishing it.",
            "type": "server_error",
            "param": None,
            "code": "inference_worker_lost",
        }
    }
    # It did not finish: no chunk carries a finish_reason.
    assert not any('"finish_reason":"stop"' in line or '"finish_reason":"length"' in line for line in lines)
