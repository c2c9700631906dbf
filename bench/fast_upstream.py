"""A minimal, fast upstream for the pass-through bench: vLLM's chat completion JSON and SSE.

Raw asyncio protocol on uvloop with httptools, responses pre-built, so the upstream costs as little
CPU as possible and the bench measures the gateways, not this server. It answers
``POST /v1/chat/completions`` (``"stream": true`` in the body selects SSE), ``GET /v1/models`` and
``GET /health``. SSE is written as vLLM writes it: role chunk, one chunk per token, finish chunk,
``data: [DONE]`` — one write per event (``--token-delay-ms`` between tokens, default 0).

    python bench/fast_upstream.py --port 18000 [--tokens 16] [--token-delay-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httptools
import uvloop

MODEL = "bench-model"
HEAD = {"id": "chatcmpl-bench0000000000000000000000000000", "created": 1761140000, "model": MODEL}


def _dump(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def chat_json(tokens: int) -> bytes:
    return _dump(
        {
            **HEAD,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": " tok" * tokens,
                        "tool_calls": [],
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            ],
            "usage": {"prompt_tokens": 13, "total_tokens": 13 + tokens, "completion_tokens": tokens},
        }
    )


def chat_events(tokens: int) -> list[bytes]:
    head = {**HEAD, "object": "chat.completion.chunk"}
    events = [
        _dump(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
    ]
    for _ in range(tokens):
        events.append(
            _dump(
                {
                    **head,
                    "choices": [
                        {"index": 0, "delta": {"content": " tok"}, "logprobs": None, "finish_reason": None}
                    ],
                }
            )
        )
    events.append(
        _dump(
            {
                **head,
                "choices": [
                    {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "length"}
                ],
            }
        )
    )
    out = [b"data: " + e + b"\n\n" for e in events]
    out.append(b"data: [DONE]\n\n")
    return out


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class Upstream(asyncio.Protocol):
    json_response: bytes
    sse_chunks: list[bytes]
    models_response: bytes
    token_delay: float

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        transport = self.transport
        assert transport is not None
        path = self.url.split(b"?")[0]
        if path == b"/v1/chat/completions":
            if b'"stream":true' in b"".join(self.body).replace(b" ", b""):
                if self.token_delay:
                    asyncio.get_running_loop().create_task(self._slow_sse(transport))
                else:
                    self._sse(transport)
            else:
                transport.write(self.json_response)
        elif path == b"/v1/models":
            transport.write(self.models_response)
        elif path == b"/health":
            transport.write(_response(b"200 OK", b"application/json", b"{}"))
        else:
            transport.write(_response(b"404 Not Found", b"application/json", b'{"error":"not found"}'))

    def _sse(self, transport: asyncio.Transport) -> None:
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for chunk in self.sse_chunks:
            transport.write(chunk)
        transport.write(b"0\r\n\r\n")

    async def _slow_sse(self, transport: asyncio.Transport) -> None:
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for index, chunk in enumerate(self.sse_chunks):
            if index > 1:
                await asyncio.sleep(self.token_delay)
            if transport.is_closing():
                return
            transport.write(chunk)
        transport.write(b"0\r\n\r\n")


def configure(tokens: int, token_delay_ms: float) -> None:
    Upstream.json_response = _response(b"200 OK", b"application/json", chat_json(tokens))
    Upstream.sse_chunks = [b"%x\r\n%s\r\n" % (len(e), e) for e in chat_events(tokens)]
    models = _dump(
        {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 4096}],
        }
    )
    Upstream.models_response = _response(b"200 OK", b"application/json", models)
    Upstream.token_delay = token_delay_ms / 1000


async def serve(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Upstream, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    configure(args.tokens, args.token_delay_ms)
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
