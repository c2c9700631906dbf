"""The tool loop's distributed path: a Responses request whose gateway calls run as Celery tasks on
the ``tools`` queue, consumed by a real worker from the real Redis (db 7)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from gateway.celery import app as celery_app
from tests.celery_rebind import rebind
from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import ToolsGateway, args, model_input

REDIS_URL = "redis://127.0.0.1:6379/7"


@pytest.fixture
def wire() -> str:
    return "responses"


@pytest.fixture
def tools_worker(tools_gw: ToolsGateway) -> Iterator[None]:
    import inference_app.tools.tasks  # noqa: F401  (registers the tool task)

    assert tools_gw.configure is not None
    rebind(celery_app, tools_gw.configure(redis_url=REDIS_URL))
    with start_worker(
        celery_app,
        queues=["tools"],
        pool="threads",
        concurrency=5,
        perform_ping_check=False,
        loglevel="WARNING",
    ):
        yield
    rebind(celery_app, tools_gw.configure(redis_url=""))


def test_gateway_calls_run_on_a_celery_tools_worker(tools_gw: ToolsGateway, tools_worker: Any) -> None:
    gw = tools_gw
    assert gw.provider is not None
    client = redis.Redis.from_url(REDIS_URL)
    before = set(client.keys("celery-task-meta-*"))
    gw.provider.hold_until = 5  # each search waits at the provider until all five are there
    queries = ["a", "b", "c", "d", "e"]
    gw.script(
        *(call("web_search", args(queries=[q]), call_id=f"call_{q}") for q in queries),
        call("code_interpreter", args(code="print(2 ** 10)"), call_id="call_code"),
    )
    gw.script(text("done"))
    final = gw.create(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}],
        }
    )
    assert [i["status"] for i in final["output"][:6]] == ["completed"] * 6
    # The five searches were at the provider at once, on five worker threads.
    assert gw.provider.peak_in_flight == 5, "the round's searches ran one after another"
    seen = {s["output"][0]: s["output"][1] for s in model_input(gw, 1) if "output" in s}
    assert seen["call_code"] == "1024\n"
    assert all(f"{q} result 1" in seen[f"call_{q}"] for q in queries)
    # Results are deleted from the backend once read.
    assert set(client.keys("celery-task-meta-*")) == before
