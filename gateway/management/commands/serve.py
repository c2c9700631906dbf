"""``manage.py serve``: the production server, configured through its public API (uvicorn with
uvloop/httptools and its own worker processes, or daphne)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from gateway.core.config import Config, ConfigError, get_config
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
            logging.shutdown()  # the queued log lines first: the error stays the last line an operator sees
            sys.exit(f"configuration error: {exc}")
        host = options["host"] or config.server.host
        port = options["port"] or config.server.port
        server = options["server"] or config.server.asgi_server
        workers = options["workers"] or config.server_workers
        if workers == 1:
            # Embedded inference: start loading the engine now, while the server comes up, rather
            # than on the first request (it takes tens of seconds). /ready says when it serves.
            from inference_app.upstream.http import get_upstream

            engine_host = getattr(get_upstream(), "host", None)
            if engine_host is not None:
                engine_host.start()
        if server == "daphne":
            from daphne.cli import CommandLineInterface

            argv = ["-b", host, "-p", str(port), "--proxy-headers", "gateway.asgi:application"]
            sys.exit(CommandLineInterface().run(argv))
        import uvicorn

        if workers > 1:
            from gateway.core.metrics import use_multiprocess_dir

            use_multiprocess_dir()  # /metrics adds up every worker (gateway.core.metrics)
        # uvicorn's own worker processes (its supervisor) when workers > 1.
        uvicorn.run("gateway.asgi:application", **uvicorn_options(config, host, port, workers))


def uvicorn_options(config: Config, host: str, port: int, workers: int) -> dict[str, Any]:
    """The ``uvicorn.Config`` options the gateway is served with (tests use them too). Limits uvicorn has
    no setting for are held in ``gateway.core.middleware`` or by the ingress (``docs/operations.md``)."""
    from gateway.core.lifecycle import FLUSH_MARGIN_S

    return {
        "host": host,
        "port": port,
        "workers": workers,
        "loop": "uvloop",
        # httptools, not h11: h11's buffer bound on a head (h11_max_incomplete_event_size) costs far
        # more CPU per request than the ingress that bounds it anyway (docs/performance.md).
        "http": "httptools",
        "ws": "websockets-sansio",  # uvicorn's legacy "websockets" leaks memory per connection
        # The lease sweep runs as a lifespan job; the lifespan's end waits for in-process work, and
        # its start puts the drain in front of uvicorn's SIGTERM handler.
        "lifespan": "on",
        # SIGTERM (docs/operations.md): responses in flight get shutdown_grace_s, then end
        # failed (gateway.core.lifecycle); uvicorn cancels whatever still runs after the margin.
        "timeout_graceful_shutdown": config.server.shutdown_grace_s + FLUSH_MARGIN_S,
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": True,
        "server_header": False,
        "date_header": True,
        "ws_max_size": config.server.max_request_body_size_bytes + 1,
        "timeout_keep_alive": 75,
    }
