"""Anthropic Messages forwarding, with the real ``anthropic`` SDK.

Spec (gateway-api.txt, "Messages"): "Anthropic Messages requests are forwarded to {LLM_API_BASE}
with Anthropic headers and body fields preserved." Upstream error bodies are relayed unmodified
(Claude Code matches on their wording); the gateway's own errors use the Anthropic envelope.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.servers import LiveServer, free_port
from tests.upstream import (
    Gate,
    ScriptedUpstream,
    anthropic_error,
    anthropic_events,
    anthropic_message,
    hang,
    json_answer,
    sse,
)

pytestmark = pytest.mark.django_db(transaction=True)


SYSTEM = "You are Claude Code.\n\n  Keep   this   spacing\u00a0and ✓ exactly.  \n"


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any) -> LiveServer:
    gateway_config(llm_api_base=upstream.url)
    return live_gateway


def sdk(gw: LiveServer, **kwargs: Any) -> anthropic.Anthropic:
    if "auth_token" not in kwargs:
        kwargs.setdefault("api_key", "sk-ant-caller")
    # Pin the version header the way Claude Code does, so the test can see it arrive unchanged.
    kwargs.setdefault("default_headers", {"anthropic-version": "2023-06-01"})
    return anthropic.Anthropic(base_url=gw.url, max_retries=0, **kwargs)


def test_message_through_the_sdk_preserves_headers_and_body(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    answer = orjson.dumps(anthropic_message("Hi there"))
    upstream.script("/v1/messages", json_answer(answer, headers={"request-id": "req_upstream_1"}))
    raw = sdk(gw).messages.with_raw_response.create(
        model="test-model",
        max_tokens=64,
        system=SYSTEM,
        messages=[{"role": "user", "content": "Hello"}],
        metadata={"user_id": "u-1"},
        extra_body={"top_k": 5},
    )
    assert raw.http_response.content == answer
    assert raw.http_response.headers["request-id"] == "req_upstream_1"
    message = raw.parse()
    assert message.content[0].text == "Hi there"  # type: ignore[union-attr]
    rec = upstream.last("/v1/messages")
    assert rec.headers["anthropic-version"] == "2023-06-01"
    assert rec.headers["authorization"] == "Bearer sk-ant-caller"  # this SDK sends its key as a bearer
    assert rec.json() == {
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hello"}],
        "model": "test-model",
        "metadata": {"user_id": "u-1"},
        "system": SYSTEM,
        "top_k": 5,
    }


def test_system_and_body_bytes_verbatim(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    sent = (
        b'{"model":"test-model","max_tokens":8,'
        b'"system":[{"type":"text","text":"a\\nb","cache_control":{"type":"ephemeral"}}],'
        b'"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":1024}}'
    )
    r = httpx.post(
        f"{gw.url}/v1/messages",
        content=sent,
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "k"},
    )
    assert r.status_code == 200
    rec = upstream.last("/v1/messages")
    assert rec.body == sent
    assert rec.headers["x-api-key"] == "k"


def test_beta_query_and_beta_header(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    message = sdk(gw).beta.messages.create(
        model="test-model",
        max_tokens=16,
        messages=[{"role": "user", "content": "Hi"}],
        betas=["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"],
    )
    assert message.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert upstream.last("/v1/messages").headers["anthropic-beta"] == (
        "interleaved-thinking-2025-05-14,context-1m-2025-08-07"
    )
    # Claude Code posts to /v1/messages?beta=true: same route, query forwarded as is.
    r = httpx.post(
        f"{gw.url}/v1/messages?beta=true",
        json={"model": "m", "max_tokens": 1, "messages": []},
        headers={"anthropic-beta": "oauth-2025-04-20", "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200
    rec = upstream.last("/v1/messages")
    assert rec.query == "beta=true"
    assert rec.headers["anthropic-beta"] == "oauth-2025-04-20"


def test_stream_through_the_sdk(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    events = anthropic_events(["Hel", "lo", "!"])
    upstream.script("/v1/messages", sse(events))
    with sdk(gw).messages.stream(
        model="test-model", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello!"
    assert final.stop_reason == "end_turn"
    assert upstream.last("/v1/messages").json()["stream"] is True


def test_stream_bytes_unchanged_and_first_event_early(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    gate = Gate()
    events = anthropic_events(["a", "b"])
    upstream.script("/v1/messages", sse(events, gate=gate, gate_after=1))
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/messages",
        json={"model": "m", "max_tokens": 8, "messages": [], "stream": True},
        headers={"anthropic-version": "2023-06-01"},
    ) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        assert first == events[0]  # arrived while the upstream is held
        gate.open()
        rest = b"".join(chunks)
    assert first + rest == b"".join(events)


def test_count_tokens(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    result = sdk(gw).messages.count_tokens(
        model="test-model", system=SYSTEM, messages=[{"role": "user", "content": "Hello"}]
    )
    assert result.input_tokens == 13
    rec = upstream.last("/v1/messages/count_tokens")
    assert rec.json()["system"] == SYSTEM
    assert rec.headers["anthropic-version"] == "2023-06-01"


def test_authorization_bearer_accepted_and_forwarded(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    sdk(gw, auth_token="oauth-token-1").messages.create(
        model="test-model", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    )
    headers = upstream.last("/v1/messages").headers
    assert headers["authorization"] == "Bearer oauth-token-1"
    assert "x-api-key" not in headers


def test_configured_key_not_injected_over_x_api_key(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, openai_api_key="sk-upstream")
    httpx.post(
        f"{live_gateway.url}/v1/messages",
        json={"model": "m", "max_tokens": 1, "messages": []},
        headers={"x-api-key": "sk-ant-caller", "anthropic-version": "2023-06-01"},
    )
    headers = upstream.last("/v1/messages").headers
    assert headers["x-api-key"] == "sk-ant-caller"
    assert "authorization" not in headers
    # No credential at all: the configured key is injected.
    httpx.post(f"{live_gateway.url}/v1/messages", json={"model": "m", "max_tokens": 1, "messages": []})
    assert upstream.last("/v1/messages").headers["authorization"] == "Bearer sk-upstream"


def test_upstream_error_body_unmodified(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    error = orjson.dumps(anthropic_error("prompt is too long: 210000 tokens > 200000 maximum"))
    upstream.script("/v1/messages", json_answer(error, status=400))
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk(gw).messages.create(
            model="test-model", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    assert info.value.status_code == 400
    assert info.value.response.content == error
    assert "prompt is too long: 210000 tokens > 200000 maximum" in str(info.value)


def test_upstream_down_is_502_in_anthropic_envelope(live_gateway: LiveServer, gateway_config: Any) -> None:
    gateway_config(llm_api_base=f"http://127.0.0.1:{free_port()}")
    for path in ("/v1/messages", "/v1/messages?beta=true", "/v1/messages/count_tokens"):
        r = httpx.post(f"{live_gateway.url}{path}", json={"model": "m", "max_tokens": 1, "messages": []})
        assert r.status_code == 502
        body = r.json()
        assert body == {
            "type": "error",
            "error": {"type": "api_error", "message": "Could not reach the upstream model server."},
            "request_id": body["request_id"],
        }
        assert body["request_id"].startswith("req_")
        assert r.headers["request-id"] == body["request_id"]
    with pytest.raises(anthropic.InternalServerError) as info:
        sdk(live_gateway).messages.create(
            model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.status_code == 502


def test_timeout_is_504_in_anthropic_envelope(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream__read_timeout_s=0.5)
    upstream.script("/v1/messages", hang())
    r = httpx.post(f"{live_gateway.url}/v1/messages", json={"model": "m", "max_tokens": 1, "messages": []})
    assert r.status_code == 504
    assert r.json()["error"] == {
        "type": "api_error",
        "message": "The upstream model server did not answer within 0.5s.",
    }


def test_stalled_stream_ends_with_anthropic_error_event(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream__stall_timeout_s=0.5)
    events = anthropic_events(["a", "b"])
    upstream.script("/v1/messages", sse(events, stall_after=3))
    with httpx.stream(
        "POST",
        f"{live_gateway.url}/v1/messages",
        json={"model": "m", "max_tokens": 8, "messages": [], "stream": True},
    ) as r:
        body = r.read()
    error_event = (
        b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
        b'"message":"The upstream stream stalled for more than 0.5s."}}\n\n'
    )
    assert body == b"".join(events[:3]) + error_event
    # The SDK raises on the error event.
    upstream.script("/v1/messages", sse(events, stall_after=3))
    with (
        pytest.raises(anthropic.APIStatusError, match="stalled"),
        sdk(live_gateway).messages.stream(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        ) as s,
    ):
        for _ in s.text_stream:
            pass


def test_disconnect_cancels_upstream_messages_stream(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    gate = Gate()
    upstream.script("/v1/messages", sse(anthropic_events(["a"]), gate=gate, gate_after=1))
    with httpx.stream(
        "POST", f"{gw.url}/v1/messages", json={"model": "m", "max_tokens": 8, "messages": [], "stream": True}
    ) as r:
        next(r.iter_raw())
    assert upstream.wait_disconnected(upstream.last("/v1/messages"), timeout=3)


def test_head_root_answers_200_cleanly(live_gateway: LiveServer) -> None:
    r = httpx.head(f"{live_gateway.url}/")
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["x-request-id"].startswith("req_")


def test_messages_get_is_405_in_anthropic_envelope(gw: LiveServer) -> None:
    r = httpx.get(f"{gw.url}/v1/messages")
    assert r.status_code == 405
    assert r.json()["error"] == {
        "type": "invalid_request_error",
        "message": "Method GET is not allowed on /v1/messages.",
    }


@pytest.mark.slow
def test_claude_code_through_the_gateway(gw: LiveServer, upstream: ScriptedUpstream, tmp_path: Any) -> None:
    """Claude Code itself (``claude -p``) against the gateway: its request reaches the upstream with
    its headers and body as sent, and the streamed answer reaches the user."""
    import subprocess

    from tests.clients import claude_code_cli

    upstream.script("/v1/messages", sse(anthropic_events(["Relayed ", "by the gateway"])))
    result = subprocess.run(
        [str(claude_code_cli()), "-p", "say hello", "--model", "test-model"],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "ANTHROPIC_BASE_URL": gw.url,
            "ANTHROPIC_API_KEY": "sk-claude-code",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Relayed by the gateway"
    rec = upstream.last("/v1/messages")
    assert rec.headers["x-api-key"] == "sk-claude-code"
    assert "claude-code-20250219" in rec.headers["anthropic-beta"]
    assert rec.headers["anthropic-version"] == "2023-06-01"
    body = rec.json()
    assert body["model"] == "test-model" and body["stream"] is True
    assert "say hello" in orjson.dumps(body["messages"]).decode()
