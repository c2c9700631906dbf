"""Redis is optional: with REDIS_URL, Channels uses channels-redis and Celery uses Redis as broker."""

from __future__ import annotations

import pytest

from gateway.celery import app as celery_app
from tests.conftest import REDIS_URL


def test_celery_app_has_its_queues() -> None:
    names = {q.name for q in celery_app.conf.task_queues}
    assert names == {"inference", "tools", "responses"}


def test_without_redis_tasks_run_in_process(settings) -> None:  # type: ignore[no-untyped-def]
    from gateway.celery import ping

    assert celery_app.conf.task_always_eager is True
    assert ping.delay().get(timeout=1) == "pong"


def test_celery_over_real_redis_broker() -> None:
    """A real worker (in a thread) consumes the tools queue from the real Redis broker."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    from gateway.celery import configure
    from gateway.core.config import get_config, replace

    app = configure(Celery("gateway-test"), replace(get_config(), redis_url=REDIS_URL))
    assert app.conf.task_always_eager is False

    def pong() -> str:
        return "pong"

    # Not shared: a shared task would join every Celery app made later in this process (a second
    # "gateway.ping" beside gateway.celery's own).
    ping = app.task(name="gateway.ping", shared=False)(pong)  # routed to "tools" by configure()
    with start_worker(app, queues=["tools"], perform_ping_check=False, pool="solo", loglevel="WARNING"):
        result = ping.apply_async()
        assert result.get(timeout=20) == "pong"


@pytest.mark.process
def test_settings_pick_redis_layer_when_configured() -> None:
    import subprocess
    import sys

    from tests.servers import ROOT

    code = (
        "import django;django.setup();from django.conf import settings;"
        "print(settings.CHANNEL_LAYERS['default']['BACKEND']);"
        "from gateway.celery import app;print(app.conf.broker_url, app.conf.task_always_eager)"
    )
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "gateway.settings", "REDIS_URL": REDIS_URL}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["channels_redis.core.RedisChannelLayer", REDIS_URL, "False"]
    env.pop("REDIS_URL")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["channels.layers.InMemoryChannelLayer", "memory://", "True"]


pytestmark = pytest.mark.filterwarnings("ignore")


async def test_worker_registry_reads_are_shared_and_refreshed_behind_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Concurrent requests share one registry read; a registry just past its TTL answers at once
    while one read refreshes it (a burst is published together, not spread over Redis round trips)."""
    import asyncio

    import orjson
    import redis.asyncio as aioredis

    from gateway.core.config import get_config, replace
    from inference_app.upstream import streams
    from inference_app.upstream import worker as worker_upstream
    from inference_app.upstream.worker import WorkerUpstream

    client = aioredis.Redis.from_url(REDIS_URL)
    await client.delete(streams.WORKERS_SET, streams.worker_key("w1"), streams.worker_key("w2"))
    await client.sadd(streams.WORKERS_SET, "w1")
    await client.set(streams.worker_key("w1"), orjson.dumps({"id": "w1", "queues": ["inference"]}))
    upstream = WorkerUpstream(replace(get_config(), redis_url=REDIS_URL))
    reads = 0
    read_registry = upstream._read_registry

    async def counting_read() -> list[dict[str, object]]:
        nonlocal reads
        reads += 1
        return await read_registry()

    monkeypatch.setattr(upstream, "_read_registry", counting_read)
    try:
        first = await asyncio.gather(*(upstream.workers() for _ in range(8)))
        assert reads == 1
        assert all(live == [{"id": "w1", "queues": ["inference"]}] for live in first)

        # A second worker registers; the cached registry is past its TTL but recent.
        await client.sadd(streams.WORKERS_SET, "w2")
        await client.set(streams.worker_key("w2"), orjson.dumps({"id": "w2", "queues": ["inference"]}))
        stamp, cached = upstream._registry
        upstream._registry = (stamp - worker_upstream._REGISTRY_TTL_S - 0.1, cached)
        stale = await asyncio.gather(*(upstream.workers() for _ in range(8)))
        assert stale == [cached] * 8  # answered without waiting for Redis
        assert reads == 2  # one read started behind them
        await upstream._reading[asyncio.get_running_loop()]
        assert [w["id"] for w in await upstream.workers()] == ["w1", "w2"]
        assert reads == 2

        # Too old to answer with: the caller waits for the read.
        stamp, cached = upstream._registry
        await client.srem(streams.WORKERS_SET, "w1")
        upstream._registry = (stamp - worker_upstream._REGISTRY_STALE_S - 0.1, cached)
        assert [w["id"] for w in await upstream.workers()] == ["w2"]
        assert reads == 3
    finally:
        await client.delete(streams.WORKERS_SET, streams.worker_key("w1"), streams.worker_key("w2"))
        await client.aclose()
        for redis in list(upstream._clients.values()):
            await redis.aclose()


def test_the_celery_app_finds_every_task_of_the_apps() -> None:
    """A worker registers what autodiscovery finds: the inference, tool and background tasks (a
    package path that names no tasks module is skipped without a word)."""
    from gateway.celery import app
    from inference_app.tools.dispatch import TOOL_TASK_NAME
    from inference_app.upstream.streams import TASK_NAME

    app.loader.import_default_modules()
    assert {TASK_NAME, TOOL_TASK_NAME, "responses.run_background"} <= set(app.tasks)
