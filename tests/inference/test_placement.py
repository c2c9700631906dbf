"""KV-cache-affine placement with two real vLLM workers: every round of a lineage lands on one engine.

The session's worker plus a second one (two tiny engines; each starts in about a minute on two
cores). Which worker served a round is read from the workers' own heartbeats (their count of
finished requests), not from anything the gateway says about itself.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
import redis

from inference_app.upstream import lineage, streams
from tests.inference.conftest import INFERENCE_REDIS_URL, SERVED, WorkerProcess, engine_config

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful agent. Use the tools when they help. " * 8


def served_counts(since: float) -> dict[str, int]:
    """Finished requests per live worker, from heartbeats written after ``since``."""
    client = redis.Redis.from_url(INFERENCE_REDIS_URL)
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            ids = sorted(m.decode() for m in client.smembers(streams.WORKERS_SET))
            infos = [orjson.loads(raw) for raw in client.mget([streams.worker_key(i) for i in ids]) if raw]
            if len(infos) == 2 and all(info["at"] > since for info in infos):
                return {info["worker"]: sum(info["outcomes"].values()) for info in infos}
            time.sleep(0.2)
    finally:
        client.close()
    raise AssertionError("two fresh heartbeats did not come")


def test_a_lineages_rounds_land_on_one_vllm_worker(
    worker: WorkerProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from inference_app.upstream.worker import WorkerUpstream

    second = WorkerProcess(tiny_model_dir, tmp_path / "second.log", concurrency=4, name="inference-two@%h")
    try:
        second.wait_registered(count=2)
        upstream = WorkerUpstream(engine_config(tiny_model_dir, REDIS_URL=INFERENCE_REDIS_URL))

        async def rounds(key: str, count: int) -> None:
            history = [{"role": "system", "content": SYSTEM}]
            for turn in range(count):
                history.append({"role": "user", "content": f"Step {turn}: go on."})
                body = orjson.dumps({"model": SERVED, "messages": history, "max_tokens": 4})
                with lineage.bind(key):
                    response = await upstream.send(
                        "POST",
                        "/v1/chat/completions",
                        body=body,
                        headers={"content-type": "application/json"},
                    )
                answer = orjson.loads(await response.read())
                assert response.status == 200, answer
                history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})

        for n in range(3):
            key = lineage.key("owner", f"chain-{n}")
            before = served_counts(time.time())
            asyncio.run(rounds(key, 4))
            after = served_counts(time.time())
            gained = sorted(after[w] - before.get(w, 0) for w in after)
            assert gained == [0, 4], (before, after)  # all four rounds on one engine
            (placed,) = (w for w in after if after[w] > before.get(w, 0))
            client = redis.Redis.from_url(INFERENCE_REDIS_URL)
            assert client.get(streams.placement_key(key)) == placed.encode()
            client.close()
    finally:
        second.stop()
        client = redis.Redis.from_url(INFERENCE_REDIS_URL)
        for member in client.smembers(streams.WORKERS_SET):  # the session's worker stays alone
            if not client.exists(streams.worker_key(member.decode())):
                client.srem(streams.WORKERS_SET, member)
        client.close()
