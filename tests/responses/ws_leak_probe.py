"""A WebSocket leak probe, run as its own process by ``test_websocket_leaks.py``.

``python -m tests.responses.ws_leak_probe {uvicorn|daphne} CONNECTIONS`` serves the gateway's ASGI
application in this process, on the server ``manage.py serve`` runs (uvicorn with the options
``serve.uvicorn_options`` gives it, or daphne), against the scripted upstream. A client thread opens
one connection (what the server makes once, it makes then), takes a census, then opens
CONNECTIONS connections one after another and uses each one: a ``store: false`` response on a lane,
a stored response on the default lane continuing nothing, a response steered mid-generation (its
automatic successor included), and a stored response the client leaves while it is generating
(finished and stored after the close). After the last close it waits for the server to settle,
then prints one JSON line: the instances of our classes and of the server's protocol classes that
outlived the connections (a census of ``gc.get_objects()`` against the one taken after the first
connection), and the consumers still alive by weak references. The census after the connections
does not collect garbage itself: a reference cycle the server leaves for a full collection that
never comes under its collector settings is memory it keeps, and counts. A process of its own, so
that the server runs as in production (its own event loop, daphne's Twisted reactor in the main
thread) and nothing of another test's is counted.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

import orjson

OURS = ("gateway.", "responses_app.", "conversations_app.", "inference_app.")
SERVERS = ("uvicorn.protocols.", "daphne.", "autobahn.")
SETTLE_S = 20.0  # how long the server may take to let go of what the connections held


def census(collect: bool) -> collections.Counter[str]:
    if collect:
        gc.collect()
    counts: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        module = getattr(kind, "__module__", None)
        if isinstance(module, str) and module.startswith(OURS + SERVERS):
            counts[f"{module}.{kind.__qualname__}"] += 1
    return counts


def outlived(before: collections.Counter[str]) -> dict[str, int]:
    after = census(collect=False)  # what the server itself has not freed, reference cycles included
    return {name: after[name] - before[name] for name in after if after[name] > before[name]}


def main() -> None:
    server_kind, connections = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("GATEWAY_SERVER_DATA_DIR", tempfile.mkdtemp(prefix="ws-leak-"))
    os.environ.pop("DATABASE_URL", None)  # the server's objects are the subject, not the store
    from tests.upstream import ScriptedUpstream

    upstream = ScriptedUpstream().start()
    os.environ["LLM_API_BASE"] = upstream.url
    os.environ["UPSTREAM_API"] = "responses"

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from gateway.core.config import get_config
    from responses_app.api.consumers import ResponsesConsumer
    from tests.servers import free_port

    consumers: weakref.WeakSet[ResponsesConsumer] = weakref.WeakSet()
    connect = ResponsesConsumer.connect

    async def tracked_connect(self: ResponsesConsumer) -> None:
        consumers.add(self)
        await connect(self)

    ResponsesConsumer.connect = tracked_connect  # type: ignore[method-assign]

    port = free_port()
    result: dict[str, Any] = {}

    def client() -> None:
        try:
            from tests.responses.ws_leak_client import run_connections

            wait_for_port(port)
            url = f"http://127.0.0.1:{port}"
            asyncio.run(run_connections(url, upstream, 1))  # what is made once is made now
            before = census(collect=True)
            asyncio.run(run_connections(url, upstream, connections))
            deadline = time.monotonic() + SETTLE_S
            left = outlived(before)
            while (left or len(consumers)) and time.monotonic() < deadline:
                time.sleep(0.2)
                left = outlived(before)
            result.update(outlived=left, consumers=len(consumers), connections=connections)
        except BaseException as exc:  # reported, not raised: the server must still stop
            result.update(error=repr(exc))
        finally:
            stop()

    if server_kind == "uvicorn":
        import uvicorn

        from gateway.management.commands.serve import uvicorn_options

        options = uvicorn_options(get_config(), "127.0.0.1", port, 1)
        options.pop("workers")
        server = uvicorn.Server(uvicorn.Config("gateway.asgi:application", **options))

        def stop() -> None:
            server.should_exit = True

        threading.Thread(target=client, daemon=True).start()
        server.run()
    else:
        from daphne.server import Server
        from twisted.internet import reactor

        from gateway.asgi import application

        def stop() -> None:
            reactor.callFromThread(reactor.stop)  # type: ignore[attr-defined]

        threading.Thread(target=client, daemon=True).start()
        Server(application, endpoints=[f"tcp:port={port}:interface=127.0.0.1"], signal_handlers=False).run()
    upstream.stop()
    print(orjson.dumps(result).decode(), flush=True)


def wait_for_port(port: int) -> None:
    from tests.servers import wait_port

    wait_port(port, 30)


if __name__ == "__main__":
    main()
