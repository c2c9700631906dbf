"""The distributed path: gateway tool calls as Celery tasks on the ``tools`` queue, consumed by a real
worker from the real Redis (db 9), with results awaited without blocking the event loop."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis

from gateway.config import Config, load_config, replace
from inference_app.tools import ToolCall, classify_tools, run_gateway_calls
from tests.tools.tools_servers import SearchProvider

REDIS_URL = "redis://127.0.0.1:6379/9"


@pytest.fixture
def provider() -> Iterator[SearchProvider]:
    server = SearchProvider().start()
    yield server
    server.stop()


@pytest.fixture
def tools_config(provider: SearchProvider, gateway_config: Callable[..., Config]) -> Config:
    """The process config (read by the in-thread worker too): broker on, search pointed at ``provider``."""
    return gateway_config(
        redis_url=REDIS_URL,
        web_search__provider="searxng",
        web_search__base_url=provider.url,
        code_interpreter__cpu_time_s=2,
        code_interpreter__wall_time_s=5.0,
    )


@pytest.fixture
def celery_app(tools_config: Config) -> Any:
    from celery import Celery

    import inference_app.tool_tasks  # noqa: F401  (registers the shared task)
    from gateway.celery import configure

    return configure(Celery("gateway-tools-test"), tools_config)


@pytest.fixture
def worker(celery_app: Any) -> Iterator[Any]:
    from celery.contrib.testing.worker import start_worker

    with start_worker(
        celery_app,
        queues=["tools"],
        pool="threads",
        concurrency=5,
        perform_ping_check=False,
        loglevel="WARNING",
    ) as w:
        yield w


def search(call_id: str, query: str) -> ToolCall:
    ts = classify_tools([{"type": "web_search"}], config=load_config({}))
    return ts.make_call(call_id, "web_search", orjson.dumps({"queries": [query]}).decode())


def code(call_id: str, source: str) -> ToolCall:
    ts = classify_tools([{"type": "code_interpreter"}], config=load_config({}))
    return ts.make_call(call_id, "code_interpreter", orjson.dumps({"code": source}).decode())


async def test_calls_run_on_the_worker(
    celery_app: Any, worker: Any, provider: SearchProvider, tools_config: Config
) -> None:
    assert tools_config.broker_enabled and celery_app.conf.task_always_eager is False
    client = redis.Redis.from_url(REDIS_URL)
    call_id = f"c-{uuid.uuid4().hex}"  # unique: other runs may share this Redis database
    [result] = await run_gateway_calls(
        [search(call_id, "celery")], config=tools_config, celery_app=celery_app
    )
    assert result.ok, result.error
    assert result.call_id == call_id and result.action is not None
    assert result.action["queries"] == ["celery"]
    assert provider.requests[0].query["q"] == "celery"
    # The result is removed from the backend once the gateway has it.
    stored = [client.get(key) or b"" for key in client.keys("celery-task-meta-*")]
    assert not [value for value in stored if call_id.encode() in value]


async def test_five_calls_run_concurrently_on_workers(
    celery_app: Any, worker: Any, provider: SearchProvider, tools_config: Config
) -> None:
    await run_gateway_calls([search("warm", "warm")], config=tools_config, celery_app=celery_app)
    provider.delay_s = 0.1
    started = time.monotonic()
    results = await run_gateway_calls(
        [search(f"c{i}", f"q{i}") for i in range(5)], config=tools_config, celery_app=celery_app
    )
    elapsed = time.monotonic() - started
    assert [r.call_id for r in results] == ["c0", "c1", "c2", "c3", "c4"]
    assert all(r.ok for r in results)
    assert elapsed < 0.45, f"5 calls through Celery took {elapsed:.3f}s"


async def test_the_event_loop_is_not_blocked_while_waiting(
    celery_app: Any, worker: Any, provider: SearchProvider, tools_config: Config
) -> None:
    provider.delay_s = 0.3
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        [result] = await run_gateway_calls([search("c", "x")], config=tools_config, celery_app=celery_app)
    finally:
        task.cancel()
    assert result.ok
    assert ticks >= 15  # ~30 ticks fit into 0.3 s when the loop is free


async def test_a_timeout_becomes_a_failed_result(
    celery_app: Any, worker: Any, provider: SearchProvider, gateway_config: Callable[..., Config]
) -> None:
    provider.slow_delay_s = 1.5
    # The worker reads the process config too: both sides time out at 0.5 s.
    config = gateway_config(
        redis_url=REDIS_URL,
        web_search__provider="searxng",
        web_search__base_url=provider.url,
        tools__call_timeout_s=0.5,
    )
    started = time.monotonic()
    results = await run_gateway_calls(
        [search("slow", "slow query"), search("fast", "fast query")], config=config, celery_app=celery_app
    )
    assert time.monotonic() - started < 1.4
    assert results[0].call_id == "slow" and results[0].status == "failed"
    assert results[0].error == "web_search call timed out after 0.5 s"
    assert results[1].call_id == "fast" and results[1].ok


async def test_without_a_worker_the_call_times_out_cleanly(celery_app: Any, tools_config: Config) -> None:
    config = replace(tools_config, tools__call_timeout_s=0.5)
    started = time.monotonic()
    [result] = await run_gateway_calls([search("c", "nobody home")], config=config, celery_app=celery_app)
    assert time.monotonic() - started < 1.5
    assert result.status == "failed" and result.error == "web_search call timed out after 0.5 s"


@pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("CI"), reason="bubblewrap (bwrap) is not installed"
)
async def test_sandbox_abuse_on_the_worker_leaves_it_serving(
    celery_app: Any, worker: Any, tools_config: Config
) -> None:
    bombs = [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "x = []\nwhile True:\n    x.append(bytearray(64 * 1024 * 1024))\n",
        "while True:\n    pass\n",
    ]
    for source in bombs:
        started = time.monotonic()
        [bad] = await run_gateway_calls([code("bomb", source)], config=tools_config, celery_app=celery_app)
        assert time.monotonic() - started < 10
        assert bad.call_id == "bomb"
        assert bad.status == "failed" or "MemoryError" in bad.output
        [ok] = await run_gateway_calls(
            [code("ok", "print(6 * 7)")], config=tools_config, celery_app=celery_app
        )
        assert ok.status == "completed" and ok.outputs == [{"type": "logs", "logs": "42\n"}]
