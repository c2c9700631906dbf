"""``POST /v1/responses`` on the callback relay (``gateway.relay.callbacks.ServedRelay``), what
``manage.py serve`` runs, and on the ASGI fast path with the relay off.

Every Responses test that uses the ``gw`` fixture goes through the relay (the live gateway runs the
relay's protocol). Here, with the relay on and off (``tests/gateway/both_ways.py``): that each is
really the path taken, and that the answers are the same, refusals included; and what only the
relay has to get right itself: a client that does not read, a client that leaves, the log context.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from gateway import fastroutes
from gateway.relay import callbacks
from responses_app.models import Response as Row
from tests.gateway.both_ways import live_gateway_both_ways as live_gateway  # noqa: F401
from tests.responses.conftest import Gateway, sse_events
from tests.responses.scripts import text
from tests.upstream import Recorded

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def wire() -> str:
    return "responses"


@pytest.fixture
def relay_on(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.callspec.params["live_gateway"] == "relay-on")


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many requests each path served: ``relay`` (``ServedRelay``) and ``asgi`` (the fast path)."""
    counts = {"relay": 0, "asgi": 0}
    send_body, handler = callbacks.ServedRelay._send_body, fastroutes.HANDLERS["/v1/responses"]

    def counting_send_body(self: callbacks.ServedRelay) -> None:
        counts["relay"] += 1
        send_body(self)

    async def counting_handler(*args: Any) -> None:
        counts["asgi"] += 1
        await handler(*args)

    monkeypatch.setattr(callbacks.ServedRelay, "_send_body", counting_send_body)
    monkeypatch.setitem(fastroutes.HANDLERS, "/v1/responses", counting_handler)
    return counts


def test_each_path_serves_json_streams_and_refusals_alike(
    gw: Gateway, relay_on: bool, paths: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    gw.script(text("Hel", "lo"))
    gw.script(text("Wor", "ld"))
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        answered = client.post("/v1/responses", json={"model": "m", "input": "hi"})
        streamed = client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True})
        refused = client.post("/v1/responses", content=b'{"model": "m", "input": ', headers=_JSON)
        wrong_type = client.post("/v1/responses", content=b"{}", headers={"content-type": "text/plain"})
    assert answered.status_code == 200
    assert answered.headers["content-type"] == "application/json"
    body = answered.json()
    assert body["status"] == "completed" and body["output"][0]["content"][0]["text"] == "Hello"
    events = sse_events(streamed)
    assert events[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "World"
    assert streamed.headers["transfer-encoding"] == "chunked"
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_json")
    assert (wrong_type.status_code, wrong_type.json()["error"]["code"]) == (400, "invalid_content_type")
    stored = [body["id"], events[-1]["response"]["id"]]
    assert sorted(Row.objects.values_list("id", flat=True)) == sorted(stored)  # refusals store nothing
    assert {Row.objects.get(id=i).status for i in stored} == {"completed"}
    expected = {"relay": 4, "asgi": 0} if relay_on else {"relay": 0, "asgi": 4}
    assert paths == expected
    # Each access line carries its request's id and status.
    answers = (answered, streamed, refused, wrong_type)
    logged = [(r.request_id, r.status) for r in caplog.records if r.name == "gateway.access"]  # type: ignore[attr-defined]
    assert logged == [(a.headers["x-request-id"], a.status_code) for a in answers]


def test_a_client_that_does_not_read_holds_the_stream_back(
    gw: Gateway, relay_on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stateless stream (relayed from the upstream's ``/v1/responses`` as it comes): while the
    client reads nothing the gateway stops pulling it; nothing is lost once the client reads."""
    count = 3000  # ~24 MB of events: far more than the sockets' buffers hold
    delta = "x" * 8000
    written = [0]

    async def big_stream(request: web.Request, rec: Recorded) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        for n in range(count):
            data = {"type": "response.output_text.delta", "sequence_number": n, "delta": delta}
            await response.write(b"event: response.output_text.delta\ndata: " + orjson.dumps(data) + b"\n\n")
            written[0] += 1
        await response.write_eof()
        return response

    gw.upstream.script("/v1/responses", big_stream)
    waits = [0]
    pump = callbacks.ServedRelay._pump

    def counting_pump(self: callbacks.ServedRelay) -> None:
        waits[0] += self.drained is not None
        pump(self)

    monkeypatch.setattr(callbacks.ServedRelay, "_pump", counting_pump)
    body = {"model": "m", "input": "hi", "store": False, "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{gw.url}/v1/responses", json=body) as response,
    ):
        assert response.status_code == 200
        time.sleep(1.0)  # read nothing for a while
        assert written[0] < count * 0.75, written[0]  # held back, not buffered whole
        received = b"".join(response.iter_raw())
    assert received.count(b"event: response.output_text.delta\n") == count
    assert written[0] == count
    if relay_on:
        assert waits[0] > 0  # the relay's task waited for the client's socket to drain


def test_a_client_that_leaves_is_logged_499_and_the_gateway_serves_on(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    gw.script(text("slow"), delay_s=0.5)  # the JSON answer takes seconds to come
    with socket.create_connection(_address(gw.url)) as sock:
        payload = orjson.dumps({"model": "m", "input": "hi"})  # nothing is sent before the end
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(payload), payload)
        )
        time.sleep(0.3)
    deadline = time.monotonic() + 30
    while not any(getattr(r, "status", None) == 499 for r in caplog.records if r.name == "gateway.access"):
        assert time.monotonic() < deadline, [
            r.getMessage() for r in caplog.records if r.name == "gateway.access"
        ]
        time.sleep(0.05)
    gw.script(text("again"))
    again = gw.post({"model": "m", "input": "hi"})
    assert again.status_code == 200 and again.json()["output"][0]["content"][0]["text"] == "again"


def test_every_step_logs_with_the_request_id(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure inside the answer is logged with its request's id and answered 500 in the envelope."""
    from responses_app import fastpath

    async def broken(call: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(fastpath, "create", broken)
    seen: list[str] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("unhandled error"):
                from gateway.logging import request_id_var

                seen.append(request_id_var.get())

    recorder = Recorder()
    logger = logging.getLogger("gateway")
    logger.addHandler(recorder)
    try:
        answer = gw.post({"model": "m", "input": "hi"})
    finally:
        logger.removeHandler(recorder)
    assert answer.status_code == 500
    assert answer.json()["error"]["message"] == "The server had an error while processing your request."
    assert seen == [answer.headers["x-request-id"]]


def test_a_stream_arrives_whole_and_in_order(gw: Gateway) -> None:
    """Many events, produced together and apart, each once and in order."""
    gw.script(*[text(*[f"w{n}-{m} " for m in range(20)]) for n in range(5)])
    events = gw.stream({"model": "m", "input": "hi"})
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "".join(f"w{n}-{m} " for n in range(5) for m in range(20))


_JSON = {"content-type": "application/json"}


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def test_a_client_leaving_after_a_waited_admission_cancels_the_work(gw: Gateway) -> None:
    """Admission that had to wait (the key snapshot reloads) hands over to the answer's task; a
    client that then leaves still cancels that task and, with it, the upstream request."""
    from gateway.auth import apikeys

    gw.script(text(*["word "] * 200), delay_s=0.05)
    apikeys.reset()  # the next request's authentication waits for a reload
    # Unstored, with a built-in tool: on the executor, whose work ends with its client.
    body = {"model": "m", "input": "hi", "stream": True, "store": False, "tools": [{"type": "web_search"}]}
    with httpx.stream("POST", f"{gw.url}/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200
        seen = b""
        for chunk in r.iter_raw():
            seen += chunk
            if b"response.output_text.delta" in seen:
                break
    assert gw.upstream.wait_disconnected(gw.upstream.last("/v1/responses"))
