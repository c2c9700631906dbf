"""``manage.py serve``: the production server (uvicorn with uvloop/httptools, or daphne)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from gateway.config import Config, ConfigError, get_config
from gateway.startup import run_checks


class Command(BaseCommand):
    help = "Run the gateway's ASGI server on HOST:PORT (uvicorn by default, or daphne)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=None)
        parser.add_argument("--port", type=int, default=None)
        parser.add_argument("--server", choices=["uvicorn", "daphne"], default=None)
        parser.add_argument("--workers", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        config = get_config()
        try:
            run_checks(config)
        except ConfigError as exc:
            sys.exit(f"configuration error: {exc}")
        host = options["host"] or config.server.host
        port = options["port"] or config.server.port
        server = options["server"] or config.server.asgi_server
        workers = options["workers"] or config.server_workers
        if workers == 1:
            # Embedded inference: start loading the engine now, while the server comes up, rather
            # than on the first request (it takes tens of seconds). /ready says when it serves.
            from inference_app.upstream import get_upstream

            engine_host = getattr(get_upstream(), "host", None)
            if engine_host is not None:
                engine_host.start()
        if server == "daphne":
            from daphne.cli import CommandLineInterface

            argv = ["-b", host, "-p", str(port), "--proxy-headers", "gateway.asgi:application"]
            sys.exit(CommandLineInterface().run(argv))
        import uvicorn

        if workers > 1:
            from gateway.metrics import use_multiprocess_dir

            use_multiprocess_dir()  # /metrics adds up every worker (gateway.metrics)

        config_kwargs = uvicorn_options(config, host, port, workers)
        if workers > 1 and hasattr(socket, "SO_REUSEPORT"):
            serve_reuseport(uvicorn.Config("gateway.asgi:application", **config_kwargs))
            return
        uvicorn.run("gateway.asgi:application", **config_kwargs)


def uvicorn_options(config: Config, host: str, port: int, workers: int) -> dict[str, Any]:
    """The ``uvicorn.Config`` options the gateway is served with (tests serve with them too)."""
    from gateway.lifecycle import FLUSH_MARGIN_S
    from gateway.relay import protocols

    # The relay's protocols (the [server] request limits, the drain on SIGTERM, and the relay
    # below ASGI unless direct_relay = false), or stock uvicorn when it is not the uvicorn they
    # are built on (one warning).
    http, ws = protocols(config.server.direct_relay)
    return {
        "host": host,
        "port": port,
        "workers": workers,
        "loop": "uvloop",
        "http": http,
        "ws": ws,
        # The lease sweep runs as a lifespan job; the lifespan's end waits for in-process work.
        "lifespan": "on",
        # SIGTERM (docs/operations.md): responses in flight get shutdown_grace_s, then end
        # failed (gateway.lifecycle); uvicorn cancels whatever still runs after the margin.
        "timeout_graceful_shutdown": config.server.shutdown_grace_s + FLUSH_MARGIN_S,
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": True,
        "server_header": False,
        "date_header": True,
        "ws_max_size": config.server.max_request_body_size_bytes + 1,
        "timeout_keep_alive": 75,
    }


def serve_reuseport(config: Any) -> None:
    """uvicorn's worker processes, each accepting on a listening socket of its own (``SO_REUSEPORT``).

    With one shared socket (uvicorn's way) the worker that wakes first accepts every connection
    waiting, so a burst of new connections lands on one process while the others idle
    (64 connections split 64/0 or 52/12). With a socket per worker the
    kernel spreads connections across them. The parent binds one too, never listening on it: it
    holds the port and fails early when the port is taken.
    """
    from uvicorn.supervisors import Multiprocess

    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    address = (config.host, config.port)
    try:
        held = _reuseport_socket(family, address)
    except OSError as exc:
        sys.exit(f"cannot listen on {config.host}:{config.port}: {exc}")
    try:
        Multiprocess(config, sockets=[_WorkerSocket(family, address)]).run()  # type: ignore[list-item]
    finally:
        held.close()


def _reuseport_socket(family: int, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


class _WorkerSocket:
    """Handed to each worker process (pickled) as a socket that worker binds for itself."""

    def __init__(self, family: int, address: tuple[str, int]) -> None:
        self.family = family
        self.address = address

    def __reduce__(self) -> tuple[Any, tuple[int, tuple[str, int]]]:
        return _reuseport_socket, (self.family, self.address)
