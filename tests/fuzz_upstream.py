"""The scripted upstream as schema fuzzing needs it: vLLM's answers to malformed requests.

The fuzzer sends bodies the scripted upstream's happy-path defaults were never meant to read (not
JSON, not an object, a multipart form without its file). vLLM answers those with its 400
``ErrorResponse`` (Anthropic's error envelope on ``/v1/messages*``), and serves its own routes
(tokenize, rerank, score, pooling, speech …); this subclass does the same, so what the gateway relays
is what it would relay from vLLM.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tests.upstream import Recorded, ScriptedUpstream, anthropic_error, vllm_error

# Answers of vLLM's own routes to a JSON object (their bodies are vLLM's contract, relayed as they are).
VLLM_ANSWERS: dict[str, dict[str, Any]] = {
    "/tokenize": {"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3], "token_strs": None},
    "/detokenize": {"prompt": "Hello!"},
    "/rerank": {"id": "rerank-1", "model": "tiny", "usage": {"total_tokens": 3}, "results": []},
    "/v1/rerank": {"id": "rerank-1", "model": "tiny", "usage": {"total_tokens": 3}, "results": []},
    "/score": {"id": "score-1", "object": "list", "model": "tiny", "data": [], "usage": {"total_tokens": 3}},
    "/v1/score": {
        "id": "score-1",
        "object": "list",
        "model": "tiny",
        "data": [],
        "usage": {"total_tokens": 3},
    },
    "/pooling": {"id": "pool-1", "object": "list", "model": "tiny", "data": [], "usage": {"total_tokens": 3}},
    "/classify": {
        "id": "classify-1",
        "object": "list",
        "model": "tiny",
        "data": [],
        "usage": {"total_tokens": 3},
    },
}


class FuzzUpstream(ScriptedUpstream):
    async def default(self, request: web.Request, rec: Recorded) -> web.StreamResponse:
        if request.path == "/tokenize":
            return web.json_response(VLLM_ANSWERS["/tokenize"])
        if not request.path.startswith("/v1/audio/") and request.path not in ("/health", "/v1/models"):
            body: Any = None
            try:
                body = orjson.loads(rec.body)
            except orjson.JSONDecodeError:
                pass
            if not isinstance(body, dict):
                return self._refuse(request.path, "The request body must be a JSON object.")
            if request.path in VLLM_ANSWERS:
                return web.json_response(VLLM_ANSWERS[request.path])
            if request.path == "/v1/audio/speech":
                return web.Response(body=b"RIFF\x00\x00\x00\x00WAVE", content_type="audio/wav")
        try:
            return await super().default(request, rec)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # vLLM validates first
            return self._refuse(request.path, f"Invalid request: {exc!r}")

    @staticmethod
    def _refuse(path: str, message: str) -> web.Response:
        if path.startswith("/v1/messages"):
            return web.json_response(anthropic_error(message), status=400)
        return web.json_response(vllm_error(message), status=400)
