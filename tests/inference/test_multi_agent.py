"""Multi-agent with real vLLM and the tiny model (embedded engine): the root is made to call
``spawn_agent`` (a named ``tool_choice``, which binds the root only); the subagent runs its own turn
against the same engine and its answer comes back as mail. Checks the shape, not the words."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway import config as config_module
from tests.inference.conftest import SERVED, Gateway

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def one_round_per_turn(embedded_gateway: Gateway) -> Iterator[None]:
    """One round per turn: the forced spawn is the root's whole turn (the tool_choice would force
    another spawn in every further root round)."""
    current = config_module.get_config()
    config_module.set_config(config_module.replace(current, responses__max_rounds=1))
    yield
    config_module.set_config(current)


def test_spawn_round_trip(
    embedded_gateway: Gateway, one_round_per_turn: None, transactional_db: None
) -> None:
    r = httpx.post(
        f"{embedded_gateway.url}/v1/responses",
        json={
            "model": SERVED,
            "input": "hi",
            "multi_agent": {"enabled": True, "max_concurrent_subagents": 1},
            "tool_choice": {"type": "function", "name": "spawn_agent"},
            "max_output_tokens": 100,
            "temperature": 0,
        },
        headers={"OpenAI-Beta": "responses_multi_agent=v1"},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    assert answer["status"] in ("completed", "incomplete"), answer["error"]
    output = answer["output"]
    assert all(item["agent"]["agent_name"].startswith("/root") for item in output)
    call = output[0]
    assert call["type"] == "multi_agent_call" and call["action"] == "spawn_agent"
    assert call["id"].startswith("mac_") and call["agent"] == {"agent_name": "/root"}
    result = next(i for i in output if i["type"] == "multi_agent_call_output")
    assert result["call_id"] == call["call_id"] and result["id"].startswith("maco_")
    text = result["output"][0]["text"]
    if text.startswith("Spawned "):  # the tiny model's arguments were a valid spawn
        name = text.split()[1]
        mail = [i for i in output if i["type"] == "agent_message"]
        assert mail[0]["author"] == "/root" and mail[0]["recipient"] == name
        assert mail[-1]["author"] == name and mail[-1]["recipient"] == "/root"
        assert any(i["agent"]["agent_name"] == name and i["type"] in ("message", "reasoning") for i in output)
    else:
        assert text.startswith("Error:")  # the tool's answer to bad arguments, not a failure
