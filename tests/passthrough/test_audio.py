"""Audio transcriptions and translations: multipart uploads streamed to the upstream unchanged.

Spec (gateway-api.txt, "Audio"): "The upload is streamed to the upstream rather than held in memory,
but the request-body ceiling still applies to the whole multipart body: an upload whose declared
length is over the limit is rejected with 413 before the upstream is called, and one sent without a
declared length is cut off with 413 once it passes the limit."
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.servers import GatewayProcess, LiveServer
from tests.upstream import Recorded, ScriptedUpstream, raw_body, transcription_chunks

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4
BOUNDARY = "----gatewaytestboundary7MA4YWxkTrZu0gW"


def multipart(fields: dict[str, str], file: bytes = WAV, boundary: str = BOUNDARY) -> bytes:
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        )
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + file
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts)


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any) -> LiveServer:
    gateway_config(llm_api_base=upstream.url)
    return live_gateway


def sdk(gw: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-x", max_retries=0)


def test_transcription_json_through_the_sdk(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    result = sdk(gw).audio.transcriptions.create(
        model="test-model", file=("a.wav", WAV, "audio/wav"), language="en", response_format="json"
    )
    assert result.text == "Hello world"
    rec = upstream.last("/v1/audio/transcriptions")
    assert rec.extra["form"] == {
        "model": "test-model",
        "file": ("a.wav", WAV),
        "language": "en",
        "response_format": "json",
    }
    assert rec.headers["content-type"].startswith("multipart/form-data; boundary=")


def test_transcription_text_format(gw: LiveServer) -> None:
    text = sdk(gw).audio.transcriptions.create(
        model="test-model", file=("a.wav", WAV, "audio/wav"), response_format="text"
    )
    assert text == "Hello world\n"


# The openai SDK marks audio.translations deprecated (its own warning); the route is still served.
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
def test_translation_route(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    result = sdk(gw).audio.translations.create(model="test-model", file=("a.wav", WAV, "audio/wav"))
    assert result.text == "Hello world"
    assert upstream.last().path == "/v1/audio/translations"
    assert upstream.last().extra["form"]["file"] == ("a.wav", WAV)


@pytest.mark.parametrize("route", ["transcriptions", "translations"])
def test_multipart_bytes_and_boundary_unchanged(
    gw: LiveServer, upstream: ScriptedUpstream, route: str
) -> None:
    body = multipart({"model": "test-model", "temperature": "0.2", "timestamp_granularities[]": "word"})
    content_type = f"multipart/form-data; boundary={BOUNDARY}"
    r = httpx.post(f"{gw.url}/v1/audio/{route}", content=body, headers={"content-type": content_type})
    assert r.status_code == 200
    assert r.json() == {"text": "Hello world", "usage": {"type": "duration", "seconds": 1}}
    rec = upstream.last(f"/v1/audio/{route}")
    assert rec.body == body
    assert rec.headers["content-type"] == content_type
    # The declared length travels with the stream: same framing as the client's.
    assert rec.headers["content-length"] == str(len(body))
    assert "transfer-encoding" not in rec.headers


def test_chunked_upload_relayed_chunked(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    body = multipart({"model": "test-model"})

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), 100):
            yield body[i : i + 100]

    r = httpx.post(
        f"{gw.url}/v1/audio/transcriptions",
        content=pieces(),
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )
    assert r.status_code == 200
    rec = upstream.last("/v1/audio/transcriptions")
    assert rec.body == body
    assert rec.headers["transfer-encoding"] == "chunked"


def test_stream_true_relays_server_sent_events(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    body = multipart({"model": "test-model", "stream": "true"})
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/audio/transcriptions",
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    ) as r:
        received = r.read()
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert received == b"".join(transcription_chunks(["Hello", " world"]))


def test_declared_length_over_limit_is_413_before_upstream(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, server__max_request_body_size_bytes=1000)
    body = multipart({"model": "test-model"}, file=b"\0" * 5000)
    r = httpx.post(
        f"{gw.url}/v1/audio/transcriptions",
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )
    assert r.status_code == 413
    assert r.json() == {
        "error": {
            "message": "Request body exceeds the maximum size of 1000 bytes.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }
    _marker_request(gw, upstream)
    assert upstream.requests == []  # the refused upload never reached the upstream


def test_undeclared_length_cut_off_with_413(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, server__max_request_body_size_bytes=1000)
    body = multipart({"model": "test-model"}, file=b"\0" * 5000)

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), 300):
            yield body[i : i + 300]

    r = httpx.post(
        f"{gw.url}/v1/audio/translations",
        content=pieces(),
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    _marker_request(gw, upstream)
    # The upstream never got a complete upload: the stream to it, if one began, was aborted.
    assert all(upstream.wait_disconnected(rec) for rec in upstream.requests)
    assert all(rec.body == b"" for rec in upstream.requests)


def _marker_request(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    """Send an upload the gateway forwards and wait until the upstream has answered it, then
    forget it: whatever the gateway sent the upstream for an earlier request arrived before.
    (Waits on that condition rather than sleeping and hoping nothing comes.)"""
    seen = len(upstream.requests)
    r = httpx.post(
        f"{gw.url}/v1/audio/transcriptions",
        content=multipart({"model": "marker"}, file=b"\0" * 100),  # under the 1000-byte limit
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )
    assert r.status_code == 200, r.text
    [marker] = [rec for rec in upstream.requests[seen:] if b'name="model"\r\n\r\nmarker' in rec.body]
    upstream.requests.remove(marker)


def _counting_handler(seen_first: threading.Event, counted: dict[str, int]) -> Any:
    @raw_body
    async def handler(request: web.Request, rec: Recorded) -> web.StreamResponse:
        total = 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                break
            total += len(chunk)
            seen_first.set()
        counted["bytes"] = total
        return web.json_response({"text": f"{total} bytes"})

    return handler


def test_upload_reaches_upstream_while_client_still_sending(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    seen_first = threading.Event()
    counted: dict[str, int] = {}
    upstream.script("/v1/audio/transcriptions", _counting_handler(seen_first, counted))
    body = multipart({"model": "test-model"}, file=b"\1" * 200_000)
    reached: list[bool] = []

    def pieces() -> Iterator[bytes]:
        yield body[:50_000]
        # A gateway that buffered the upload would hold this piece until the client finished.
        reached.append(seen_first.wait(5))
        yield body[50_000:]

    r = httpx.post(
        f"{gw.url}/v1/audio/transcriptions",
        content=pieces(),
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )
    assert r.status_code == 200
    assert reached == [True]
    assert counted["bytes"] == len(body)


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


@pytest.mark.process
def test_50_mib_upload_does_not_grow_gateway_memory(upstream: ScriptedUpstream) -> None:
    size = 50 * MiB
    seen_first = threading.Event()
    counted: dict[str, int] = {}
    gateway = GatewayProcess(
        {
            "LLM_API_BASE": upstream.url,
            "GATEWAY_SERVER_MAX_REQUEST_BODY_SIZE_BYTES": str(60 * MiB),
            "LOG_LEVEL": "WARNING",
        }
    )
    try:
        gateway.wait()
        # Warm up (imports, pools) so the baseline is the steady state.
        warm = httpx.post(
            f"{gateway.url}/v1/audio/transcriptions",
            content=multipart({"model": "test-model"}),
            headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
        )
        assert warm.status_code == 200
        before = _memory_kib(gateway.proc.pid)
        upstream.script("/v1/audio/transcriptions", _counting_handler(seen_first, counted))
        head = multipart({"model": "test-model"}, file=b"")
        head, tail = (
            head[: head.index(b"\r\n--" + BOUNDARY.encode() + b"--")],
            f"\r\n--{BOUNDARY}--\r\n".encode(),
        )
        block = b"\x7f" * MiB

        def pieces() -> Iterator[bytes]:
            yield head
            for _ in range(size // MiB):
                yield block
            yield tail

        length = len(head) + size + len(tail)
        r = httpx.post(
            f"{gateway.url}/v1/audio/transcriptions",
            content=pieces(),
            headers={
                "content-type": f"multipart/form-data; boundary={BOUNDARY}",
                "content-length": str(length),
            },
            timeout=60,
        )
        after = _memory_kib(gateway.proc.pid)
        assert r.status_code == 200, r.text
        assert counted["bytes"] == length
        growth_mib = (after["VmHWM"] - before["VmHWM"]) / 1024
        print(f"gateway memory: before {before}, after {after}, peak growth {growth_mib:.1f} MiB")
        assert growth_mib < 16, f"peak RSS grew by {growth_mib:.1f} MiB for a 50 MiB upload"
    finally:
        gateway.stop()
