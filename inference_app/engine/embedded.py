"""``EmbeddedUpstream``: the engine host inside the gateway process (no ``LLM_API_BASE``, no broker).

The worker's engine host, started on the first request or ``/ready`` probe, on its own loop
thread; chunks cross to the caller's loop as produced, and closing early aborts in the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from gateway.core import errors, tracing
from gateway.core.config import Config
from inference_app.engine.host import EngineHost, Served, get_engine_host
from inference_app.upstream.types import Body, UpstreamResponse, read_body

_END = object()


class EmbeddedUpstream:
    """Inference by the engine hosted in this process (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.host: EngineHost = get_engine_host(config)

    async def _started(self) -> None:
        try:
            await asyncio.wrap_future(self.host.start())
        except Exception as exc:
            raise errors.ServiceUnavailable(
                f"The embedded inference engine could not start: {exc}", code="engine_start_failed"
            ) from None

    async def ready(self, timeout: float) -> None:
        started = self.host.start()  # a readiness probe also starts the engine
        if not started.done():
            raise RuntimeError("the embedded vLLM engine is starting")
        if started.exception() is not None:
            raise RuntimeError(f"the embedded vLLM engine failed to start: {started.exception()}")
        if self.host.dead:
            raise RuntimeError("the embedded vLLM engine died")

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        headers: Mapping[str, str] | None = None,
        query: str = "",
    ) -> UpstreamResponse:
        data = await read_body(body)
        await self._started()
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[object] = asyncio.Queue()
        host = self.host
        # In the caller's context: the engine loop's thread does not see the current span.
        header_list = tracing.with_trace_headers(list((headers or {}).items()))

        async def pump() -> Served:
            """On the engine loop: serve, then forward every chunk to the caller's loop."""
            served = await host.serve(method, path, query, header_list, data)

            async def forward() -> None:
                try:
                    async for chunk in served.chunks:
                        loop.call_soon_threadsafe(inbox.put_nowait, chunk)
                except BaseException as exc:  # handed to the reader
                    loop.call_soon_threadsafe(inbox.put_nowait, exc)
                else:
                    loop.call_soon_threadsafe(inbox.put_nowait, _END)

            forwarder = asyncio.get_running_loop().create_task(forward())
            _running.add(forwarder)
            forwarder.add_done_callback(_running.discard)
            return served

        served = await asyncio.wrap_future(host.run(pump()))
        finished = False

        def abort() -> None:
            if not finished:
                host.loop.call_soon_threadsafe(served.disconnect.set)

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal finished
            try:
                while True:
                    item = await inbox.get()
                    if item is _END:
                        finished = True
                        return
                    if isinstance(item, BaseException):
                        finished = True
                        raise errors.UpstreamError(
                            f"The inference engine failed mid-response: {item}", code="inference_error"
                        )
                    assert isinstance(item, bytes)
                    yield item
            finally:
                abort()

        return UpstreamResponse(served.status, served.headers, chunks(), close=abort)


_running: set[asyncio.Task[None]] = set()
