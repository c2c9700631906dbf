"""The scripted upstream: a real HTTP server on a loopback port that speaks vLLM's wire formats.

It is the one stand-in the project allows (no real model can be scripted to call tools on demand).
Tests queue answers per path with :meth:`ScriptedUpstream.script`; without a script a route gives
vLLM's default behaviour for a tiny model. Every request it receives is recorded.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.servers import free_port, wait_port

Handler = Callable[[web.Request, "Recorded"], Awaitable[web.StreamResponse]]

MODEL = "test-model"
MAX_MODEL_LEN = 4096


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    disconnected: asyncio.Event | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        return orjson.loads(self.body)


def models_body(models: list[str] | None = None) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": m,
                "object": "model",
                "created": 1700000000,
                "owned_by": "vllm",
                "root": m,
                "parent": None,
                "max_model_len": MAX_MODEL_LEN,
                "permission": [],
            }
            for m in (models or [MODEL])
        ],
    }


class ScriptedUpstream:
    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[Recorded] = []
        self.scripts: dict[str, deque[Handler]] = defaultdict(deque)
        self.models = [MODEL]
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, path: str, handler: Handler) -> None:
        """Answer the next request on ``path`` with ``handler`` (FIFO per path)."""
        self.scripts[path].append(handler)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self.loop.run_until_complete(site.start())
        self._started.set()
        self.loop.run_forever()

    def start(self) -> ScriptedUpstream:
        self._thread.start()
        self._started.wait(10)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.loop is None:
            return
        runner = self._runner

        async def shutdown() -> None:
            if runner is not None:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        rec = Recorded(
            request.method,
            request.path,
            request.query_string,
            {k.lower(): v for k, v in request.headers.items()},
            body,
            asyncio.Event(),
        )
        self.requests.append(rec)
        queue = self.scripts.get(request.path)
        if queue:
            return await queue.popleft()(request, rec)
        return await self.default(request, rec)

    async def default(self, request: web.Request, rec: Recorded) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(status=200)
        if request.path == "/v1/models":
            return web.json_response(models_body(self.models))
        return web.json_response(
            {
                "error": {
                    "message": f"no script for {request.path}",
                    "type": "NotFoundError",
                    "param": None,
                    "code": 404,
                }
            },
            status=404,
        )

    def last(self, path: str | None = None) -> Recorded:
        for rec in reversed(self.requests):
            if path is None or rec.path == path:
                return rec
        raise AssertionError(f"the upstream received no request on {path}")
