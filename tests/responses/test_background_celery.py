"""Background responses on a real Celery worker over the real Redis broker (db 13)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.celery_rebind import responses_worker
from tests.responses.conftest import Gateway
from tests.responses.scripts import text

REDIS_URL = "redis://127.0.0.1:6379/13"


@pytest.fixture
def wire() -> str:
    return "responses"


@pytest.fixture
def broker(gw: Gateway, gateway_config: Any) -> Iterator[None]:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="responses")
    with responses_worker(gateway_config, REDIS_URL):
        yield


def test_background_runs_on_a_celery_worker(gw: Gateway, broker: None) -> None:
    gw.script(text("from", " a", " worker"))
    created = gw.client.responses.create(model="m", input="x", background=True)
    assert created.status == "queued"
    deadline = time.monotonic() + 20
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = httpx.get(f"{gw.url}/v1/responses/{created.id}").json()
        if body["status"] == "completed":
            break
        time.sleep(0.1)
    assert body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "from a worker"
    with gw.client.responses.retrieve(created.id, stream=True) as stream:
        types = [e.type for e in stream]
    assert types[0] == "response.created" and types[-1] == "response.completed"


def test_a_worker_task_closes_its_upstream_connections(gw: Gateway, broker: None) -> None:
    """Each Celery task runs on its own event loop; its upstream session must not outlive it."""
    from inference_app.upstream.http import _http_upstreams

    def pools() -> int:
        return sum(len(upstream._sessions) for upstream in list(_http_upstreams))

    before = pools()
    for n in range(3):
        gw.script(text(f"run {n}"))
        created = gw.client.responses.create(model="m", input="x", background=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if httpx.get(f"{gw.url}/v1/responses/{created.id}").json()["status"] == "completed":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the background response did not complete")
    # The task's finally block (closing its sessions) runs after its last database write: wait for it.
    deadline = time.monotonic() + 20
    while pools() > before:
        assert time.monotonic() < deadline, f"{pools()} upstream sessions left open (was {before})"
        time.sleep(0.02)
