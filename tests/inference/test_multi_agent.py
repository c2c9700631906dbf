"""Multi-agent with real vLLM and the tiny model: one spawn round trip through the embedded engine.

``tool_choice`` naming ``spawn_agent`` binds the root, so vLLM's guided decoding makes the random
model write a schema-valid call; the root has one round per turn, so after the spawn its turn ends
at the round cap and the response ends once the subagent has answered. The text is gibberish: the
checks are on the shape (attribution, the SDK's beta types, the stored tree).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import config as config_module
from responses_app.models import Response
from tests.inference.conftest import SERVED, Gateway, embedded_gateway_for
from tests.responses.conftest import sse_events
from tests.responses.test_multi_agent import ITEMS, check_attribution

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The six collaboration tools alone take ~650 prompt tokens: more than the other modules' 512.
MAX_MODEL_LEN = "2048"
TASK = re.compile(r"/root/[A-Za-z0-9_-]{1,64}")


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: Path) -> Iterator[Gateway]:
    yield from embedded_gateway_for(tiny_model_dir, GATEWAY_INFERENCE_MAX_MODEL_LEN=MAX_MODEL_LEN)


@pytest.fixture
def one_round_per_turn(gateway: Gateway) -> Iterator[None]:
    """The forced spawn binds every root round: one round, one spawn."""
    current = config_module.get_config()
    config_module.set_config(config_module.replace(current, responses__max_rounds=1))
    yield
    config_module.set_config(current)


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED,
        "input": "Split the work.",
        "multi_agent": {"enabled": True},
        "tool_choice": {"type": "function", "name": "spawn_agent"},
        "max_output_tokens": 256,
        "temperature": 1,  # sampled: greedy decoding of random weights loops on whitespace
        **extra,
    }


def check_run(gw: Gateway, final: dict[str, Any]) -> None:
    """The root's spawn call, attributed; whatever became of it, the stored tree and GET agree.

    The random model's call is schema-guided but may not close within ``max_output_tokens`` (its
    strings and whitespace are unbounded): then the root's round is incomplete, the call is never
    executed and the response ends ``incomplete``. A closed call is executed: either the spawn (the
    task mailed to the subagent, the subagent's own items and its report, all attributed) or, for
    unusable arguments, an ``Error: …`` output the root reads.
    """
    assert final["status"] in ("completed", "incomplete"), final["error"]
    output = final["output"]
    for item in output:
        parsed = ITEMS.validate_python(item)
        assert parsed.agent is not None and parsed.agent.agent_name == item["agent"]["agent_name"]
    calls = [i for i in output if i["type"] == "multi_agent_call"]
    assert [(c["action"], c["agent"]["agent_name"]) for c in calls] == [("spawn_agent", "/root")]
    results = [i for i in output if i["type"] == "multi_agent_call_output"]
    tree = Response.objects.get(id=final["id"]).agent_tree
    assert tree["version"] == 1 and tree["config"] == {"enabled": True, "max_concurrent_subagents": 3}
    statuses = {a["name"]: a["status"] for a in tree["agents"]}
    # The root has one round per turn: its turn ends at the round cap (or cut off), never "completed".
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    if not results:  # the call was cut off: never executed
        assert output == calls
        assert statuses == {"/root": "interrupted"}
    else:
        (result,) = results
        assert result["call_id"] == calls[0]["call_id"] and result["agent"]["agent_name"] == "/root"
        text = result["output"][0]["text"]
        spawned = re.fullmatch(rf"Spawned ({TASK.pattern}) \(\w+\)\.", text)
        if spawned is None:
            assert text.startswith("Error: "), text
            assert statuses == {"/root": "completed"}
            assert {i["agent"]["agent_name"] for i in output} == {"/root"}
        else:
            child = spawned.group(1)
            mail = [
                (m["author"], m["recipient"], m["agent"]["agent_name"])
                for m in output
                if m["type"] == "agent_message"
            ]
            assert mail == [("/root", child, "/root"), (child, "/root", child)]  # the task; the report
            own = [i for i in output if i["agent"]["agent_name"] == child and i["type"] != "agent_message"]
            assert own  # its answer (gibberish)
            assert {i["agent"]["agent_name"] for i in output} == {"/root", child}
            assert statuses.keys() == {"/root", child}
            assert statuses["/root"] == "completed" and statuses[child] in ("completed", "failed")

    got = httpx.get(f"{gw.url}/v1/responses/{final['id']}", timeout=30)
    assert got.status_code == 200, got.text
    assert got.json()["output"] == output and got.json()["status"] == final["status"]


def test_spawn_round_trip_json(gateway: Gateway, one_round_per_turn: None, transactional_db: None) -> None:
    # The first request waits for the engine to start.
    r = httpx.post(f"{gateway.url}/v1/responses", json=body(), timeout=600)
    assert r.status_code == 200, r.text
    check_run(gateway, r.json())


def test_spawn_round_trip_sse(gateway: Gateway, one_round_per_turn: None, transactional_db: None) -> None:
    r = httpx.post(f"{gateway.url}/v1/responses", json=body(stream=True), timeout=600)
    events = sse_events(r)
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    final = check_attribution(events)  # every event attributed, the SDK's beta types, one numbering
    check_run(gateway, final)
