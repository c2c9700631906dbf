"""``responses_app.features.steering``: validation, targets, budgets and expiry, without a socket.

The WebSocket behaviour is in test_websocket_steering.py; these pin the rules at unit level
(a fake clock for the 60 s expiry, exact budget edges).
"""

from __future__ import annotations

from typing import Any

import pytest

from responses_app.features import steering
from responses_app.features.steering import Limits, SteerFailure, Steering


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(**limits: Any) -> tuple[Steering, Clock]:
    clock = Clock()
    return Steering(Limits(**limits), clock=clock), clock


def code_of(call: Any) -> str:
    with pytest.raises(SteerFailure) as info:
        call()
    return info.value.code


def test_text_and_messages_become_user_items() -> None:
    assert steering.steer_items("") == [{"type": "message", "role": "user", "content": ""}]
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    items = steering.steer_items([{"role": "user", "content": [{"type": "input_text", "text": "a"}, image]}])
    assert items == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, image]}
    ]


@pytest.mark.parametrize(
    "value",
    [
        [],
        None,
        [{"role": "developer", "content": "x"}],
        [{"role": "user", "content": "x", "id": "msg_1"}],
        [{"role": "user", "content": [{"type": "input_file", "file_data": "data:..."}]}],
        [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}],
        [{"role": "user", "content": [{"type": "input_image", "image_url": "u", "detail": "huge"}]}],
        [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
        [{"type": "function_call_output", "call_id": "c", "output": "x"}],
    ],
)
def test_invalid_inputs(value: Any) -> None:
    assert code_of(lambda: steering.steer_items(value)) == "invalid_input"


def test_the_event_carries_only_type_target_and_input() -> None:
    base = {"type": "response.steer", "previous_response_id": "resp_1", "input": "x"}
    assert steering.parse_steer(base)[0] == "resp_1"
    for extra in ({"stream_id": "a"}, {"model": "m"}, {"instructions": "i"}, {"store": True}):
        assert code_of(lambda extra=extra: steering.parse_steer({**base, **extra})) == "invalid_input"
    assert code_of(lambda: steering.parse_steer({"type": "response.steer", "input": "x"})) == "invalid_input"


def test_scope_refusals() -> None:
    def refused(raw: dict[str, Any], **kw: Any) -> str | None:
        failure = steering.eligibility(raw, **{"generate": True, "conversation_id": None, **kw})
        return failure.code if failure else None

    assert refused({}) is None
    assert refused({}, generate=False) == "steering_not_supported"
    assert refused({}, conversation_id="conv_1") == "steering_not_supported"
    assert refused({"multi_agent": {"enabled": True}}) == "steering_not_supported"
    assert refused({"context_management": [{"type": "compaction"}]}) == "steering_not_supported"
    assert refused({"input": [{"type": "compaction", "encrypted_content": "x"}]}) == "steering_not_supported"


def test_required_inputs_and_unsupported_kinds() -> None:
    output = [
        {"type": "message"},
        {"type": "function_call", "call_id": "c1", "name": "f"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "g"},
        {"type": "shell_call", "call_id": "c3"},
        {"type": "tool_search_call", "call_id": "c4", "execution": "client"},
        {"type": "web_search_call", "id": "ws_1"},
    ]
    stubs, unsupported = steering.required_inputs(output)
    assert stubs == [
        {"type": "function_call_output", "call_id": "c1", "name": "f"},
        {"type": "custom_tool_call_output", "call_id": "c2"},
        {"type": "shell_call_output", "call_id": "c3"},
        {"type": "tool_search_output", "call_id": "c4", "execution": "client"},
    ]
    assert unsupported == []
    assert steering.required_inputs([{"type": "mcp_approval_request", "id": "a"}])[1] == [
        "mcp_approval_request"
    ]
    assert steering.missing_outputs(stubs[:1], [{"type": "function_call_output", "call_id": "c1"}]) == []
    assert steering.missing_outputs(stubs[:2], "text") == ["c1", "c2"]


def test_acceptance_order_distinct_ids_and_queue_limit() -> None:
    s, _ = state(max_queued=3)
    s.register("resp_a", None, {"model": "m"}, None)
    ids = [s.submit("resp_a", f"u{n}", steering.steer_items(f"u{n}"))[1].id for n in range(3)]
    assert len(set(ids)) == 3
    assert [st.input for st in s.targets["resp_a"].batch] == ["u0", "u1", "u2"]
    assert code_of(lambda: s.submit("resp_a", "u3", [])) == "too_many_pending_steers"


def test_input_budget_counts_echoes_until_commit() -> None:
    s, _ = state(input_bytes=30)
    target = s.register("resp_a", None, {"model": "m"}, None)
    s.submit("resp_a", "x" * 20, [])  # 22 bytes of JSON
    assert code_of(lambda: s.submit("resp_a", "y" * 10, [])) == "too_many_pending_steers"
    s.ended(target, "completed", [])
    s.register("resp_b", None, {"model": "m"}, None)  # the successor's response.created
    assert [st.input for st in s.commit(target)] == ["x" * 20]
    assert s.input_bytes == 0
    s.submit("resp_b", "y" * 10, [])


def test_settings_budget_release_and_eviction() -> None:
    settings = {"model": "m", "instructions": "r" * 80}  # about 100 bytes
    s, clock = state(settings_bytes=150)
    a = s.register("resp_a", "lane", settings, None)
    assert a.refusal is None and s.settings_bytes > 0
    # Still generating: a second target cannot fit, and runs without steering.
    b = s.register("resp_b", "other", settings, None)
    assert b.refusal is not None and b.refusal.code == "response_not_active"
    # A newer response.created on the same lane releases the older settings.
    s.ended(a, "completed", [])
    c = s.register("resp_c", "lane", settings, None)
    assert a.settings is None and c.refusal is None
    assert code_of(lambda: s.submit("resp_a", "x", [])) == "response_already_completed"
    # An idle completed target is evicted under pressure.
    s.ended(c, "completed", [])
    clock.now += 1
    d = s.register("resp_d", "third", settings, None)
    assert d.refusal is None and "resp_c" not in s.targets
    assert code_of(lambda: s.submit("resp_c", "x", [])) == "response_not_found"


def test_an_accepted_batch_keeps_its_settings() -> None:
    settings = {"model": "m", "instructions": "r" * 80}
    s, _ = state(settings_bytes=150)
    a = s.register("resp_a", "lane", settings, None)
    s.submit("resp_a", "x", steering.steer_items("x"))
    s.ended(a, "completed", [{"type": "function_call", "call_id": "c", "name": "f"}])
    assert a.state == "waiting"
    b = s.register("resp_b", "lane", settings, None)  # same lane: a's batch still needs them
    assert a.settings == settings and b.refusal is not None
    assert s.waiting_for("lane", "resp_a") is a and s.waiting_for("other", "resp_a") is None


def test_completed_targets_expire_after_the_ttl() -> None:
    s, clock = state()
    a = s.register("resp_a", None, {"model": "m"}, None)
    s.ended(a, "completed", [])
    clock.now += 59.9
    s.submit("resp_a", "x", [])  # still eligible (and now holds a batch)
    s.take(a)
    clock.now += 0.2
    assert code_of(lambda: s.submit("resp_a", "x", [])) == "response_not_found"
    assert s.settings_bytes == 0


def test_a_failed_parent_returns_its_batch() -> None:
    s, _ = state()
    a = s.register("resp_a", None, {"model": "m"}, None)
    s.submit("resp_a", "x", [])
    failed = s.ended(a, "failed", [])
    assert [st.input for st in failed] == ["x"] and s.input_bytes == 0
    assert code_of(lambda: s.submit("resp_a", "x", [])) == "response_not_active"


def test_unsupported_client_items_refuse_the_batch() -> None:
    s, _ = state()
    a = s.register("resp_a", None, {"model": "m"}, None)
    s.submit("resp_a", "x", [])
    failed = s.ended(a, "completed", [{"type": "mcp_approval_request", "id": "apr_1"}])
    assert len(failed) == 1 and a.refusal is not None and a.refusal.code == "steering_not_supported"


def test_failure_budget_and_discard() -> None:
    s, _ = state(failure_bytes=100)
    assert s.reserve_failure(60) and not s.reserve_failure(60)
    s.release_failure(60)
    assert s.reserve_failure(100)
    s.register("resp_a", None, {"model": "m"}, None)
    s.submit("resp_a", "x", [])
    s.discard()
    assert s.targets == {} and s.input_bytes == 0 and s.settings_bytes == 0


def test_spec_defaults() -> None:
    from gateway.core.config import WebSocketConfig

    ws = WebSocketConfig()
    assert ws.steer_max_queued == 32 and ws.steer_target_ttl_s == 60.0
    assert ws.steer_input_bytes == ws.steer_settings_bytes == ws.steer_failure_bytes == 12 * 1024 * 1024
    assert Limits() == Limits(32, 12 * 1024 * 1024, 12 * 1024 * 1024, 12 * 1024 * 1024, 60.0)
