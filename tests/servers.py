"""Real servers on loopback ports for tests: the gateway itself and the scripted upstream.

``LiveServer`` runs an ASGI app under uvicorn in a background thread (its own event loop), so
tests exercise real sockets, real chunked transfer and real disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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


def exchange(port: int, data: bytes, *, timeout: float = 10.0) -> tuple[bytes, float]:
    """Send ``data``, read until the server closes; the bytes and how long the server took."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(timeout)
        started = time.monotonic()
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass  # closed with our unread bytes in its buffer: the answer arrived first
        return received, time.monotonic() - started


def raw_http(port: int, request: bytes, read_timeout: float = 5.0) -> bytes:
    """Send raw bytes and read until the server closes or the status line and body arrive."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as s:
        s.sendall(request)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = [
                        line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
                    ]
                    if length and len(body) >= int(length[0].split(b":")[1]):
                        break
        except (TimeoutError, ConnectionResetError):
            pass
    return data


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


class _PromptServer(uvicorn.Server):
    """uvicorn's server, which stops at once when :meth:`LiveServer.stop` tells it: its main loop
    waits on an event between its ticks instead of sleeping 0.1 s, and a shutdown with nothing
    open does not wait (most tests are short, and each stops a server or two)."""

    stopping: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self.stopping = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, which polls its connections and tasks every 0.1 s (0.1 s at least
        when one is open), polling every 5 ms; what is left after 10 s is cancelled."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        deadline = time.monotonic() + 10
        while (self.server_state.connections or self.server_state.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for task in self.server_state.tasks:
            task.cancel(msg="the test server stopped")
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


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
        # The protocols `manage.py serve` runs, so the tests exercise what production serves.
        options = {
            "log_level": "warning",
            "lifespan": "off",
            "access_log": False,
            "http": "httptools",
            "ws": "websockets-sansio",
        }
        options.update(uvicorn_options)
        self.server = _PromptServer(uvicorn.Config(app, host="127.0.0.1", port=self.port, **options))
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
        deadline = time.monotonic() + 20
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.002)  # uvicorn's own flag: listening (most tests start a server or two)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        stopping, loop = self.server.stopping, self.loop
        if stopping is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(stopping.set)
        self.thread.join(timeout=10)


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a gateway or worker process a test starts: this one's, less the gateway's
    own settings and backends (a process gets only what the test gives it), plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OIDC_"))}
    for inherited in ("LLM_API_BASE", "DATABASE_URL", "REDIS_URL"):
        full_env.pop(inherited, None)
    full_env.update(env)
    return full_env


class ScratchDatabase:
    """A fresh, empty PostgreSQL database of its own for a gateway or worker process in the
    PostgreSQL leg (`make test-postgres`: this process's ``DATABASE_URL`` names the server), so a
    process a test starts runs on the leg's database engine; dropped by :meth:`drop`."""

    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        self.name = f"gw_proc_{uuid.uuid4().hex[:16]}"
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))
        self._admin = urlunsplit(parts._replace(path="/postgres", query=""))
        self._execute(f'CREATE DATABASE "{self.name}"')

    @staticmethod
    def for_this_leg() -> ScratchDatabase | None:
        """One in the PostgreSQL leg; None in the SQLite leg."""
        url = os.environ.get("DATABASE_URL", "")
        return ScratchDatabase(url) if url.startswith(("postgres://", "postgresql://")) else None

    def _execute(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self._admin, autocommit=True) as admin:
            admin.execute(statement)  # type: ignore[arg-type]  # a name made here, not input

    def drop(self) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def process_database(data_dir: Path) -> tuple[dict[str, str], ScratchDatabase | None]:
    """The environment naming a gateway process's database in this leg: a scratch PostgreSQL
    database in the PostgreSQL leg (the caller drops it), SQLite in ``data_dir`` otherwise."""
    database = ScratchDatabase.for_this_leg()
    if database is None:
        return {"GATEWAY_SERVER_DATA_DIR": str(data_dir)}, None
    return {"DATABASE_URL": database.url, "GATEWAY_SERVER_DATA_DIR": str(data_dir)}, database


class GatewayProcess:
    """The gateway started as a separate process with ``manage.py serve`` (as ``make run`` does).

    Its output is kept for :meth:`output` (a pipe: fine for tests), or written to ``log`` (a path,
    ``os.devnull`` included) for long runs such as the bench scripts, which a pipe nobody reads would
    stall. ``root``: the checkout to run it from (the bench compares an earlier commit's gateway).
    ``wrapper``: a command the server runs under (``bench/instructions.py``: valgrind).

    Its database: the one ``env`` names (``DATABASE_URL``, or SQLite in ``GATEWAY_SERVER_DATA_DIR``);
    when it names none, a :class:`ScratchDatabase` of its own in the PostgreSQL leg (dropped by
    :meth:`stop`), SQLite in a temporary folder in the SQLite leg.
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
        self.database: ScratchDatabase | None = None
        if "DATABASE_URL" not in env and "GATEWAY_SERVER_DATA_DIR" not in env and migrate:
            self.database = ScratchDatabase.for_this_leg()
            if self.database is not None:
                full_env["DATABASE_URL"] = self.database.url
        # Its own database unless the test names one, migrated like `make run` does.
        full_env.setdefault("GATEWAY_SERVER_DATA_DIR", tempfile.mkdtemp(prefix="gateway-proc-"))
        if migrate:
            try:
                subprocess.run(
                    [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
                    cwd=root,
                    env=full_env,
                    check=True,
                    timeout=120,
                )
            except BaseException:
                if self.database is not None:
                    self.database.drop()
                raise
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
        if self.database is not None:
            self.database.drop()
            self.database = None
