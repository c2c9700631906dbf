"""Real processes to break on purpose: a throwaway PostgreSQL cluster and Celery workers.

``PostgresCluster`` is the test's own cluster (``initdb``/``pg_ctl`` into a temporary directory, on
a free port), so restarting it never touches the machine's shared server. ``CeleryWorker`` is
``celery -A gateway worker`` as the README runs it, with its output in a file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.servers import ROOT, GatewayProcess, child_env, free_port


def postgres_bin() -> Path:
    """The folder of PostgreSQL's ``initdb`` and ``pg_ctl``, found as tests/ensure_services.sh finds
    them: ``$PG_BIN``, else ``PATH``, else the newest ``/usr/lib/postgresql/<version>/bin``. Fails
    (not a skip) when there is none: `make test` needs PostgreSQL installed."""
    if "PG_BIN" in os.environ:
        candidates = [Path(os.environ["PG_BIN"])]
    else:
        on_path = shutil.which("initdb")
        versions = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda path: [int(part) for part in path.parent.name.split(".") if part.isdigit()],
        )
        candidates = ([Path(on_path).parent] if on_path else []) + versions[::-1]
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    pytest.fail(
        "PostgreSQL's initdb/pg_ctl are not installed (looked in $PG_BIN, PATH and "
        "/usr/lib/postgresql/*/bin): apt-get install -y postgresql",
        pytrace=False,
    )


class PostgresCluster:
    """A PostgreSQL cluster of the test's own (trust auth on 127.0.0.1:<free port>)."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
        self.data = self.dir / "data"
        # initdb refuses to run as root: the cluster then belongs to the postgres account.
        self.user: str | None = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            shutil.chown(self.dir, self.user)
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8"
        )

    def _run(self, *argv: str) -> None:
        command = list(argv)
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresCluster:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )
        return self

    def restart(self) -> None:
        """Stop (fast: every connection is cut) and start again, as an operator's restart does."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        self.start()

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


WORKER_FLAGS = ("-l", "INFO", "--without-mingle", "--without-gossip")


class CeleryWorker:
    """``celery -A gateway worker -Q <queues>`` in its own process (solo pool: the task runs in
    the process that is killed; an inference worker needs ``pool="threads"``). ``app``: another
    Celery app module (one that wraps the gateway's, as tests/inference_upstream/relay_worker.py)."""

    def __init__(
        self,
        env: Mapping[str, str],
        queues: str = "responses",
        *,
        app: str = "gateway",
        pool: str = "solo",
        concurrency: int = 0,
    ) -> None:
        full_env = child_env(env)
        self.log_path = Path(tempfile.mkstemp(prefix="celery-", suffix=".log")[1])
        self.log = open(self.log_path, "w")  # noqa: SIM115 — closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app,
                "worker",
                "-Q",
                queues,
                "-P",
                pool,
                *(("-c", str(concurrency)) if concurrency else ()),
                *WORKER_FLAGS,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> CeleryWorker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker exited {self.proc.returncode}: {self.output()}")
            if " ready." in self.output():
                return self
            time.sleep(0.2)
        output = self.output()[-2000:]
        self.stop()  # never left consuming the queue of a later test
        raise TimeoutError(f"celery worker not ready: {output}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        self.log_path.unlink(missing_ok=True)


def gateway(env: Mapping[str, str]) -> GatewayProcess:
    process = GatewayProcess(env)
    try:
        return process.wait(60)
    except BaseException:
        process.stop()
        raise
