"""Compaction through the public API (docs/responses.md → Compaction), on both executor wire APIs:
``POST /v1/responses/compact`` (the SDK's ``client.responses.compact``), continuing from a
compaction id, the model's view of compaction items, owner isolation, forwarding of the cache
fields and the tier, and every refusal with its ``param``.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from openai.types.responses import CompactedResponse

from conversations_app.models import Item
from responses_app.features.compaction import DEFAULT_PROMPT, estimate_tokens
from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.hostile import CHAT_ANSWER_KINDS, RESPONSES_ANSWER_KINDS
from tests.responses.scripts import call, path_for, text
from tests.responses.test_access_rules import stored
from tests.responses.tool_fixtures import model_input

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARY = "The user is planning a trip to Lisbon in May and wants a cheap hotel."
HISTORY = [
    {"role": "user", "content": "I want to visit Lisbon."},
    {"role": "assistant", "content": "When would you like to go?"},
    {"role": "user", "content": "In May, on a budget."},
]


def compact(gw: Gateway, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/responses/compact", json=body, timeout=30, **kwargs)


def texts(gw: Gateway, request: int) -> list[tuple[str, str]]:
    return [entry["text"] for entry in model_input(gw, request) if "text" in entry]


def test_sdk_compact_returns_the_user_messages_and_one_compaction_item(gw: Gateway) -> None:
    gw.script(text(SUMMARY), usage={"input_tokens": 40, "output_tokens": 15, "total_tokens": 55})
    compacted = gw.client.responses.compact(model="test-model", input=HISTORY)  # type: ignore[arg-type]
    assert isinstance(compacted, CompactedResponse)
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    data = compacted.to_dict()
    users, item = data["output"][:-1], data["output"][-1]
    assert [(m["role"], m["content"]) for m in users] == [
        ("user", [{"type": "input_text", "text": "I want to visit Lisbon."}]),
        ("user", [{"type": "input_text", "text": "In May, on a budget."}]),
    ]
    assert all(
        m["type"] == "message" and m["status"] == "completed" and m["id"].startswith("msg_") for m in users
    )
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert item["encrypted_content"] == SUMMARY  # plain text: nothing is encrypted
    assert compacted.usage.input_tokens == 40 and compacted.usage.output_tokens == 15
    assert compacted.usage.total_tokens == 55

    # One non-streaming summary round: the history as the model sees it, then our prompt.
    (body,) = gw.upstream_bodies()
    assert body["stream"] is False
    assert texts(gw, 0) == [
        ("user", "I want to visit Lisbon."),
        ("assistant", "When would you like to go?"),
        ("user", "In May, on a budget."),
        ("user", DEFAULT_PROMPT),
    ]
    # Stored as a checkpoint of the retained messages and the compaction item.
    row = Response.objects.get(id=compacted.id)
    assert row.status == "completed"
    assert row.history_item_ids == [m["id"] for m in users] + [item["id"]]
    assert Item.objects.get(id=item["id"]).data == item


def test_continuing_from_a_compaction_id_sends_the_summary_as_an_assistant_message(gw: Gateway) -> None:
    gw.script(text(SUMMARY))
    compacted = compact(gw, {"model": "test-model", "input": HISTORY}).json()
    gw.script(text("Try the Alfama district."))
    r = gw.post({"model": "test-model", "previous_response_id": compacted["id"], "input": "Which area?"})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "Try the Alfama district."
    assert texts(gw, 1) == [
        ("user", "I want to visit Lisbon."),
        ("user", "In May, on a budget."),
        ("assistant", SUMMARY),
        ("user", "Which area?"),
    ]
    if gw.wire == "responses":  # no compaction item ever reaches the model server
        assert all(i.get("type") == "message" for i in gw.upstream_bodies()[1]["input"])


def test_compacting_a_stored_chain_references_its_messages_and_changes_nothing(gw: Gateway) -> None:
    gw.script(text("Hello!"))
    first = gw.post({"model": "test-model", "input": "Hi, I am Ana."}).json()
    gw.script(text("Noted."))
    second = gw.post(
        {"model": "test-model", "previous_response_id": first["id"], "input": "I like jazz."}
    ).json()
    before = Response.objects.get(id=second["id"]).history_item_ids
    items_before = Item.objects.count()

    gw.script(text("Ana likes jazz."))
    r = compact(gw, {"model": "test-model", "previous_response_id": second["id"]})
    assert r.status_code == 200, r.text
    compacted = r.json()
    users = compacted["output"][:-1]
    stored_users = [
        Item.objects.get(id=i).data for i in before if Item.objects.get(id=i).data.get("role") == "user"
    ]
    assert [m["id"] for m in users] == [m["id"] for m in stored_users]  # stored once, referenced
    assert Item.objects.count() == items_before + 1  # only the compaction item is new
    assert Response.objects.get(id=second["id"]).history_item_ids == before  # history untouched
    assert texts(gw, 2)[:4] == [
        ("user", "Hi, I am Ana."),
        ("assistant", "Hello!"),
        ("user", "I like jazz."),
        ("assistant", "Noted."),
    ]
    row = Response.objects.get(id=compacted["id"])
    assert row.previous_response_id == second["id"]
    assert row.owner == Response.objects.get(id=second["id"]).owner

    # Input after it: the window plus new input, compacted again.
    gw.script(text("Ana likes jazz and Lisbon."))
    again = compact(
        gw, {"model": "test-model", "previous_response_id": compacted["id"], "input": "Also Lisbon."}
    ).json()
    assert [i["type"] for i in again["output"]] == ["message", "message", "message", "compaction"]
    assert texts(gw, 3)[:4] == [
        ("user", "Hi, I am Ana."),
        ("user", "I like jazz."),
        ("assistant", "Ana likes jazz."),
        ("user", "Also Lisbon."),
    ]


def test_another_owners_response_cannot_be_compacted(gw: Gateway) -> None:
    stored("resp_theirs", "oidc:someone-else")
    r = compact(gw, {"model": "test-model", "previous_response_id": "resp_theirs"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "previous_response_id" and error["code"] == "previous_response_not_found"
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 1


def test_cache_fields_and_tier_are_forwarded_and_not_echoed(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(responses__prompt_cache_options_supported=True)
    gw.script(text(SUMMARY))
    fields = {
        "prompt_cache_key": "tenant-7",
        "prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
        "prompt_cache_retention": "24h",
        "service_tier": "priority",
    }
    r = compact(gw, {"model": "test-model", "input": HISTORY, **fields})
    assert r.status_code == 200, r.text
    body = gw.upstream_bodies()[0]
    for key, value in fields.items():
        assert body[key] == value
    assert set(r.json()) == {"id", "object", "created_at", "output", "usage"}


@pytest.mark.parametrize("tier", ["fast", "ultrafast"])
def test_any_service_tier_is_forwarded_unchanged(gw: Gateway, tier: str) -> None:
    """The openai 3.57 SDK allows "fast" and "ultrafast"; an explicit tier is forwarded as is."""
    gw.script(text(SUMMARY))
    r = compact(gw, {"model": "test-model", "input": HISTORY, "service_tier": tier})
    assert r.status_code == 200, r.text
    assert gw.upstream_bodies()[0]["service_tier"] == tier


def test_unused_fields_are_accepted_and_not_sent(gw: Gateway) -> None:
    gw.script(text(SUMMARY))
    r = compact(
        gw,
        {
            "model": "test-model",
            "input": HISTORY,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "parallel_tool_calls": True,
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "text"}},
        },
    )
    assert r.status_code == 200, r.text
    body = gw.upstream_bodies()[0]
    for key in ("tools", "parallel_tool_calls", "reasoning", "reasoning_effort", "text", "response_format"):
        assert key not in body


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"input": "hi"}, 400, "model", "missing_required_parameter"),
        ({"model": "m"}, 400, "input", "missing_required_parameter"),
        ({"model": "m", "input": "hi", "store": True}, 400, "store", "unknown_parameter"),
        ({"model": "m", "input": 5}, 400, "input", "invalid_type"),
        (
            {
                "model": "m",
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_file", "file_data": "data:application/pdf;base64,AA=="}],
                    }
                ],
            },
            400,
            "input[0].content[0]",
            "unsupported_parameter",
        ),
        (
            {"model": "m", "input": "hi", "prompt_cache_options": {"mode": "x"}},
            400,
            "prompt_cache_options",
            None,
        ),
        ({"model": "m", "input": "hi", "service_tier": 5}, 400, "service_tier", "invalid_type"),
        ({"model": "m", "previous_response_id": "resp_missing"}, 400, "previous_response_id", None),
        ({"model": "m", "input": [{"type": "compaction"}]}, 400, "input[0].encrypted_content", None),
    ],
)
def test_refusals_name_their_param_and_store_nothing(
    gw: Gateway, body: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    r = compact(gw, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 0 and Item.objects.count() == 0


def test_an_upstream_refusal_is_relayed_and_nothing_is_stored(gw: Gateway) -> None:
    gw.script(error_status=400, error_message="prompt is too long")
    r = compact(gw, {"model": "test-model", "input": HISTORY})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "prompt is too long"
    assert Response.objects.count() == 0 and Item.objects.count() == 0
    gw.script(error_status=500)
    r = compact(gw, {"model": "test-model", "input": HISTORY})
    assert r.status_code == 502
    assert Response.objects.count() == 0


def test_an_empty_summary_is_a_502(gw: Gateway) -> None:
    gw.script(text("   "))
    r = compact(gw, {"model": "test-model", "input": HISTORY})
    assert r.status_code == 502 and "empty compaction summary" in r.json()["error"]["message"]
    assert Response.objects.count() == 0


def test_a_malformed_or_oversized_summary_answer_is_a_502(gw: Gateway, gateway_config: Any) -> None:
    """The summary answer is read and checked as the executor reads a one-answer round's."""
    kinds = RESPONSES_ANSWER_KINDS if gw.wire == "responses" else CHAT_ANSWER_KINDS
    for kind in ("answer_is_string", "output_is_number" if gw.wire == "responses" else "choices_is_number"):
        gw.script(text(SUMMARY), mutate_answer=kinds[kind])
        r = compact(gw, {"model": "test-model", "input": HISTORY})
        assert r.status_code == 502, r.text
        assert r.json()["error"]["message"].startswith("The upstream sent a malformed answer")
    gw.script(text(SUMMARY), answer_truncate_at=30)
    assert compact(gw, {"model": "test-model", "input": HISTORY}).status_code == 502
    gateway_config(responses__max_upstream_sse_line_bytes=2048)
    gw.script(text("x" * 3000))
    r = compact(gw, {"model": "test-model", "input": HISTORY})
    assert r.status_code == 502
    assert "max_upstream_sse_line_bytes (2048 bytes)" in r.json()["error"]["message"]
    assert Response.objects.count() == 0 and Item.objects.count() == 0


def test_a_client_compaction_item_is_plain_text_to_the_model(gw: Gateway) -> None:
    """The latest compaction item is an assistant message; earlier ones are superseded."""
    gw.script(text("ok"))
    r = gw.post(
        {
            "model": "test-model",
            "store": False,
            "input": [
                {"type": "compaction", "encrypted_content": "old summary"},
                {"role": "user", "content": "first"},
                {"type": "compaction", "encrypted_content": "gAAAAB-opaque-openai-blob"},
                {"role": "user", "content": "next"},
            ],
        }
    )
    assert r.status_code == 200, r.text
    assert texts(gw, 0) == [
        ("user", "first"),
        ("assistant", "gAAAAB-opaque-openai-blob"),
        ("user", "next"),
    ]


def test_the_estimate_is_bytes_over_four_plus_framing_plus_images() -> None:
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "é" * 5}]}
    # 10 bytes -> 3 tokens, 4 per item, 2 per content part.
    assert estimate_tokens([message]) == 3 + 4 + 2
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 10_000}
    with_image = {**message, "content": [*message["content"], image]}
    assert estimate_tokens([with_image]) == 3 + 4 + 2 + 2 + 1024
    assert estimate_tokens([message], "abcd") == 4 + 4 + 2  # 14 bytes -> 4 tokens
    call = {
        "type": "function_call",
        "call_id": "c1",
        "name": "f",
        "arguments": orjson.dumps({"a": 1}).decode(),
    }
    assert estimate_tokens([call]) == 4 + 2  # "f" + '{"a":1}' = 8 bytes -> 2 tokens


def test_input_tokens_counts_a_compaction_item_as_its_summary(gw: Gateway) -> None:
    from aiohttp import web

    async def tokenize(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response({"count": 9, "max_model_len": 4096, "tokens": [1] * 9, "token_strs": None})

    gw.upstream.script("/tokenize", tokenize)
    r = httpx.post(
        f"{gw.url}/v1/responses/input_tokens",
        json={
            "model": "m",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "compaction", "encrypted_content": SUMMARY},
                {"type": "compaction_trigger"},
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert gw.upstream.last("/tokenize").json()["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": SUMMARY},
    ]


# --- the answer's usage, refusals as create answers them, histories that end in a call ----------


def test_compact_reports_zero_usage_when_the_upstream_reports_none(gw: Gateway) -> None:
    """The SDK's CompactedResponse.usage is required: zeros, not null (docs/responses.md)."""
    gw.script(text(SUMMARY), usage=None)
    r = compact(gw, {"model": "test-model", "input": HISTORY})
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {
        "input_tokens": 0,
        "input_tokens_details": {},
        "output_tokens": 0,
        "output_tokens_details": {},
        "total_tokens": 0,
    }
    assert Response.objects.get(id=r.json()["id"]).usage == r.json()["usage"]
    gw.script(text(SUMMARY), usage=None)
    compacted = gw.client.responses.compact(model="test-model", input=HISTORY)  # type: ignore[arg-type]
    assert compacted.usage.input_tokens == compacted.usage.total_tokens == 0


@pytest.mark.parametrize("field", ["image", "moderation", "prompt", "background_options", "access_programs"])
def test_hosted_fields_are_refused_as_create_refuses_them(gw: Gateway, field: str) -> None:
    value = {"id": "x"}
    created = gw.post({"model": "m", "input": "hi", field: value})
    compacted = compact(gw, {"model": "m", "input": "hi", field: value})
    assert compacted.status_code == created.status_code == 400
    assert compacted.json() == created.json()
    assert compacted.json()["error"]["code"] == "unsupported_parameter"
    assert compacted.json()["error"]["param"] == field
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 0 and Item.objects.count() == 0
    gw.script(text(SUMMARY))
    r = compact(gw, {"model": "m", "input": "hi", field: None})  # null: accepted, as create does
    assert r.status_code == 200, r.text


PENDING_CALL = {"type": "function_call", "call_id": "call_open", "name": "lookup", "arguments": "{}"}


def test_a_history_ending_in_an_unanswered_call_is_summarized(gw: Gateway) -> None:
    """Compaction is not a model turn: a call that awaits its output is summarized, not refused."""
    gw.script(text(SUMMARY))
    r = compact(gw, {"model": "test-model", "input": [*HISTORY, PENDING_CALL]})
    assert r.status_code == 200, r.text
    assert "call_open" in orjson.dumps(gw.upstream_bodies()[0]).decode()
    assert [i["type"] for i in r.json()["output"]] == ["message", "message", "compaction"]

    # The same through a stored response that ended in a client call.
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
    gw.script(call("lookup", "{}", call_id="call_stored"))
    stored_call = gw.post({"model": "test-model", "input": "look it up", "tools": tools}).json()
    assert stored_call["output"][-1]["type"] == "function_call"
    gw.script(text(SUMMARY))
    r = compact(gw, {"model": "test-model", "previous_response_id": stored_call["id"]})
    assert r.status_code == 200, r.text
    gw.script(text("next"))
    after = gw.post({"model": "test-model", "previous_response_id": r.json()["id"], "input": "go on"})
    assert after.status_code == 200, after.text  # the window holds no unanswered call


def test_get_of_a_compaction_checkpoint_is_409_history_only(gw: Gateway) -> None:
    """A /compact checkpoint is a history-only record: GET answers 409 as the spec says of those
    (docs/responses.md); previous_response_id, input items and delete work on it."""
    gw.script(text(SUMMARY))
    compacted = compact(gw, {"model": "test-model", "input": HISTORY}).json()
    r = httpx.get(f"{gw.url}/v1/responses/{compacted['id']}", timeout=10)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "response_snapshot_unavailable"
    listed = httpx.get(f"{gw.url}/v1/responses/{compacted['id']}/input_items?order=asc", timeout=10)
    assert [i["id"] for i in listed.json()["data"]] == [m["id"] for m in compacted["output"][:-1]]
    assert httpx.delete(f"{gw.url}/v1/responses/{compacted['id']}", timeout=10).status_code == 200


def test_compacting_a_multi_agent_response_keeps_its_agent_tree(gw: Gateway) -> None:
    """The root agent is compacted; the window keeps the subagents' items and the checkpoint the
    stored tree, so a continuation from the compaction id is multi-agent and each subagent
    continues its own history."""
    from tests.responses.test_multi_agent import Script as _Script
    from tests.responses.test_multi_agent import _args, body_text, route, task_of, two_subagents

    route(gw, two_subagents, 8)
    first = gw.post({"model": "m", "input": "do two things", "multi_agent": {"enabled": True}}).json()
    assert first["status"] == "completed", first
    tree = Response.objects.get(id=first["id"]).agent_tree

    gw.upstream.scripts[path_for(gw.wire)].clear()  # the router's unused answers
    gw.script(text("Root summary."))
    r = compact(gw, {"model": "m", "previous_response_id": first["id"]})
    assert r.status_code == 200, r.text
    compacted = r.json()
    assert [i["type"] for i in compacted["output"]] == ["message", "compaction"]
    # The summary reads the root's history as the root's model does: no multi-agent items raw.
    summary_round = orjson.dumps(gw.upstream_bodies()[-1]).decode()
    assert "answer to task A" in summary_round  # the subagent's answer, as mail to the root
    assert '"multi_agent_call' not in summary_round and '"agent_message"' not in summary_round
    row = Response.objects.get(id=compacted["id"])
    assert row.agent_tree == tree
    window = [Item.objects.get(id=i).data for i in row.history_item_ids]
    # The subagents' items (their own, and mail to them) follow the root's window.
    owners = {
        i["recipient"] if i["type"] == "agent_message" else i["agent"]["agent_name"] for i in window[2:]
    }
    assert owners == {"/root/a", "/root/b"}

    def followup(body: dict[str, Any]) -> Any:
        task = task_of(body)
        if task is not None:
            return _Script([text(f"again {task}")])
        if "followup_task" not in body_text(body):
            return _Script(
                [call("followup_task", _args(target="a", message="more")), call("wait_agent", _args())]
            )
        return _Script([text("followed up")])

    count = len(gw.upstream_bodies())
    route(gw, followup, 4)
    second = gw.post({"model": "m", "previous_response_id": compacted["id"], "input": "again"}).json()
    assert second["status"] == "completed", second
    later = gw.upstream_bodies()[count:]
    root = [b for b in later if task_of(b) is None]
    assert "Root summary." in body_text(root[0])
    sub = [b for b in later if task_of(b) is not None]
    assert len(sub) == 1 and "answer to task A" in body_text(sub[0]) and "more" in body_text(sub[0])
