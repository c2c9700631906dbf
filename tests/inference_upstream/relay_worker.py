"""A Celery inference worker whose engine host relays to the scripted upstream instead of hosting vLLM.

``celery -A tests.inference_upstream.relay_worker worker -Q inference -P threads``: the gateway's own
Celery app and worker machinery (queues, the worker's own queue, heartbeat, claim, Redis Streams) run
unchanged; only the engine host is this relay, so placement tests can run many workers cheaply. The
relay adds ``x-served-by: <worker id>`` to each answer (and ``x-relayed-by`` to each request it sends). Settings: ``RELAY_UPSTREAM`` (the scripted
upstream's URL), ``RELAY_MAX_NUM_SEQS`` (the engine's advertised bound, default 8),
``RELAY_KEYPREFIX`` (the broker's ``global_keyprefix``, as the test process's Celery apps use under
pytest-xdist).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping

import aiohttp

from gateway.celery import app
from gateway.core.config import Config, get_config
from inference_app.engine.host import EngineHost, Served, install_engine_host
from inference_app.engine.tasks import worker_id

__all__ = ["RelayHost", "app"]

_DROPPED = {"content-length", "transfer-encoding", "connection", "content-encoding", "date", "server"}


class RelayHost(EngineHost):
    """An engine host that forwards each request to ``RELAY_UPSTREAM`` on its own event loop."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.upstream = os.environ["RELAY_UPSTREAM"].rstrip("/")
        self.relaying = 0
        self.session: aiohttp.ClientSession | None = None

    async def load(self) -> None:
        self.session = aiohttp.ClientSession()
        async with self.session.get(self.upstream + "/v1/models") as response:
            self.models_body = await response.read()
        self.max_model_len = 4096
        self.max_num_seqs = int(os.environ.get("RELAY_MAX_NUM_SEQS", "8"))

    @property
    def unfinished_requests(self) -> int:
        return self.relaying

    async def serve(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str] | list[tuple[str, str]],
        body: bytes,
        *,
        disconnect: asyncio.Event | None = None,
    ) -> Served:
        assert self.session is not None
        disconnect = disconnect or asyncio.Event()
        items = headers.items() if isinstance(headers, Mapping) else headers
        sent = {k: v for k, v in items if k.lower() not in _DROPPED and k.lower() != "host"}
        sent["x-relayed-by"] = worker_id()  # what the scripted upstream records of each round
        url = self.upstream + path + (f"?{query}" if query else "")
        self.relaying += 1
        try:
            response = await self.session.request(method, url, data=body, headers=sent)
        except BaseException:
            self.relaying -= 1
            raise
        out = [(k.lower(), v) for k, v in response.headers.items() if k.lower() not in _DROPPED]
        out.append(("x-served-by", worker_id()))

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_any():
                    if disconnect.is_set():
                        return
                    yield chunk
            finally:
                response.release()
                self.relaying -= 1

        return Served(response.status, out, chunks(), disconnect)

    def shutdown(self) -> None:
        if self.session is not None and self.loop.is_running():
            self.run(self.session.close()).result(5)
        super().shutdown()


def _install() -> None:
    prefix = os.environ.get("RELAY_KEYPREFIX", "")
    if prefix:
        app.conf.broker_transport_options = {**app.conf.broker_transport_options, "global_keyprefix": prefix}
    # The process's engine host, before the worker starts it (tasks.get_engine_host hands it out).
    install_engine_host(RelayHost(get_config()))


_install()
