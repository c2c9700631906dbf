"""The inference workers' side of ``/metrics``, read from Redis when scraped: each inference queue's
depth (``gateway_inference_queue_depth{queue}``) and the live workers per served model
(``gateway_inference_workers_live{model}``), from the keys of :mod:`inference_app.upstream.streams`.

Registered when inference runs on Celery workers (a broker and no ``LLM_API_BASE``). One scrape is
three Redis round trips on one pooled connection with a short timeout; when Redis does not answer,
``gateway_inference_registry_up`` is 0 and the other two have no samples.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway.core.config import Config
from gateway.core.metrics import register_scrape_collector
from inference_app.upstream import streams

log = logging.getLogger("inference.metrics")

TIMEOUT_S = 0.5
# Bounds on what one scrape reads and reports (workers listed, models labelled).
MAX_WORKERS = 1024
MAX_MODELS = 64


class InferenceQueueCollector(Collector):
    """See the module docstring. ``prefix``: put before every key (the broker's ``global_keyprefix``)."""

    def __init__(self, redis_url: str, *, prefix: str = "") -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self._client: Any = None

    def _redis(self) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
            )
        return self._client

    def read(self) -> tuple[dict[str, int], dict[str, int]]:
        """(queue depth by queue, live workers by model)."""
        client, prefix = self._redis(), self.prefix
        ids = sorted(member.decode() for member in client.smembers(prefix + streams.WORKERS_SET))[
            :MAX_WORKERS
        ]
        infos = client.mget([prefix + streams.worker_key(i) for i in ids]) if ids else []
        workers: dict[str, int] = {}
        queues = {streams.DEFAULT_QUEUE}
        for raw in infos:
            if raw is None:  # its heartbeat expired: not live
                continue
            info = orjson.loads(raw)
            for model in info.get("models") or ():
                if isinstance(model, str) and (model in workers or len(workers) < MAX_MODELS):
                    workers[model] = workers.get(model, 0) + 1
            for queue in info.get("queues") or ():
                if isinstance(queue, str) and len(queues) <= MAX_MODELS:
                    queues.add(queue)
        names = sorted(queues)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.llen(prefix + name)  # kombu's Redis transport: a queue is a list under its name
        return dict(zip(names, (int(n) for n in pipe.execute()), strict=True)), workers

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        depth, live, up = self._families()
        try:
            queues, workers = self.read()
        except Exception as exc:  # Redis away or slow: the scrape still answers
            log.debug("inference metrics: Redis did not answer: %r", exc)
            up.add_metric([], 0)
            return iter((depth, live, up))
        for queue, count in queues.items():
            depth.add_metric([queue], count)
        for model, count in sorted(workers.items()):
            live.add_metric([model], count)
        up.add_metric([], 1)
        return iter((depth, live, up))

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "gateway_inference_queue_depth",
                "Inference tasks waiting in each Celery inference queue (not yet taken by a worker).",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "gateway_inference_workers_live",
                "Inference workers whose heartbeat is current, by the model they serve.",
                labels=["model"],
            ),
            GaugeMetricFamily(
                "gateway_inference_registry_up",
                "1 when the last scrape read the inference queues and workers from Redis, else 0.",
            ),
        )


def register(config: Config) -> bool:
    """Put the collector on ``/metrics`` when inference runs on Celery workers (a broker and no
    ``LLM_API_BASE``); whether it did."""
    if not config.broker_enabled or config.http_upstreams:
        return False
    register_scrape_collector(InferenceQueueCollector(config.redis_url))
    return True
