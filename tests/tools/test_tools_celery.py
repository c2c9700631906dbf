"""The distributed path: gateway tool calls as Celery tasks on the ``tools`` queue, consumed by a real
worker from the real Redis (db 9), with results awaited without blocking the event loop."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis

from gateway.core.config import Config, load_config, replace
from inference_app.tools import ToolCall, classify_tools, run_gateway_calls
from tests.tools.tools_servers import SearchProvider

REDIS_URL = "redis://127.0.0.1:6379/9"


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

    import inference_app.tools.tasks  # noqa: F401  (registers the shared task)
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
    provider.hold_until = 5  # each call waits at the provider until all five are there
    results = await run_gateway_calls(
        [search(f"c{i}", f"q{i}") for i in range(5)], config=tools_config, celery_app=celery_app
    )
    assert [r.call_id for r in results] == ["c0", "c1", "c2", "c3", "c4"]
    assert all(r.ok for r in results)
    assert provider.peak_in_flight == 5, "the 5 calls ran one after another on the workers"


async def test_the_event_loop_is_not_blocked_while_waiting(
    celery_app: Any, worker: Any, provider: SearchProvider, tools_config: Config
) -> None:
    """While the gateway waits for the worker's result, another task on its event loop runs: here
    it sends the provider the second request the worker's search is held for."""
    import aiohttp

    provider.hold_until = 2

    async def second_request() -> None:
        while provider.in_flight < 1:  # the worker's search is at the provider, held
            await asyncio.sleep(0.01)
        url = f"{provider.url}/search?q=y&format=json"
        async with aiohttp.ClientSession() as session, session.get(url) as r:
            assert r.status == 200

    task = asyncio.create_task(second_request())
    try:
        [result] = await run_gateway_calls([search("c", "x")], config=tools_config, celery_app=celery_app)
        await asyncio.wait_for(task, 10)
    finally:
        task.cancel()
    assert result.ok
    assert provider.peak_in_flight == 2, "the event loop was blocked while the call ran on the worker"


async def test_a_timeout_becomes_a_failed_result(
    celery_app: Any, worker: Any, provider: SearchProvider, gateway_config: Callable[..., Config]
) -> None:
    provider.slow_delay_s = 3.0
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
    # The round ended before the slow call could have been answered: nobody waited for it. (Not
    # provider.in_flight: on a loaded machine the worker may take the call up after the deadline.)
    assert time.monotonic() - started < provider.slow_delay_s
    assert results[0].call_id == "slow" and results[0].status == "failed"
    assert results[0].error == "web_search call timed out after 0.5 s"
    assert results[1].call_id == "fast" and results[1].ok


async def test_without_a_worker_the_call_times_out_cleanly(celery_app: Any, tools_config: Config) -> None:
    config = replace(tools_config, tools__call_timeout_s=0.5)
    started = time.monotonic()
    [result] = await run_gateway_calls([search("c", "nobody home")], config=config, celery_app=celery_app)
    assert time.monotonic() - started < 10  # a bound against hanging, not a speed check
    assert result.status == "failed" and result.error == "web_search call timed out after 0.5 s"


@pytest.mark.slow  # fork bombs and memory hogs in the sandbox: seconds of CPU (make test runs it)
async def test_sandbox_abuse_on_the_worker_leaves_it_serving(
    celery_app: Any, worker: Any, tools_config: Config
) -> None:
    stopped = {  # which limit stops a spinning program first depends on the machine's load
        "wall-clock time limit of 5 s exceeded; the program was stopped",
        "the program was stopped: CPU time limit of 2 s exceeded",
    }
    fork_bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    memory_bomb = "x = []\nwhile True:\n    x.append(bytearray(64 * 1024 * 1024))\n"
    endless = "while True:\n    pass\n"
    for source in (fork_bomb, memory_bomb, endless):
        started = time.monotonic()
        [bad] = await run_gateway_calls([code("bomb", source)], config=tools_config, celery_app=celery_app)
        assert time.monotonic() - started < 10  # a bound against hanging (the wall-clock limit is 5 s)
        assert bad.call_id == "bomb"
        if source is memory_bomb:  # the allocation fails inside the program: its traceback is the output
            assert bad.status == "completed" and bad.error is None
            assert bad.output.endswith("MemoryError\n\n[exit status 1]"), bad.output
        else:
            assert bad.status == "failed" and bad.error in stopped, bad.error
            assert bad.output == f"[{bad.error}]"
        [ok] = await run_gateway_calls(
            [code("ok", "print(6 * 7)")], config=tools_config, celery_app=celery_app
        )
        assert ok.status == "completed" and ok.outputs == [{"type": "logs", "logs": "42\n"}]
