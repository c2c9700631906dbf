"""The OpenAI routes served by real vLLM through the gateway: embedded engine and Celery worker.

Each test runs twice: with the engine hosted in the gateway process, and with one real Celery
worker over the real Redis. What the client gets must be what ``vllm serve`` sends
(``shared/spec/vllm-openai-server.txt``): chunk order, usage chunk, ``[DONE]``, the four error paths.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.inference.conftest import (
    SERVED,
    Gateway,
    embedded_gateway_for,
    engine_requests_running,
    worker_gateway_for,
    worker_info,
)

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module", params=["embedded", "worker"])
def gateway(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[Gateway]:
    # One engine at a time: the embedded engine stops before the worker's tests start.
    if request.param == "embedded":
        yield from embedded_gateway_for(tiny_model_dir)
    else:
        yield from worker_gateway_for(request.getfixturevalue("worker"), tiny_model_dir)


def post(gw: Gateway, path: str, body: dict[str, object], timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}", json=body, timeout=timeout)


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads in order (vLLM sends no other SSE fields on this route)."""
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def test_chat_completion_json(gateway: Gateway) -> None:
    r = post(gateway, CHAT, {"model": SERVED, "messages": HI, "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == SERVED
    assert body["system_fingerprint"].startswith("vllm-0.32.0-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] == "length"  # random weights: max_tokens ends the answer
    # The chat template renders "Hi" as 12 prompt tokens with the demo tokenizer.
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 5


def test_chat_completion_is_deterministic_at_temperature_zero(gateway: Gateway) -> None:
    body = {"model": SERVED, "messages": HI, "max_tokens": 8, "temperature": 0}
    first = post(gateway, CHAT, body).json()["choices"][0]["message"]["content"]
    second = post(gateway, CHAT, body).json()["choices"][0]["message"]["content"]
    assert first == second


def test_chat_stream_chunk_order_usage_and_done(gateway: Gateway) -> None:
    r = post(
        gateway,
        CHAT,
        {
            "model": SERVED,
            "messages": HI,
            "max_tokens": 6,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    role, *deltas, usage = chunks
    # 1. the role chunk: role and empty content only
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    # 2./3. content deltas; the last one carries finish_reason
    assert all(c["object"] == "chat.completion.chunk" for c in deltas)
    assert [c["choices"][0]["finish_reason"] for c in deltas][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in deltas[:-1])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in deltas)
    # 4. usage chunk: empty choices, None fields dropped, fingerprint moved here
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 6
    assert usage["system_fingerprint"].startswith("vllm-")
    assert "system_fingerprint" not in deltas[-1]
    # The streamed text equals the JSON answer for the same request.
    json_answer = post(gateway, CHAT, {"model": SERVED, "messages": HI, "max_tokens": 6, "temperature": 0})
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in deltas)
    assert streamed == json_answer.json()["choices"][0]["message"]["content"]


def test_chat_stream_without_usage_ends_with_finish_chunk_then_done(gateway: Gateway) -> None:
    r = post(gateway, CHAT, {"model": SERVED, "messages": HI, "max_tokens": 3, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"
    assert all(json.loads(e)["choices"] for e in events[:-1])  # no usage chunk when not asked


def test_openai_sdk_streams_through_the_gateway(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=SERVED,
        messages=HI,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_completions(gateway: Gateway) -> None:
    r = post(
        gateway, "/v1/completions", {"model": SERVED, "prompt": "def", "max_tokens": 4, "temperature": 0}
    )
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4
    s = post(
        gateway,
        "/v1/completions",
        {"model": SERVED, "prompt": "def", "max_tokens": 4, "temperature": 0, "stream": True},
    )
    events = sse_events(s.text)
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == body["choices"][0]["text"]


def test_models_lists_the_served_model(gateway: Gateway) -> None:
    r = httpx.get(f"{gateway.url}/v1/models", timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == SERVED
    assert card["object"] == "model"
    assert card["owned_by"] == "vllm"
    assert card["max_model_len"] == 512


def test_max_tokens_over_the_context_is_400(gateway: Gateway) -> None:
    r = post(gateway, CHAT, {"model": SERVED, "messages": HI, "max_tokens": 5000})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "max_tokens=5000 cannot be greater than max_model_len=512. Please request fewer "
            "output tokens. (parameter=max_tokens, value=5000)",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }


def test_prompt_over_the_context_is_400(gateway: Gateway) -> None:
    long_prompt = "word " * 2000
    r = post(
        gateway,
        CHAT,
        {"model": SERVED, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 1},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "BadRequestError"
    assert error["code"] == 400
    assert "maximum context length is 512 tokens" in error["message"]


def test_stream_options_without_stream_is_400_with_param(gateway: Gateway) -> None:
    r = post(
        gateway,
        CHAT,
        {"model": SERVED, "messages": HI, "stream": False, "stream_options": {"include_usage": True}},
    )
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "type": "BadRequestError",
            "param": "stream_options",
            "code": 400,
        }
    }


def test_wrong_typed_field_is_a_400_validation_error(gateway: Gateway) -> None:
    r = post(gateway, CHAT, {"model": SERVED, "messages": HI, "n": "x"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith("1 validation error:")
    assert "int_parsing" in error["message"]
    assert error["param"] == "body.n"
    assert error["code"] == 400


def test_unknown_model_is_vllms_404(gateway: Gateway) -> None:
    r = post(gateway, CHAT, {"model": "no-such-model", "messages": HI, "max_tokens": 1})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error == {
        "message": "The model `no-such-model` does not exist. Valid aliases: tiny-chat.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


def test_tool_call_parser_is_active(gateway: Gateway) -> None:
    """tool_choice "auto" needs --enable-auto-tool-choice and a parser; the engine has both."""
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    r = post(
        gateway,
        CHAT,
        {"model": SERVED, "messages": HI, "tools": tools, "tool_choice": "auto", "max_tokens": 3},
    )
    # Without the flags vLLM answers 400 ('"auto" tool choice requires --enable-auto-tool-choice …').
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"].get("tool_calls") in (None, [])


def test_a_repeated_long_prompt_reports_cached_tokens(gateway: Gateway) -> None:
    """The hosted engine runs with prefix caching and prompt tokens details (``serve_flags``): a
    prompt sent again is served from the cache, and vLLM's own usage says how much of it was, on
    the pass-through route and through the Responses executor (summed into ``cached_tokens``)."""
    words = " ".join(f"line {i} of the shared system prompt." for i in range(40))
    chat = {"model": SERVED, "messages": [{"role": "user", "content": words}], "max_tokens": 2}
    first = post(gateway, CHAT, chat, timeout=300)  # run alone, it waits for the engine's start
    assert first.status_code == 200, first.text
    prompt_tokens = first.json()["usage"]["prompt_tokens"]
    assert 128 < prompt_tokens < 500  # longer than a cache block, within the context
    again = post(gateway, CHAT, chat).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] > 0
    body = {"model": SERVED, "input": words, "max_output_tokens": 16, "store": False}
    for _ in range(2):  # the second is cached whatever the first rendered
        response = post(gateway, "/v1/responses", body)
        assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] > 0, usage


def test_health(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    engine_health = httpx.get(f"{gateway.url}/upstream-health", timeout=30)
    assert engine_health.status_code == 200  # vLLM's /health: engine alive
    assert engine_health.content == b""


def test_client_disconnect_aborts_the_request_in_the_engine(gateway: Gateway) -> None:
    # 128 sequences of 490 tokens: about half a minute of work for this engine, so only an abort
    # empties it within a few seconds of the disconnect (the bound leaves room for the worker's
    # cancel poll and a busy 2-core CI machine).
    long = {"model": SERVED, "messages": HI, "max_tokens": 490, "n": 128, "ignore_eos": True, "stream": True}
    cancelled_before = worker_info()["outcomes"]["cancelled"] if gateway.mode == "worker" else 0
    with httpx.stream("POST", f"{gateway.url}{CHAT}", json=long, timeout=60) as r:
        # Keep the iterator referenced: a dropped httpx line iterator closes the connection.
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        deadline = time.monotonic() + 5
        while engine_requests_running(gateway) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine_requests_running(gateway) >= 1
        assert next(line for line in lines if line).startswith("data: ")  # still streaming
    closed = time.monotonic()
    while engine_requests_running(gateway) != 0:
        # Half the work's own duration: a CPU-starved CI machine once took over 5 s for the worker
        # to poll the cancel flag and the engine to drop 128 busy sequences (the gateway had logged
        # its 499 at 130 ms). In worker mode the "cancelled" outcome below proves the abort itself.
        assert time.monotonic() - closed < 15.0, "the engine request was not aborted"
        time.sleep(0.05)
    if gateway.mode == "worker":
        assert worker_info()["outcomes"]["cancelled"] == cancelled_before + 1
