"""Chat Completions, Completions and Embeddings pass-through, with the real ``openai`` SDK.

Spec (gateway-api.txt, "Chat Completions and Embeddings"): "These paths are forwarded to
{LLM_API_BASE} verbatim … Request and response bodies are relayed unchanged, including tools and
returned tool_calls; streaming responses are relayed as they arrive, and the upstream status code
and headers are preserved."
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from inference_app.upstream.http import forward_headers
from passthrough_app.routes import VLLM_ROUTES
from tests.servers import GatewayProcess, LiveServer, free_port
from tests.upstream import (
    DONE,
    Gate,
    ScriptedUpstream,
    chat_chunks,
    chat_completion,
    completion,
    completion_chunks,
    embeddings,
    hang,
    json_answer,
    sse,
    vllm_error,
)

pytestmark = pytest.mark.django_db(transaction=True)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CALLS = [
    {
        "id": "chatcmpl-tool-9a1b",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
]


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any) -> LiveServer:
    gateway_config(llm_api_base=upstream.url)
    return live_gateway


def client(gw: LiveServer, **kwargs: Any) -> openai.OpenAI:
    kwargs.setdefault("api_key", "sk-client")
    return openai.OpenAI(base_url=f"{gw.url}/v1", max_retries=0, **kwargs)


# --- bodies, byte for byte ------------------------------------------------------------------


def test_chat_json_request_and_response_bytes_unchanged(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    answer = orjson.dumps(chat_completion("Bonjour ✓"))
    upstream.script("/v1/chat/completions", json_answer(answer))
    # Odd spacing, key order and an unknown vLLM field: nothing may be normalised on the way.
    sent = b'{ "model":"test-model",\n "messages":[{"role":"user","content":"Hi \\u00e9"}], "top_k": 3 }'
    r = httpx.post(
        f"{gw.url}/v1/chat/completions", content=sent, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200
    assert r.content == answer
    rec = upstream.last("/v1/chat/completions")
    assert rec.body == sent
    assert rec.method == "POST"
    assert rec.headers["content-type"] == "application/json"
    assert rec.headers["content-length"] == str(len(sent))


def test_chat_with_tools_through_the_sdk(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    answer = orjson.dumps(chat_completion(None, tool_calls=TOOL_CALLS))
    upstream.script("/v1/chat/completions", json_answer(answer))
    raw = client(gw).chat.completions.with_raw_response.create(
        model="test-model",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="auto",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert raw.http_response.content == answer
    result = raw.parse()
    call = result.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == '{"city": "Paris"}'  # type: ignore[union-attr]
    sent = upstream.last("/v1/chat/completions").json()
    assert sent["tools"] == TOOLS
    assert sent["tool_choice"] == "auto"
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}


def test_chat_stream_through_the_sdk_with_usage(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script("/v1/chat/completions", sse(chat_chunks(["Hel", "lo", "!"], include_usage=True)))
    stream = client(gw).chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello!"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 17
    assert upstream.last("/v1/chat/completions").json()["stream_options"] == {"include_usage": True}


def test_chat_stream_bytes_and_headers_unchanged(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    events = chat_chunks(["a", "b"], tool_calls=TOOL_CALLS)
    upstream.script("/v1/chat/completions", sse(events, headers={"X-Upstream-Trace": "t-1"}))
    with httpx.stream(
        "POST", f"{gw.url}/v1/chat/completions", json={"model": "test-model", "messages": [], "stream": True}
    ) as r:
        body = r.read()
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-upstream-trace"] == "t-1"
    assert r.headers["transfer-encoding"] == "chunked"
    assert body == b"".join(events)
    assert body.endswith(DONE)


def test_first_chunk_arrives_before_the_upstream_finishes(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    gate = Gate()
    events = chat_chunks(["one", "two", "three"])
    upstream.script("/v1/chat/completions", sse(events, gate=gate, gate_after=2))
    stream = client(gw).chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    started = time.monotonic()
    it = iter(stream)
    first = next(it)
    second = next(it)
    # Both arrived while the upstream is still held mid-stream: nothing buffers the stream.
    assert time.monotonic() - started < 5
    rec = upstream.last("/v1/chat/completions")
    assert "finished_at" not in rec.extra
    assert first.choices[0].delta.role == "assistant"
    assert second.choices[0].delta.content == "one"
    gate.open()
    rest = list(it)
    assert [c.choices[0].delta.content for c in rest] == ["two", "three", ""]


def test_completions_json_and_stream(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    answer = orjson.dumps(completion(" there"))
    upstream.script("/v1/completions", json_answer(answer))
    raw = client(gw).completions.with_raw_response.create(model="test-model", prompt="Hello", max_tokens=3)
    assert raw.http_response.content == answer
    assert raw.parse().choices[0].text == " there"
    assert upstream.last("/v1/completions").json() == {
        "model": "test-model",
        "prompt": "Hello",
        "max_tokens": 3,
    }

    upstream.script("/v1/completions", sse(completion_chunks([" a", " b"])))
    texts = [
        c.choices[0].text for c in client(gw).completions.create(model="test-model", prompt="x", stream=True)
    ]
    assert texts == [" a", " b", ""]


def test_embeddings(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    answer = orjson.dumps(embeddings(2))
    upstream.script("/v1/embeddings", json_answer(answer))
    raw = client(gw).embeddings.with_raw_response.create(
        model="test-model", input=["a", "b"], encoding_format="float"
    )
    assert raw.http_response.content == answer
    result = raw.parse()
    assert [d.embedding for d in result.data] == [[0.125, 0.25, 0.375, 0.5], [0.25, 0.5, 0.75, 1.0]]
    assert upstream.last("/v1/embeddings").json() == {
        "model": "test-model",
        "input": ["a", "b"],
        "encoding_format": "float",
    }


# --- status codes and headers ------------------------------------------------------------------


def test_upstream_error_returned_unchanged(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    error = orjson.dumps(
        vllm_error(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            param="stream_options",
        )
    )
    upstream.script("/v1/chat/completions", json_answer(error, status=400))
    with pytest.raises(openai.BadRequestError) as info:
        client(gw).chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "Hi"}],
            stream_options={"include_usage": True},
        )
    assert info.value.status_code == 400
    assert info.value.response.content == error
    assert info.value.body == orjson.loads(error)["error"]


def test_upstream_status_and_headers_preserved_hop_by_hop_dropped(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        "/v1/embeddings",
        json_answer(
            b'{"ok":true}',
            status=202,
            headers={
                "X-Request-Cost": "7",
                "Keep-Alive": "timeout=5",
                "Proxy-Authenticate": "Basic",
                "Trailer": "x",
            },
        ),
    )
    r = httpx.post(f"{gw.url}/v1/embeddings", content=b"{}")
    assert r.status_code == 202
    assert r.content == b'{"ok":true}'
    assert r.headers["x-request-cost"] == "7"
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"].startswith("req_")
    for dropped in ("keep-alive", "proxy-authenticate", "trailer"):
        assert dropped not in r.headers


def test_hop_by_hop_request_headers_dropped(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    httpx.post(
        f"{gw.url}/v1/embeddings",
        content=b"{}",
        headers={
            "Keep-Alive": "300",
            "TE": "trailers",
            "Proxy-Authorization": "Basic eA==",
            "Upgrade": "h2c",
            "OpenAI-Organization": "org-1",
            "X-Custom": "kept",
        },
    )
    headers = upstream.last("/v1/embeddings").headers
    for dropped in ("keep-alive", "te", "proxy-authorization", "upgrade"):
        assert dropped not in headers
    assert headers["openai-organization"] == "org-1"
    assert headers["x-custom"] == "kept"
    assert headers["host"] == f"127.0.0.1:{upstream.port}"


def test_query_string_forwarded(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    httpx.post(f"{gw.url}/v1/embeddings?api-version=2024-01&x=1", content=b"{}")
    assert upstream.last("/v1/embeddings").query == "api-version=2024-01&x=1"


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_v1_never_doubled(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any, suffix: str
) -> None:
    gateway_config(llm_api_base=upstream.url + suffix)
    r = httpx.post(f"{live_gateway.url}/v1/chat/completions", json={"model": "test-model", "messages": []})
    assert r.status_code == 200
    assert upstream.last().path == "/v1/chat/completions"


# --- credentials ----------------------------------------------------------------------------


def test_configured_key_injected_when_caller_sends_none(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, openai_api_key="sk-upstream")
    httpx.post(f"{live_gateway.url}/v1/embeddings", content=b"{}")
    assert upstream.last().headers["authorization"] == "Bearer sk-upstream"


def test_caller_credential_forwarded_not_replaced(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, openai_api_key="sk-upstream")
    client(live_gateway, api_key="sk-caller").embeddings.create(model="test-model", input="x")
    assert upstream.last().headers["authorization"] == "Bearer sk-caller"
    httpx.post(f"{live_gateway.url}/v1/embeddings", content=b"{}", headers={"x-api-key": "caller-key"})
    headers = upstream.last().headers
    assert headers["x-api-key"] == "caller-key"
    assert "authorization" not in headers


def test_no_credential_anywhere_sends_none(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    httpx.post(f"{gw.url}/v1/embeddings", content=b"{}")
    assert "authorization" not in upstream.last().headers


def test_consumed_credential_never_forwarded(gateway_config: Any) -> None:
    config = gateway_config(llm_api_base="http://up:8000", openai_api_key="sk-upstream")
    incoming = [("Authorization", "Bearer oidc-token"), ("X-Api-Key", "gw-key"), ("Accept", "*/*")]
    consumed = forward_headers(incoming, config, caller_credential_consumed=True)
    assert consumed == {"accept": "*/*", "authorization": "Bearer sk-upstream"}
    kept = forward_headers(incoming, config, caller_credential_consumed=False)
    assert kept["authorization"] == "Bearer oidc-token"
    assert kept["x-api-key"] == "gw-key"


# --- upstream failures ----------------------------------------------------------------------

UPSTREAM_DOWN = {
    "error": {
        "message": "Could not reach the upstream model server.",
        "type": "server_error",
        "param": None,
        "code": "upstream_error",
    }
}


def test_connection_refused_is_502(live_gateway: LiveServer, gateway_config: Any) -> None:
    gateway_config(llm_api_base=f"http://127.0.0.1:{free_port()}")
    r = httpx.post(f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 502
    assert r.json() == UPSTREAM_DOWN
    with pytest.raises(openai.InternalServerError) as info:
        client(live_gateway).embeddings.create(model="m", input="x")
    assert info.value.status_code == 502


class CutOffUpstream:
    """An upstream that reads each request, sends ``answer`` and closes the connection."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.answer)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: applic",
        b"HTTP/1.1 2xx OK\r\n\r\n",
        # A whole head, then nothing of its JSON body: nothing was sent on yet, so it can be answered.
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
    ],
    ids=["status-line-only", "head-cut-off", "not-http", "head-without-body"],
)
def test_an_upstream_that_answered_and_died_failed_mid_response(
    live_gateway: LiveServer, gateway_config: Any, answer: bytes
) -> None:
    upstream = CutOffUpstream(answer)
    gateway_config(llm_api_base=upstream.url)
    try:
        r = httpx.post(f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": []})
    finally:
        upstream.sock.close()
    assert r.status_code == 502
    assert r.json() == {
        "error": {
            "message": "The upstream connection failed mid-response.",
            "type": "server_error",
            "param": None,
            "code": "upstream_error",
        }
    }


def test_dns_failure_is_502(live_gateway: LiveServer, gateway_config: Any) -> None:
    gateway_config(llm_api_base="http://upstream.invalid:8000")
    r = httpx.post(f"{live_gateway.url}/v1/completions", json={"model": "m", "prompt": "x"})
    assert r.status_code == 502
    assert r.json() == UPSTREAM_DOWN


def test_read_timeout_is_504_and_upstream_sees_the_cancel(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream__read_timeout_s=0.5)
    upstream.script("/v1/chat/completions", hang())
    r = httpx.post(f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 504
    assert r.json() == {
        "error": {
            "message": "The upstream model server did not answer within 0.5s.",
            "type": "server_error",
            "param": None,
            "code": "upstream_timeout",
        }
    }
    assert upstream.wait_disconnected(upstream.last("/v1/chat/completions"))


def test_stalled_stream_ends_with_error_event(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream__stall_timeout_s=0.5)
    events = chat_chunks(["a", "b"])
    upstream.script("/v1/chat/completions", sse(events, stall_after=2))
    with httpx.stream(
        "POST", f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": [], "stream": True}
    ) as r:
        body = r.read()
    error = {
        "error": {
            "message": "The upstream stream stalled for more than 0.5s.",
            "type": "server_error",
            "param": None,
            "code": "upstream_timeout",
        }
    }
    assert body == events[0] + events[1] + b"data: " + orjson.dumps(error) + b"\n\n" + DONE
    assert upstream.wait_disconnected(upstream.last("/v1/chat/completions"))

    # The SDK surfaces the error event as an APIError.
    upstream.script("/v1/chat/completions", sse(events, stall_after=2))
    stream = client(live_gateway).chat.completions.create(model="m", messages=[], stream=True)
    received = []
    with pytest.raises(openai.APIError, match=r"stalled for more than 0\.5s"):
        for chunk in stream:
            received.append(chunk)
    assert len(received) == 2


def test_client_disconnect_mid_stream_cancels_upstream(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    gate = Gate()  # never opened: the upstream would hold the stream for 30 s
    upstream.script("/v1/chat/completions", sse(chat_chunks(["a", "b"]), gate=gate, gate_after=1))
    with httpx.stream(
        "POST", f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": [], "stream": True}
    ) as r:
        first = next(r.iter_raw())
        assert first.startswith(b"data: ")
    assert upstream.wait_disconnected(upstream.last("/v1/chat/completions"), timeout=3)


def test_client_disconnect_while_waiting_cancels_upstream(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script("/v1/chat/completions", hang())
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=0.5)
    assert upstream.wait_disconnected(upstream.last("/v1/chat/completions"), timeout=3)


def test_the_gateway_keeps_serving_after_a_disconnect(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script("/v1/chat/completions", hang())
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=0.3)
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Hello!"


# --- the pooled connection ----------------------------------------------------------------------


def test_pooled_connection_outlives_the_stall_timeout(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    # The stall clock runs only while a body is being read: an idle pooled keep-alive connection
    # must still work after stall_timeout_s has passed.
    gateway_config(llm_api_base=upstream.url, upstream__stall_timeout_s=0.3)
    for _ in range(2):
        r = httpx.post(f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 200
        r = httpx.post(
            f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": [], "stream": True}
        )
        assert r.status_code == 200
        assert r.content.endswith(DONE)
        time.sleep(0.6)
    r = httpx.post(f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 200


def test_connect_timeout_is_504(live_gateway: LiveServer, gateway_config: Any) -> None:
    # A listener whose accept queue is full drops new SYNs: the connect hangs until it times out.
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    try:
        time.sleep(0.2)
        gateway_config(llm_api_base=f"http://127.0.0.1:{port}", upstream__connect_timeout_s=0.3)
        started = time.monotonic()
        r = httpx.post(f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 504
        assert r.json() == {
            "error": {
                "message": "Could not connect to the upstream model server within 0.3s.",
                "type": "server_error",
                "param": None,
                "code": "upstream_timeout",
            }
        }
        assert time.monotonic() - started < 3
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_one_pooled_keep_alive_client(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    # Sequential requests from different clients and routes reuse one upstream connection.
    for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/chat/completions", "/v1/completions"):
        body: dict[str, Any] = {"model": "m", "messages": [], "input": "x", "prompt": "x"}
        assert httpx.post(f"{gw.url}{path}", json=body).status_code == 200
    with httpx.stream(
        "POST", f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": [], "stream": True}
    ) as r:
        r.read()
    assert httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 200
    peers = {rec.extra["peer"] for rec in upstream.requests}
    assert len(upstream.requests) == 6
    assert len(peers) == 1, peers


# --- vLLM's other routes and [passthrough] extra_routes --------------------------------------------

RERANK_ANSWER = (
    b'{"id":"rerank-1","model":"test-model","usage":{"total_tokens":9},'
    b'"results":[{"index":1,"document":{"text":"b"},"relevance_score":0.9}]}'
)


def _answer_for(path: str) -> tuple[bytes, str]:
    """What vLLM answers on ``path``: audio bytes for speech, JSON elsewhere."""
    if path == "/v1/audio/speech":
        return bytes(range(256)) * 4, "audio/mpeg"
    return RERANK_ANSWER, "application/json"


def _scripted_bytes(upstream: ScriptedUpstream, path: str) -> bytes:
    from aiohttp import web

    payload, content_type = _answer_for(path)

    async def answer(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.Response(body=payload, content_type=content_type, headers={"x-vllm-route": path})

    upstream.script(path, answer)
    return payload


@pytest.mark.parametrize("path", VLLM_ROUTES)
def test_vllm_routes_relay_bytes_unchanged(gw: LiveServer, upstream: ScriptedUpstream, path: str) -> None:
    payload = _scripted_bytes(upstream, path)
    sent = b'{ "model":"test-model", "query":"q", "documents":["a","b"],\n "text_1":"x", "top_n":1 }'
    r = httpx.post(f"{gw.url}{path}?trace=1", content=sent, headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert r.content == payload
    assert r.headers["content-type"].startswith(_answer_for(path)[1])
    assert r.headers["x-vllm-route"] == path
    rec = upstream.last()
    assert (rec.path, rec.method, rec.body) == (path, "POST", sent)
    assert rec.query == "trace=1"
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert f'gateway_http_requests_total{{method="POST",route="{path}",status="200"}}' in metrics


def test_vllm_routes_refuse_without_a_credential_and_consume_the_gateways_key(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    from gateway.core.auth import apikeys

    gateway_config(auth__require_api_key=True, openai_api_key="sk-upstream")
    for path in ("/v1/rerank", "/tokenize", "/v1/audio/speech"):
        r = httpx.post(f"{gw.url}{path}", json={"model": "m"})
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "missing_bearer_token"
    assert upstream.requests == []
    _, secret = apikeys.apikey_create(name="reranker")
    _scripted_bytes(upstream, "/v1/rerank")
    r = httpx.post(f"{gw.url}/v1/rerank", json={"model": "m"}, headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 200 and r.content == RERANK_ANSWER
    assert upstream.last("/v1/rerank").headers["authorization"] == "Bearer sk-upstream"


@pytest.mark.process
def test_extra_route_from_config_is_relayed(upstream: ScriptedUpstream, tmp_path: Any) -> None:
    """``[passthrough] extra_routes`` is read at start-up: a ``manage.py serve`` process given it."""
    config = tmp_path / "config.toml"
    config.write_text('[passthrough]\nextra_routes = ["/v2/rerank", "/invocations"]\n')
    env = {"LLM_API_BASE": upstream.url, "GATEWAY_CONFIG": str(config), "GATEWAY_REQUIRE_API_KEY": "false"}
    gateway = GatewayProcess(env).wait(60)
    try:
        for path in ("/v2/rerank", "/invocations"):
            payload = _scripted_bytes(upstream, path)
            sent = b'{"model":"m",  "query":"q"}'
            r = httpx.post(f"{gateway.url}{path}", content=sent, headers={"x-api-key": "caller"})
            assert r.status_code == 200 and r.content == payload
            rec = upstream.last(path)
            assert rec.body == sent and rec.headers["x-api-key"] == "caller"
        # A path nobody configured is not relayed.
        r = httpx.post(f"{gateway.url}/v2/other", content=b"{}")
        assert r.status_code == 404
        assert [rec.path for rec in upstream.requests] == ["/v2/rerank", "/invocations"]
    finally:
        gateway.stop()
