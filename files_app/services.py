"""Every write to files, vector stores and their attachments, one transaction each.

A file's bytes are in storage before its row is committed, and leave storage only after its row's
deletion is committed. Attaching files commits ``in_progress`` attachments, then schedules their
ingestion (``files_app.ingest.schedule``) on commit. Every change of a store's searchable content
(a completed file detached or deleted, attributes changed) bumps the store's ``revision``.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.core.files.storage import Storage, storages
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from files_app import selectors
from files_app.models import File, VectorStore, VectorStoreFile, VectorStoreFileBatch
from files_app.schemas import NewAttachment
from gateway.core import errors
from gateway.core.config import get_config
from gateway.core.ids import new_id

logger = logging.getLogger("gateway.files")

FILENAME_MAX_LENGTH = 1024


def file_storage() -> Storage:
    """Django's ``"files"`` storage (``[files]``: a local directory, or any django-storages backend)."""
    return storages["files"]


def new_file_id() -> str:
    """OpenAI's file ids are ``file-…`` (a dash, unlike the other kinds)."""
    return "file-" + new_id("file").removeprefix("file_")


# -------------------------------------------------------------------------------------------- files
def file_create(
    *, owner: str, upload: UploadedFile, purpose: str, expires_after_s: int | None = None
) -> File:
    """Store the uploaded bytes, then commit the row; if the row fails the bytes are removed again."""
    filename = upload.name or "file"
    errors.refuse_too_long(filename, "file", FILENAME_MAX_LENGTH)
    file_id = new_file_id()
    storage = file_storage()
    stored_name = storage.save(file_id, upload)
    try:
        now = timezone.now()
        with transaction.atomic():
            return File.objects.create(
                id=file_id,
                owner=owner,
                filename=filename,
                purpose=purpose,
                bytes=upload.size or 0,
                content_type=(upload.content_type or "")[:255],
                storage_name=stored_name,
                created_at=now,
                expires_at=now + dt.timedelta(seconds=expires_after_s) if expires_after_s else None,
            )
    except BaseException:
        _delete_bytes(stored_name)
        raise


def _delete_bytes(name: str) -> None:
    try:
        file_storage().delete(name)
    except Exception:
        # The row is gone; orphaned bytes are harmless and logged for an operator to remove.
        logger.exception("could not delete stored bytes %r", name)


def file_delete(*, id: str, owner: str) -> None:
    """Delete the file, its attachments and chunks in every store (the cascade), then its bytes."""
    with transaction.atomic():
        found = selectors.file_get(id=id, owner=owner)
        file_remove(found)


def file_remove(found: File) -> None:
    """Delete one file row (inside the caller's transaction) and its bytes once that commits; the
    stores that had it searchable get a new revision. Used by the API and the admin."""
    searchable = list(
        VectorStoreFile.objects.filter(file=found, status=VectorStoreFile.Status.COMPLETED).values_list(
            "vector_store_id", flat=True
        )
    )
    name = found.storage_name
    found.delete()
    _bump(searchable)
    transaction.on_commit(lambda: _delete_bytes(name))


def files_expired_delete(*, limit: int = 500) -> int:
    """Delete up to ``limit`` files whose ``expires_after`` passed, as ``file_delete`` would (their
    attachments, chunks and bytes); the number deleted. The API already answers them 404; a periodic
    sweep calls this so that they stop being searched and their bytes leave the storage."""
    deleted = 0
    with transaction.atomic():
        expired = File.objects.filter(expires_at__lte=timezone.now()).order_by("expires_at")[:limit]
        for found in File.objects.select_for_update(skip_locked=True).filter(
            pk__in=list(expired.values_list("pk", flat=True))
        ):
            file_remove(found)
            deleted += 1
    return deleted


def _bump(store_ids: list[str]) -> None:
    if store_ids:
        VectorStore.objects.filter(id__in=store_ids).update(revision=F("revision") + 1)


# ------------------------------------------------------------------------------------ vector stores
def _expiry(store: VectorStore) -> dt.datetime | None:
    policy = store.expires_after
    if not policy:
        return None
    return store.last_active_at + dt.timedelta(days=int(policy["days"]))


def vector_store_touch(store: VectorStore) -> None:
    """Mark the store active now (its ``expires_at`` moves along with ``last_active_at``)."""
    store.last_active_at = timezone.now()
    store.expires_at = _expiry(store)
    VectorStore.objects.filter(pk=store.pk).update(
        last_active_at=store.last_active_at, expires_at=store.expires_at
    )


@transaction.atomic
def vector_store_create(
    *,
    owner: str,
    name: str,
    description: str,
    file_ids: list[str],
    metadata: dict[str, str],
    expires_after: dict[str, Any] | None,
    chunking_strategy: dict[str, Any],
) -> VectorStore:
    """A new store in the configured embedding space, with its first files attached."""
    found = selectors.files_get(ids=[(f, f"file_ids[{i}]") for i, f in enumerate(file_ids)], owner=owner)
    now = timezone.now()
    store = VectorStore(
        id=new_id("vs"),
        owner=owner,
        name=name,
        description=description,
        metadata=metadata,
        created_at=now,
        last_active_at=now,
        expires_after=expires_after,
        embedding_model=get_config().file_search.embedding_model,
    )
    store.expires_at = _expiry(store)
    store.save(force_insert=True)
    _attach_new(
        store=store,
        attachments=[
            NewAttachment(file_id=f, param="", attributes={}, chunking=chunking_strategy) for f in file_ids
        ],
        files=found,
        batch=None,
    )
    return store


@transaction.atomic
def vector_store_update(*, id: str, owner: str, changes: dict[str, Any]) -> VectorStore:
    store = _locked_store(id=id, owner=owner)
    for field, value in changes.items():
        setattr(store, field, value)
    store.last_active_at = timezone.now()
    store.expires_at = _expiry(store)
    store.save()
    return store


@transaction.atomic
def vector_store_delete(*, id: str, owner: str) -> None:
    """Delete the store, its attachments, batches and chunks; the files stay."""
    _locked_store(id=id, owner=owner).delete()


def _locked_store(*, id: str, owner: str) -> VectorStore:
    selectors.vector_store_get(id=id, owner=owner)  # the 404, before taking a lock
    return VectorStore.objects.select_for_update().get(id=id)


def check_embedding_space(store: VectorStore) -> None:
    """A file joins a store only in the store's embedding space (the configured model now)."""
    configured = get_config().file_search.embedding_model
    if store.embedding_model != configured:
        built = (
            f"embedding model '{store.embedding_model}'" if store.embedding_model else "no embedding model"
        )
        now = f"'{configured}'" if configured else "none (keyword search only)"
        raise errors.BadRequest(
            f"Vector store '{store.id}' was built with {built}, but the configured embedding model is "
            f"{now}; its chunks could not be searched together. Attach the file to a new vector store.",
            param="vector_store_id",
            code="embedding_model_mismatch",
        )


# ------------------------------------------------------------------------------------------ attaching
def _schedule(pks: list[int]) -> None:
    """Start ingesting the committed attachments (``files_app.ingest``, imported when first needed)."""
    if not pks:
        return
    from files_app import ingest

    ingest.schedule(pks)


def _attach_new(
    *,
    store: VectorStore,
    attachments: list[NewAttachment],
    files: dict[str, File],
    batch: VectorStoreFileBatch | None,
) -> list[int]:
    """Create the attachments not in the store yet (one already there keeps its own state and is
    not part of ``batch``); their ingestion starts once the caller's transaction commits."""
    if not attachments:
        return []
    VectorStoreFile.objects.bulk_create(
        [
            VectorStoreFile(
                vector_store=store,
                file=files[new.file_id],
                batch=batch,
                attributes=new.attributes,
                chunking_strategy=new.chunking,
            )
            for new in attachments
        ],
        ignore_conflicts=True,
    )
    # A batch's rows are the ones just created; without a batch, the store is new: all of its rows.
    created = VectorStoreFile.objects.filter(vector_store=store, batch=batch)
    pks = list(created.values_list("pk", flat=True))
    transaction.on_commit(lambda: _schedule(pks), robust=True)
    return pks


@transaction.atomic
def store_file_create(*, vector_store_id: str, owner: str, attachment: NewAttachment) -> VectorStoreFile:
    """Attach one file. A file already in the store answers its attachment as it is (a retried
    request attaches nothing twice); ``attributes`` are changed with the update endpoint."""
    store = _locked_store(id=vector_store_id, owner=owner)
    found = selectors.file_get(id=attachment.file_id, owner=owner, param=attachment.param)
    check_embedding_space(store)
    try:
        with transaction.atomic():  # a savepoint: the unique (store, file) index decides
            row = VectorStoreFile.objects.create(
                vector_store=store,
                file=found,
                attributes=attachment.attributes,
                chunking_strategy=attachment.chunking,
            )
    except IntegrityError:  # already attached (earlier, or by a concurrent request)
        return VectorStoreFile.objects.get(vector_store=store, file=found)
    vector_store_touch(store)
    pk = row.pk
    transaction.on_commit(lambda: _schedule([pk]), robust=True)
    return row


@transaction.atomic
def store_file_update(
    *, vector_store_id: str, owner: str, file_id: str, attributes: dict[str, Any]
) -> VectorStoreFile:
    store = _locked_store(id=vector_store_id, owner=owner)
    row = selectors.store_file_get(store=store, file_id=file_id)
    row.attributes = attributes
    row.save(update_fields=["attributes"])
    _bump([store.id])
    return row


@transaction.atomic
def store_file_delete(*, vector_store_id: str, owner: str, file_id: str) -> None:
    """Detach the file (its chunks in this store go with it); the file itself stays."""
    store = _locked_store(id=vector_store_id, owner=owner)
    row = selectors.store_file_get(store=store, file_id=file_id)
    searchable = row.status == VectorStoreFile.Status.COMPLETED
    row.delete()
    if searchable:
        _bump([store.id])


@transaction.atomic
def batch_create(
    *, vector_store_id: str, owner: str, attachments: list[NewAttachment]
) -> VectorStoreFileBatch:
    """A batch of attachments. A file already in the store stays as it is and outside the batch."""
    store = _locked_store(id=vector_store_id, owner=owner)
    found = selectors.files_get(ids=[(a.file_id, a.param) for a in attachments], owner=owner)
    check_embedding_space(store)
    batch = VectorStoreFileBatch.objects.create(id=new_id("vsfb"), vector_store=store)
    _attach_new(store=store, attachments=attachments, files=found, batch=batch)
    vector_store_touch(store)
    return batch


@transaction.atomic
def batch_cancel(*, vector_store_id: str, owner: str, batch_id: str) -> VectorStoreFileBatch:
    """Cancel the batch's files still in progress (an ingestion publishes only an ``in_progress``
    attachment, so a cancelled one stays without chunks). A finished batch cannot be cancelled."""
    store = _locked_store(id=vector_store_id, owner=owner)
    batch = selectors.batch_get(store=store, batch_id=batch_id)
    if batch.cancelled:
        return batch
    counts = selectors.batch_counts([batch.id])[batch.id]
    status = selectors.batch_status(batch, counts)
    if status != "in_progress":
        raise errors.BadRequest(
            f"Cannot cancel file batch '{batch.id}': it is already {status}.",
            param="batch_id",
            code="invalid_state",
        )
    VectorStoreFile.objects.filter(batch=batch, status=VectorStoreFile.Status.IN_PROGRESS).update(
        status=VectorStoreFile.Status.CANCELLED, lease_owner="", lease_expires_at=None
    )
    batch.cancelled = True
    batch.save(update_fields=["cancelled"])
    return batch
