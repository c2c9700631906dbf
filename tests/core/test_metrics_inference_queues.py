"""The inference queues and workers on ``/metrics``, read from a real Redis when scraped
(``inference_app.upstream.queue_metrics``). Keys live under a prefix of this test's own."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from prometheus_client import CollectorRegistry

from gateway.core import metrics
from inference_app.upstream import streams
from inference_app.upstream.queue_metrics import InferenceQueueCollector
from tests.conftest import REDIS_URL
from tests.servers import free_port


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"test-{uuid.uuid4().hex}:"
    client = redis.Redis.from_url(REDIS_URL)
    yield value
    keys = list(client.scan_iter(match=f"{value}*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_queue_depth_and_live_workers_per_model(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    workers = {
        "w1": {"models": ["llama"], "queues": ["inference.llama"]},
        "w2": {"models": ["llama"], "queues": ["inference.llama"]},
        "w3": {"models": ["qwen"], "queues": ["inference"]},
    }
    client.sadd(prefix + streams.WORKERS_SET, *workers, "gone")  # "gone": its heartbeat key expired
    for worker_id, info in workers.items():
        client.set(prefix + streams.worker_key(worker_id), orjson.dumps(info), px=60_000)
    client.rpush(prefix + "inference.llama", b"t1", b"t2", b"t3")
    client.rpush(prefix + "inference", b"t4")
    client.close()

    registry = CollectorRegistry()
    registry.register(InferenceQueueCollector(REDIS_URL, prefix=prefix))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("gateway_inference_queue_depth", queue="inference.llama") == 3
    assert value("gateway_inference_queue_depth", queue="inference") == 1
    assert value("gateway_inference_workers_live", model="llama") == 2
    assert value("gateway_inference_workers_live", model="qwen") == 1
    assert value("gateway_inference_registry_up") == 1


def test_the_collector_is_on_the_metrics_page_and_redis_away_is_reported_quickly(
    prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = InferenceQueueCollector(REDIS_URL, prefix=prefix)
    metrics.register_scrape_collector(collector)
    try:
        text = metrics.exposition().decode()
        assert 'gateway_inference_queue_depth{queue="inference"} 0.0' in text
        assert "gateway_inference_registry_up 1.0" in text
        with monkeypatch.context() as several:  # several server processes: each scrape's own registry
            several.setenv(metrics.MULTIPROC_ENV, str(tmp_path))
            assert "gateway_inference_registry_up 1.0" in metrics.exposition().decode()
        # Another of its class replaces it (a config reloaded): one set of samples, no duplicates.
        away = InferenceQueueCollector(f"redis://127.0.0.1:{free_port()}/0")
        metrics.register_scrape_collector(away)
        started = time.monotonic()
        text = metrics.exposition().decode()
        assert time.monotonic() - started < 2
        assert "gateway_inference_registry_up 0.0" in text
        assert "gateway_inference_queue_depth{" not in text
    finally:
        for registered in list(metrics._scrape_collectors):
            metrics.REGISTRY.unregister(registered)
            metrics._scrape_collectors.remove(registered)


def test_registered_only_when_inference_runs_on_celery_workers() -> None:
    from gateway.core.config import get_config, replace
    from inference_app.upstream import queue_metrics

    base = get_config()
    try:
        assert not queue_metrics.register(replace(base, redis_url="", llm_api_base=""))
        assert not queue_metrics.register(
            replace(base, redis_url=REDIS_URL, llm_api_base="http://127.0.0.1:1")
        )
        assert metrics._scrape_collectors == []
        assert queue_metrics.register(replace(base, redis_url=REDIS_URL, llm_api_base=""))
        (collector,) = metrics._scrape_collectors
        assert isinstance(collector, InferenceQueueCollector) and collector.redis_url == REDIS_URL
    finally:
        for registered in list(metrics._scrape_collectors):
            metrics.REGISTRY.unregister(registered)
            metrics._scrape_collectors.remove(registered)
