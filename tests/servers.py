"""Real servers on loopback ports for tests: the gateway itself and the scripted upstream.

``LiveServer`` runs an ASGI app under uvicorn in a background thread (its own event loop), so
tests exercise real sockets, real chunked transfer and real disconnects.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import uvicorn

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sized_answers(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` HTTP answers with sized bodies in a row, read from ``sock``, each up to its
    declared length (a body's own bytes never end an answer early); nothing may follow them."""
    received, answers = b"", []
    while len(answers) < count:
        head, found, content = received.partition(b"\r\n\r\n")
        if found:
            lines = head.lower().split(b"\r\n")
            length = next(int(line[15:]) for line in lines if line.startswith(b"content-length:"))
            if len(content) >= length:
                answers.append(head + found + content[:length])
                received = content[length:]
                continue
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    assert received == b"", received  # nothing beyond the answers asked for
    return answers


def access_records(caplog: Any, count: int, timeout: float = 5.0) -> list[Any]:
    """The ``gateway.access`` log records once there are ``count`` of them (the access line is
    written once the answer is out, so a client can read its answer before the line exists); what
    there is after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        records = [r for r in caplog.records if r.name == "gateway.access"]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.01)


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class LiveServer:
    """An ASGI app served by uvicorn on 127.0.0.1:<port> in a daemon thread."""

    def __init__(
        self,
        app: Any,
        port: int | None = None,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        **uvicorn_options: Any,
    ) -> None:
        self.port = port or free_port()
        self.on_stop = on_stop
        from gateway.relay.protocol import GatewayHttpProtocol

        # The protocol `manage.py serve` runs, so the tests exercise what production serves.
        options = {
            "log_level": "warning",
            "lifespan": "off",
            "access_log": False,
            "http": GatewayHttpProtocol,
        }
        options.update(uvicorn_options)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, **options))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
            if self.on_stop is not None:
                # e.g. close pooled upstream clients, which belong to this loop
                self.loop.run_until_complete(self.on_stop())
        finally:
            self.loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LiveServer:
        self.thread.start()
        wait_port(self.port)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a gateway or worker process a test starts: this one's, less the gateway's
    own settings and backends (a process gets only what the test gives it), plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OIDC_"))}
    for inherited in ("LLM_API_BASE", "DATABASE_URL", "REDIS_URL"):
        full_env.pop(inherited, None)
    full_env.update(env)
    return full_env


class GatewayProcess:
    """The gateway started as a separate process with ``manage.py serve`` (as ``make run`` does).

    Its output is kept for :meth:`output` (a pipe: fine for tests), or written to ``log`` (a path,
    ``os.devnull`` included) for long runs such as the bench scripts, which a pipe nobody reads would
    stall. ``root``: the checkout to run it from (the bench compares an earlier commit's gateway).
    ``wrapper``: a command the server runs under (``bench/instructions.py``: valgrind).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        port: int | None = None,
        *,
        migrate: bool = True,
        log: str | Path | None = None,
        root: Path = ROOT,
        wrapper: Sequence[str] = (),
    ) -> None:
        self.port = port or free_port()
        full_env = child_env(env)
        full_env["PORT"] = str(self.port)
        full_env.setdefault("HOST", "127.0.0.1")
        # Its own embedded database unless the test names one, migrated like `make run` does.
        full_env.setdefault("GATEWAY_SERVER_DATA_DIR", tempfile.mkdtemp(prefix="gateway-proc-"))
        if migrate:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
                cwd=root,
                env=full_env,
                check=True,
                timeout=120,
            )
        self.log = None if log is None else open(log, "w")  # noqa: SIM115 — closed in stop()
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "manage.py", "serve"],
            cwd=root,
            env=full_env,
            stdout=subprocess.PIPE if self.log is None else self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 30.0) -> GatewayProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("gateway did not start")

    def output(self) -> str:
        if self.proc.poll() is None:
            return ""
        return self.proc.stdout.read() if self.proc.stdout else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.log is not None:
            self.log.close()
