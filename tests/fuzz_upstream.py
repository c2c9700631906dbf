"""The scripted upstream as schema fuzzing needs it: vLLM's answers to malformed requests.

The fuzzer sends bodies the scripted upstream's happy-path defaults were never meant to read (not
JSON, not an object, a multipart form without its file). vLLM answers those with its 400
``ErrorResponse`` (Anthropic's error envelope on ``/v1/messages*``), and serves ``/tokenize``; this
subclass does the same, so what the gateway relays is what it would relay from vLLM.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tests.upstream import Recorded, ScriptedUpstream, anthropic_error, vllm_error


class FuzzUpstream(ScriptedUpstream):
    async def default(self, request: web.Request, rec: Recorded) -> web.StreamResponse:
        if request.path == "/tokenize":
            return web.json_response(
                {"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3], "token_strs": None}
            )
        if not request.path.startswith("/v1/audio/") and request.path not in ("/health", "/v1/models"):
            body: Any = None
            try:
                body = orjson.loads(rec.body)
            except orjson.JSONDecodeError:
                pass
            if not isinstance(body, dict):
                return self._refuse(request.path, "The request body must be a JSON object.")
        try:
            return await super().default(request, rec)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # vLLM validates first
            return self._refuse(request.path, f"Invalid request: {exc!r}")

    @staticmethod
    def _refuse(path: str, message: str) -> web.Response:
        if path.startswith("/v1/messages"):
            return web.json_response(anthropic_error(message), status=400)
        return web.json_response(vllm_error(message), status=400)
