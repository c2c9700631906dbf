"""The checkpoint cache with two real server processes sharing one SQLite file database.

This is the production shape one test process cannot show: each process has its own history
cache, and only the database is shared. A delete on one process must be seen by the other at once
(every continuation checks its parent's row; the cache only holds payloads).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.responses.scripts import Script, handler, path_for, text
from tests.servers import GatewayProcess

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_servers(upstream: Any) -> Iterator[tuple[str, str]]:
    env = {
        "LLM_API_BASE": upstream.url,
        "LOG_LEVEL": "WARNING",
        "GATEWAY_SERVER_DATA_DIR": tempfile.mkdtemp(prefix="history-cache-"),
        "UPSTREAM_API": "responses",
        "OPENAI_API_KEY": "",
    }
    first = GatewayProcess(env, log=os.devnull)
    second = GatewayProcess(env, migrate=False, log=os.devnull)  # the same database file
    try:
        first.wait(60)
        second.wait(60)
        yield first.url, second.url
    finally:
        first.stop()
        second.stop()


def test_a_delete_on_another_process_is_seen_by_a_warm_cache(upstream: Any, two_servers: Any) -> None:
    a, b = two_servers

    def turn(base: str, previous: str | None) -> httpx.Response:
        upstream.script(path_for("responses"), handler(Script([text("ok")]), "responses"))
        body: dict[str, Any] = {"model": "m", "input": "go on"}
        if previous is not None:
            body["previous_response_id"] = previous
        return httpx.post(f"{base}/v1/responses", json=body, timeout=30)

    def inputs() -> int:
        bodies = [r.json() for r in upstream.requests if r.path == path_for("responses")]
        return len(bodies[-1]["input"])

    first = turn(a, None).json()["id"]
    second = turn(a, first)  # A stored `first` and holds its checkpoint
    assert second.status_code == 200, second.text
    assert inputs() == 3
    second_id = second.json()["id"]

    # B deletes what A has cached; A must refuse to continue it.
    assert httpx.delete(f"{b}/v1/responses/{second_id}", timeout=30).status_code == 200
    refused = turn(a, second_id)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "previous_response_not_found"

    # The untouched parent still continues, on A (warm) and on B (read from the database).
    assert turn(a, first).status_code == 200
    assert inputs() == 3
    from_b = turn(b, first)
    assert from_b.status_code == 200, from_b.text
    assert inputs() == 3
    # B now has the checkpoint cached too; a third turn on B continues B's new response.
    third = turn(b, from_b.json()["id"])
    assert third.status_code == 200
    assert inputs() == 5
