"""Compaction with real vLLM and the tiny model: a 3-turn stored history is compacted by
``POST /v1/responses/compact`` and continued from the compaction id, through the embedded engine
and through a Celery worker (the summary round takes the same upstream as every round)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.core import config as config_module
from tests.inference.conftest import SERVED, Gateway, embedded_gateway_for, worker_gateway_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module", params=["embedded", "worker"])
def gateway(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[Gateway]:
    if request.param == "embedded":
        yield from embedded_gateway_for(tiny_model_dir)
    else:
        yield from worker_gateway_for(request.getfixturevalue("worker"), tiny_model_dir)


@pytest.fixture
def short_summaries(gateway: Gateway) -> Iterator[None]:
    """The tiny model's context is 512 tokens: the summary round asks for 16 at most."""
    current = config_module.get_config()
    config_module.set_config(config_module.replace(current, responses__compaction_max_output_tokens=16))
    yield
    config_module.set_config(current)


def post(gw: Gateway, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{gw.url}{path}", json=body, timeout=600)  # the first one waits for the engine to start
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def test_compact_a_three_turn_history_and_continue(
    gateway: Gateway, short_summaries: None, transactional_db: None
) -> None:
    previous = None
    for turn in ("My name is Ana.", "I live in Lisbon.", "I like jazz."):
        body: dict[str, Any] = {"model": SERVED, "input": turn, "max_output_tokens": 8, "temperature": 0}
        if previous is not None:
            body["previous_response_id"] = previous
        answer = post(gateway, "/v1/responses", body)
        assert answer["status"] in ("completed", "incomplete"), answer["error"]
        previous = answer["id"]

    compacted = post(gateway, "/v1/responses/compact", {"model": SERVED, "previous_response_id": previous})
    assert compacted["object"] == "response.compaction"
    *users, item = compacted["output"]
    assert [u["content"][0]["text"] for u in users] == [
        "My name is Ana.",
        "I live in Lisbon.",
        "I like jazz.",
    ]
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert isinstance(item["encrypted_content"], str) and item["encrypted_content"].strip()
    usage = compacted["usage"]
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 16

    answer = post(
        gateway,
        "/v1/responses",
        {
            "model": SERVED,
            "previous_response_id": compacted["id"],
            "input": "What is my name?",
            "max_output_tokens": 8,
            "temperature": 0,
        },
    )
    assert answer["status"] in ("completed", "incomplete"), answer["error"]
    assert answer["previous_response_id"] == compacted["id"]
