"""Ingestion on real Celery workers (``celery -A gateway worker -Q tools``) over the real Redis broker:
one ingests what :func:`files_app.ingest.schedule` sends; one killed mid-ingestion (kill -9) leaves its
file ``failed`` once the sweep runs (here: the next worker's start-up sweep), never ``in_progress``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.core.files.storage import storages
from django.db import connection

from files_app import ingest
from files_app.models import Chunk, VectorStoreFile
from tests.faults import CeleryWorker
from tests.files.ingest_helpers import make_attachment, static, wait_status
from tests.servers import ROOT, child_env
from tests.upstream import hang

pytestmark = [pytest.mark.process, pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]

REDIS_URL = "redis://127.0.0.1:6379/4"
EMBED = "embed-model"


def database_url() -> str:
    """This test's own database, for the worker processes to share with it."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{os.path.abspath(settings['NAME'])}"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    return f"postgres://{settings['USER']}{password}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"


@pytest.fixture
def worker_env(upstream: Any) -> Iterator[dict[str, str]]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield {
        "DATABASE_URL": database_url(),
        "REDIS_URL": REDIS_URL,
        "LLM_API_BASE": upstream.url,
        "GATEWAY_FILES_DIRECTORY": str(storages["files"].location),  # type: ignore[attr-defined]
        "GATEWAY_FILE_SEARCH_EMBEDDING_MODEL": EMBED,
        "GATEWAY_FILE_SEARCH_INGESTION_LEASE_S": "3",
    }
    client.flushdb()
    client.close()


def schedule(env: dict[str, str], *pks: int) -> None:
    """``ingest.schedule`` as the gateway calls it, in a process configured with the broker."""
    listed = ", ".join(map(str, pks))
    code = f"import django; django.setup(); from files_app import ingest; ingest.schedule([{listed}])"
    full_env = {**child_env(env), "DJANGO_SETTINGS_MODULE": "gateway.settings"}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, check=True, timeout=60)


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_a_worker_ingests_and_a_killed_one_leaves_its_file_failed(
    upstream: Any, worker_env: dict[str, str]
) -> None:
    workers: list[CeleryWorker] = []
    try:
        worker = CeleryWorker(worker_env, queues="tools").wait_ready()
        workers.append(worker)
        # Each file is attached just before it is scheduled: a worker's start-up sweep sends again
        # the files attached a lease period (3 s here) before it, and would take them first.
        words = " ".join(f"w{n}" for n in range(300))
        first = make_attachment(words.encode(), chunking_strategy=static(100, 20))
        schedule(worker_env, first.pk)
        done = wait_status(first.pk, "completed", timeout=30)
        chunks = list(Chunk.objects.filter(store_file_id=first.pk).order_by("position"))
        assert len(chunks) > 1 and all(c.embedding is not None and len(c.embedding) == 16 for c in chunks)
        assert done.usage_bytes > 0 and done.lease_owner == ""

        upstream.script("/v1/embeddings", hang())
        embedded = sum(1 for r in upstream.requests if r.path == "/v1/embeddings")
        second = make_attachment(b"held in the embedding call")
        schedule(worker_env, second.pk)
        wait_until(
            lambda: sum(1 for r in upstream.requests if r.path == "/v1/embeddings") > embedded,
            30,
            "the second file's embedding request",
        )
        held = VectorStoreFile.objects.get(pk=second.pk)
        assert held.status == "in_progress" and held.lease_owner.split("/")[1] == str(worker.pid)
        worker.kill()  # kill -9, mid-ingestion

        # The next worker's start-up sweep: the lease's process is gone on this host.
        replacement = CeleryWorker(worker_env, queues="tools").wait_ready()
        workers.append(replacement)
        failed = wait_status(second.pk, "failed", timeout=30)
        assert failed.last_error == {"code": "server_error", "message": ingest.WORKER_LOST}
        assert not Chunk.objects.filter(store_file_id=second.pk).exists()

        third = make_attachment(b"after the crash")
        schedule(worker_env, third.pk)
        assert [c.text for c in wait_status(third.pk, "completed", timeout=30).chunks.all()] == [
            "after the crash"
        ]
    except AssertionError as failure:
        logs = "\n".join(each.output()[-3000:] for each in workers)
        raise AssertionError(f"{failure}\n--- worker logs ---\n{logs}") from None
    finally:
        for each in workers:
            each.stop()
