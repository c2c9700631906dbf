"""Ingestion: an attached file (``VectorStoreFile``, ``in_progress``) becomes published chunks, in the
background (docs/file-search.md, "Ingestion").

:func:`schedule` runs :func:`ingest_one` on the Celery ``tools`` queue when a broker is configured
(task ``files.ingest``), else on this process's ingestion thread. :func:`ingest_one` claims the
attachment's lease, reads and extracts the file, chunks it, embeds the chunks when an embedding model is
configured, and publishes the chunks in the one transaction that makes the attachment ``completed`` --
only while it is still ``in_progress`` and still its own, so a cancel or a detach meanwhile wins and
nothing is published. A failure ends ``failed`` with ``last_error`` and no chunks.

:func:`sweep` (run by the gateway's periodic lease sweep and at each worker's start) fails a claimed
attachment whose lease expired or whose local process is gone, sends an unclaimed one again once per
lease period, and fails one nobody claimed for ``UNCLAIMED_PERIODS`` lease periods.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from files_app import chunking, embeddings
from files_app.extract import Unreadable, extract_text
from files_app.models import Chunk, VectorStore, VectorStoreFile
from gateway.core import errors
from gateway.core.config import Config, get_config
from gateway.core.db import run_orm
from gateway.core.runner import HOST, owner_alive, runner_id

log = logging.getLogger("files.ingest")

TASK_NAME = "files.ingest"
TOOLS_QUEUE = "tools"
# Ingestions at once on one process's ingestion thread (no broker).
LOCAL_CONCURRENCY = 2
# An attachment nobody claimed is sent again once per lease period, and failed after this many.
UNCLAIMED_PERIODS = 10
# Lease renewals per lease period (a renewal that fails is retried at the next one).
RENEWALS_PER_LEASE = 4

IN_PROGRESS = VectorStoreFile.Status.IN_PROGRESS
WORKER_LOST = "Ingestion worker lost: it stopped before finishing this file. Attach the file again to retry."


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


# --- the database steps (synchronous: run through run_orm) ------------------------------------------
@dataclass(frozen=True)
class Claimed:
    pk: int
    store_id: str
    file_id: str
    filename: str
    content_type: str
    storage_name: str
    chunking_strategy: dict[str, Any]


def claim(pk: int, owner: str, lease_s: float) -> Claimed | None:
    """Take the attachment's lease if it is in progress and its lease is free or expired."""
    now = timezone.now()
    taken = (
        VectorStoreFile.objects.filter(pk=pk, status=IN_PROGRESS)
        .filter(Q(lease_owner="") | Q(lease_expires_at__lt=now))
        .update(lease_owner=owner, lease_expires_at=now + datetime.timedelta(seconds=lease_s))
    )
    if not taken:
        return None
    row = VectorStoreFile.objects.select_related("file").filter(pk=pk).first()
    if row is None:
        return None
    return Claimed(
        pk=pk,
        store_id=row.vector_store_id,
        file_id=row.file_id,
        filename=row.file.filename,
        content_type=row.file.content_type,
        storage_name=row.file.storage_name,
        chunking_strategy=dict(row.chunking_strategy or {}),
    )


def renew(pk: int, owner: str, lease_s: float) -> bool:
    """Extend the lease; False once the attachment is no longer in progress under it (cancelled,
    detached, or failed by the sweep)."""
    until = timezone.now() + datetime.timedelta(seconds=lease_s)
    return bool(
        VectorStoreFile.objects.filter(pk=pk, status=IN_PROGRESS, lease_owner=owner).update(
            lease_expires_at=until
        )
    )


def fail(pk: int, owner: str, code: str, message: str) -> bool:
    """End the attachment ``failed`` with ``last_error`` (only while it is still ours)."""
    return bool(
        VectorStoreFile.objects.filter(pk=pk, status=IN_PROGRESS, lease_owner=owner).update(
            status=VectorStoreFile.Status.FAILED,
            last_error=_error(code, message),
            lease_owner="",
            lease_expires_at=None,
        )
    )


@dataclass(frozen=True)
class StoreState:
    embedding_model: str
    embedding_dimensions: int | None
    chunks: int


def store_state(store_id: str) -> StoreState:
    store = VectorStore.objects.filter(pk=store_id).values("embedding_model", "embedding_dimensions").first()
    if store is None:
        return StoreState("", None, 0)
    count = Chunk.objects.filter(vector_store_id=store_id).count()
    return StoreState(store["embedding_model"], store["embedding_dimensions"], count)


def too_many_chunks_message(existing: int, adding: int, limit: int) -> str:
    return (
        f"The file makes {adding} chunks and the vector store holds {existing}: more than the "
        f"{limit} chunks a vector store may hold here ([file_search] max_chunks_per_store)."
    )


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def publish(
    claimed: Claimed,
    owner: str,
    chunks: Sequence[chunking.Chunk],
    vectors: list[list[float]] | None,
    model: str,
    max_chunks: int,
) -> str:
    """In one transaction: the attachment ``completed`` (if still in progress under ``owner``), its
    chunks inserted, the store's revision bumped and, for the store's first embedded chunks, its
    embedding space recorded. ``"completed"``, ``"gone"`` (cancelled or detached: nothing written) or
    ``"failed"`` (the store's chunk limit, or another embedding space: nothing published)."""
    try:
        with transaction.atomic():
            # The store's row first, as deleting a store locks it before its attachments: taking them
            # in the same order, a publish and a store delete never deadlock.
            if not VectorStore.objects.select_for_update().filter(pk=claimed.store_id).exists():
                return "gone"
            done = VectorStoreFile.objects.filter(
                pk=claimed.pk, status=IN_PROGRESS, lease_owner=owner
            ).update(
                status=VectorStoreFile.Status.COMPLETED,
                last_error=None,
                lease_owner="",
                lease_expires_at=None,
            )
            if not done:
                return "gone"
            now = timezone.now()
            # The store's lock (above) decides its chunk count and embedding space one file at a time.
            VectorStore.objects.filter(pk=claimed.store_id).update(
                revision=F("revision") + 1, last_active_at=now
            )
            store = VectorStore.objects.get(pk=claimed.store_id)
            existing = Chunk.objects.filter(vector_store_id=claimed.store_id).count()
            if existing + len(chunks) > max_chunks:
                raise _Refused("invalid_file", too_many_chunks_message(existing, len(chunks), max_chunks))
            packed: list[bytes | None] = [None] * len(chunks)
            if vectors is not None:
                dims = len(vectors[0]) if vectors else 0
                first = store.embedding_model == "" and existing == 0
                if first or (store.embedding_model == model and store.embedding_dimensions is None):
                    # The store's first embedded file records its space (a store is created with the
                    # configured model and no dimensions, or, made before a model was set, with none).
                    store.embedding_model, store.embedding_dimensions = model, dims
                    VectorStore.objects.filter(pk=store.pk).update(
                        embedding_model=model, embedding_dimensions=dims
                    )
                if store.embedding_model == model:
                    if store.embedding_dimensions != dims:
                        raise _Refused(
                            "server_error",
                            f"The embedding model {model!r} now returns {dims} dimensions; this vector "
                            f"store was built with {store.embedding_dimensions}.",
                        )
                    packed = [embeddings.pack(v) for v in vectors]
                # else: a keyword-only store, or one of another embedding space: no vectors stored.
            if store.expires_after and store.expires_after.get("anchor") == "last_active_at":
                days = int(store.expires_after.get("days") or 0)
                VectorStore.objects.filter(pk=store.pk).update(expires_at=now + datetime.timedelta(days=days))
            Chunk.objects.bulk_create(
                [
                    Chunk(
                        store_file_id=claimed.pk,
                        vector_store_id=claimed.store_id,
                        file_id=claimed.file_id,
                        position=position,
                        text=chunk.text,
                        tokens=chunk.tokens,
                        embedding=vector,
                    )
                    for position, (chunk, vector) in enumerate(zip(chunks, packed, strict=True))
                ],
                batch_size=500,
            )
            usage = sum(len(c.text.encode()) for c in chunks) + sum(len(v) for v in packed if v is not None)
            VectorStoreFile.objects.filter(pk=claimed.pk).update(usage_bytes=usage)
            return "completed"
    except _Refused as refused:
        return "failed" if fail(claimed.pk, owner, refused.code, refused.message) else "gone"


# --- one attachment -------------------------------------------------------------------------------
def _read_bytes(storage_name: str) -> bytes:
    from django.core.files.storage import storages

    with storages["files"].open(storage_name, "rb") as handle:
        data: bytes = handle.read()
        return data


async def ingest_one(pk: int, config: Config | None = None) -> str | None:
    """Ingest one attachment (module docstring). Its outcome -- ``"completed"``, ``"failed"`` or
    ``"gone"`` -- or None when it was not claimed (done, cancelled, or another worker holds it)."""
    config = config or get_config()
    owner = runner_id()
    lease_s = config.file_search.ingestion_lease_s
    claimed = await run_orm(claim, pk, owner, lease_s)
    if claimed is None:
        log.info("attachment %s: not claimed (no longer in progress, or leased by another worker)", pk)
        return None
    work = asyncio.current_task()
    assert work is not None
    lost: list[bool] = []

    async def keep_lease() -> None:
        while True:
            await asyncio.sleep(lease_s / RENEWALS_PER_LEASE)
            try:
                held = await run_orm(renew, pk, owner, lease_s)
            except Exception:  # the database is down: retried; the sweep fails it if this lasts
                log.warning("attachment %s: renewing its lease failed", pk, exc_info=True)
                continue
            if not held:
                lost.append(True)
                work.cancel()
                return

    keeper = asyncio.get_running_loop().create_task(keep_lease())
    try:
        outcome = await _ingest(claimed, owner, config)
    except asyncio.CancelledError:
        if not lost:
            raise
        work.uncancel()
        log.info("attachment %s: cancelled, detached or swept while ingested; nothing published", pk)
        return "gone"
    finally:
        keeper.cancel()
    log.info("attachment %s (%s): %s", pk, claimed.file_id, outcome)
    return outcome


async def _ingest(claimed: Claimed, owner: str, config: Config) -> str:
    async def failed(code: str, message: str) -> str:
        return "failed" if await run_orm(fail, claimed.pk, owner, code, message) else "gone"

    try:
        try:
            raw = await asyncio.to_thread(_read_bytes, claimed.storage_name)
        except OSError as exc:
            log.error("attachment %s: reading %s failed: %s", claimed.pk, claimed.storage_name, exc)
            return await failed("server_error", "The file's bytes could not be read from storage.")
        try:
            text = await asyncio.to_thread(extract_text, raw, claimed.filename, claimed.content_type)
        except Unreadable as exc:
            return await failed(exc.code, exc.message)
        del raw
        pieces, method = await chunking.chunk_text(text, claimed.chunking_strategy, config)
        if not pieces:
            return await failed("invalid_file", f"{claimed.filename} contains no text.")
        max_chunks = config.file_search.max_chunks_per_store
        state = await run_orm(store_state, claimed.store_id)
        if state.chunks + len(pieces) > max_chunks:  # checked again when published
            return await failed(
                "invalid_file", too_many_chunks_message(state.chunks, len(pieces), max_chunks)
            )
        model = config.file_search.embedding_model
        vectors: list[list[float]] | None = None
        if model and (state.embedding_model == model or (state.embedding_model == "" and state.chunks == 0)):
            try:
                vectors = await embeddings.embed([p.text for p in pieces], config)
            except errors.GatewayError as exc:
                return await failed("server_error", f"Embedding the file's chunks failed: {exc.message}")
        log.debug("attachment %s: %d chunks (tokens: %s)", claimed.pk, len(pieces), method)
        return await run_orm(publish, claimed, owner, pieces, vectors, model, max_chunks)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("attachment %s: ingestion crashed", claimed.pk)
        return await failed("server_error", f"Ingestion failed: {type(exc).__name__}.")


# --- scheduling -------------------------------------------------------------------------------------
def schedule(pks: Iterable[int]) -> None:
    """Start ingesting these attachments (call it once their rows committed); returns at once. With a
    broker, one ``files.ingest`` task each on the ``tools`` queue (a broker that refuses is logged:
    the sweep sends them again); otherwise on this process's ingestion thread."""
    pks = list(pks)
    if not pks:
        return
    config = get_config()
    if not config.broker_enabled:
        _local.submit(pks)
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _send(pks, config)
        return
    loop.run_in_executor(None, _send, pks, config)  # a broker write must not hold the event loop


def _send(pks: list[int], config: Config) -> None:
    from inference_app.upstream.celery_config import client_app

    app = client_app(config)
    for pk in pks:
        try:
            app.send_task(TASK_NAME, args=[pk], queue=TOOLS_QUEUE, ignore_result=True, retry=False)
        except Exception as exc:
            log.warning(
                "attachment %s: the broker refused its ingestion task (%s); the sweep sends it again", pk, exc
            )


class _LocalRunner:
    """This process's ingestion thread (no broker): an event loop running up to LOCAL_CONCURRENCY
    ingestions at once, their CPU work in worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._gate: asyncio.Semaphore | None = None
        self._active = 0

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                self._gate = asyncio.Semaphore(LOCAL_CONCURRENCY)
                thread = threading.Thread(target=loop.run_forever, name="files-ingest", daemon=True)
                thread.start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def submit(self, pks: list[int]) -> None:
        loop = self._started()
        for pk in pks:
            asyncio.run_coroutine_threadsafe(self._run(pk), loop)

    async def _run(self, pk: int) -> None:
        assert self._gate is not None
        from inference_app.upstream.http import close_upstreams

        async with self._gate:
            self._active += 1
            try:
                await ingest_one(pk)
            except Exception:
                log.exception("attachment %s: ingestion failed", pk)
            finally:
                self._active -= 1
                if not self._active:
                    # Idle: no upstream connection is left open on this thread's loop.
                    await close_upstreams()


_local = _LocalRunner()


# --- the sweep --------------------------------------------------------------------------------------
def sweep(now: datetime.datetime | None = None) -> int:
    """Fail in-progress attachments whose ingestion worker is gone (lease expired, or a local process
    that exited), send again those nobody claimed for a lease period, fail those nobody claimed for
    UNCLAIMED_PERIODS lease periods. The number failed."""
    now = now or timezone.now()
    lease_s = get_config().file_search.ingestion_lease_s
    lost = {"status": VectorStoreFile.Status.FAILED, "lease_owner": "", "lease_expires_at": None}
    running = VectorStoreFile.objects.filter(status=IN_PROGRESS).exclude(lease_owner="")
    failed = running.filter(lease_expires_at__lt=now).update(
        **lost, last_error=_error("server_error", WORKER_LOST)
    )
    local = (
        running.filter(lease_owner__startswith=f"{HOST}/").values_list("lease_owner", flat=True).distinct()
    )
    dead = [owner for owner in local if not owner_alive(owner)]
    if dead:
        failed += running.filter(lease_owner__in=dead).update(
            **lost, last_error=_error("server_error", WORKER_LOST)
        )
    unclaimed = VectorStoreFile.objects.filter(
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
        status=IN_PROGRESS,
        lease_owner="",
        created_at__lt=now - datetime.timedelta(seconds=lease_s),
    )
    given_up = now - datetime.timedelta(seconds=lease_s * UNCLAIMED_PERIODS)
    failed += unclaimed.filter(created_at__lt=given_up).update(
        **lost,
        last_error=_error(
            "server_error",
            f"No ingestion worker picked this file up within {lease_s * UNCLAIMED_PERIODS:g} s "
            "(with a broker, is a Celery worker consuming the tools queue?).",
        ),
    )
    again = list(unclaimed.values_list("pk", flat=True)[:1000])
    if again:
        # The mark (an unclaimed row's lease_expires_at) sends each one again once per lease period.
        VectorStoreFile.objects.filter(pk__in=again, lease_owner="").update(
            lease_expires_at=now + datetime.timedelta(seconds=lease_s)
        )
        log.warning("ingestion sweep: %d attachments nobody claimed are sent again", len(again))
        transaction.on_commit(lambda: schedule(again))
    if failed:
        log.warning("ingestion sweep: %d attachments whose ingestion stopped are stored failed", failed)
    return failed
