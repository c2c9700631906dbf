"""Every read of files, vector stores, their attachments and batches. Each filters by owner: another
owner's id is answered exactly like an unknown one (404).

``file_counts``, ``usage_bytes`` and a store's or batch's ``status`` are read from the
``VectorStoreFile`` rows at the moment of the answer (one grouped query), never kept as counters.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from files_app.models import Chunk, File, VectorStore, VectorStoreFile, VectorStoreFileBatch
from files_app.schemas import MAX_ID_LENGTH, STORE_FILE_STATUSES
from gateway.core import errors

M = TypeVar("M", File, VectorStore, VectorStoreFile)


class NotFound(errors.NotFound):
    """OpenAI answers unknown files, stores and batches with ``code: null``."""

    code = None  # type: ignore[assignment]


def file_not_found(file_id: str, *, param: str | None = None) -> NotFound:
    return NotFound(f"No file found with id '{file_id}'.", param=param)


def vector_store_not_found(vector_store_id: str) -> NotFound:
    return NotFound(f"No vector store found with id '{vector_store_id}'.")


def store_file_not_found(file_id: str, vector_store_id: str) -> NotFound:
    return NotFound(f"No file found with id '{file_id}' in vector store '{vector_store_id}'.")


def batch_not_found(batch_id: str, vector_store_id: str) -> NotFound:
    return NotFound(f"No file batch found with id '{batch_id}' in vector store '{vector_store_id}'.")


def _plausible(value: str) -> bool:
    """An id we could have minted: anything else is answered as unknown without a query."""
    return 0 < len(value) <= MAX_ID_LENGTH and "\x00" not in value


# -------------------------------------------------------------------------------------------- files
def live_files(owner: str) -> QuerySet[File]:
    """The owner's files; an expired one (``expires_after``) is gone as far as the API can tell."""
    now = timezone.now()
    return File.objects.filter(owner=owner).filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))


def file_get(*, id: str, owner: str, param: str | None = None) -> File:
    found = live_files(owner).filter(id=id).first() if _plausible(id) else None
    if found is None:
        raise file_not_found(id, param=param)
    return found


def files_get(*, ids: list[tuple[str, str]], owner: str) -> dict[str, File]:
    """The owner's files for (id, param) pairs, one query; the first unknown one is a 404 naming its param."""
    plausible = [file_id for file_id, _ in ids if _plausible(file_id)]
    found = {f.id: f for f in live_files(owner).filter(id__in=plausible)}
    for file_id, param in ids:
        if file_id not in found:
            raise file_not_found(file_id, param=param)
    return found


# --------------------------------------------------------------------------------------- pagination
@dataclass(frozen=True)
class Page(Generic[M]):
    rows: list[M]
    has_more: bool


def keyset_page(
    rows: QuerySet[M],
    *,
    key: str,
    anchor_after: M | None,
    anchor_before: M | None,
    limit: int,
    order: str,
) -> Page[M]:
    """One page by (``created_at``, ``key``), after or before an anchor row: no OFFSET, no count."""
    forward = ("created_at", key) if order == "asc" else ("-created_at", "-" + key)
    backward = tuple(f[1:] if f.startswith("-") else "-" + f for f in forward)
    newer, older = "gt", "lt"
    if anchor_after is not None:
        rows = rows.filter(_beyond(anchor_after, key, newer if order == "asc" else older))
    if anchor_before is not None:
        rows = rows.filter(_beyond(anchor_before, key, older if order == "asc" else newer))
        found = list(rows.order_by(*backward)[: limit + 1])
        return Page(rows=list(reversed(found[:limit])), has_more=len(found) > limit)
    found = list(rows.order_by(*forward)[: limit + 1])
    return Page(rows=found[:limit], has_more=len(found) > limit)


def _beyond(anchor: Any, key: str, op: str) -> Q:
    created: dt.datetime = anchor.created_at
    value = getattr(anchor, key)
    return Q(**{f"created_at__{op}": created}) | Q(created_at=created, **{f"{key}__{op}": value})


def _anchor(rows: QuerySet[M], lookup: dict[str, Any], value: str | None, param: str) -> M | None:
    if value is None:
        return None
    found = rows.filter(**lookup).first() if _plausible(value) else None
    if found is None:
        raise NotFound(f"No object found with id '{value}'.", param=param)
    return found


def file_list(*, owner: str, purpose: str | None, after: str | None, limit: int, order: str) -> Page[File]:
    rows = live_files(owner)
    if purpose is not None:
        rows = rows.filter(purpose=purpose)
    anchor = _anchor(live_files(owner), {"id": after}, after, "after")
    return keyset_page(rows, key="id", anchor_after=anchor, anchor_before=None, limit=limit, order=order)


# ------------------------------------------------------------------------------------ vector stores
def vector_store_get(*, id: str, owner: str) -> VectorStore:
    found = VectorStore.objects.filter(id=id, owner=owner).first() if _plausible(id) else None
    if found is None:
        raise vector_store_not_found(id)
    return found


def vector_store_list(
    *, owner: str, after: str | None, before: str | None, limit: int, order: str
) -> Page[VectorStore]:
    rows = VectorStore.objects.filter(owner=owner)
    return keyset_page(
        rows,
        key="id",
        anchor_after=_anchor(rows, {"id": after}, after, "after"),
        anchor_before=_anchor(rows, {"id": before}, before, "before"),
        limit=limit,
        order=order,
    )


@dataclass(frozen=True)
class Counts:
    """``file_counts`` and ``usage_bytes`` of a store (or a batch), read from its attachments."""

    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    usage_bytes: int = 0

    @property
    def total(self) -> int:
        return self.in_progress + self.completed + self.failed + self.cancelled

    def file_counts(self) -> dict[str, int]:
        return {
            "in_progress": self.in_progress,
            "completed": self.completed,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "total": self.total,
        }


def _counts(rows: QuerySet[VectorStoreFile], group: str) -> dict[str, Counts]:
    """Counts per ``group`` value (the store's or the batch's id), one grouped query."""
    tallies: dict[str, dict[str, int]] = {}
    for row in rows.values(group, "status").annotate(n=Count("id"), used=Sum("usage_bytes")).order_by():
        tally = tallies.setdefault(row[group], {"usage_bytes": 0})
        if row["status"] in STORE_FILE_STATUSES:
            tally[row["status"]] = row["n"]
        tally["usage_bytes"] += row["used"] or 0
    return {key: Counts(**tally) for key, tally in tallies.items()}


def store_counts(store_ids: list[str]) -> dict[str, Counts]:
    counts = _counts(VectorStoreFile.objects.filter(vector_store_id__in=store_ids), "vector_store_id")
    return {store_id: counts.get(store_id, Counts()) for store_id in store_ids}


def batch_counts(batch_ids: list[str]) -> dict[str, Counts]:
    counts = _counts(VectorStoreFile.objects.filter(batch_id__in=batch_ids), "batch_id")
    return {batch_id: counts.get(batch_id, Counts()) for batch_id in batch_ids}


def store_status(store: VectorStore, counts: Counts) -> str:
    if store.expires_at is not None and store.expires_at <= timezone.now():
        return "expired"
    return "in_progress" if counts.in_progress else "completed"


def batch_status(batch: VectorStoreFileBatch, counts: Counts) -> str:
    """``cancelled`` once cancelled; ``in_progress`` while a file is; ``failed`` when every file
    failed; ``completed`` otherwise (some files may have failed: see ``file_counts``)."""
    if batch.cancelled:
        return "cancelled"
    if counts.in_progress:
        return "in_progress"
    if counts.total and counts.failed == counts.total:
        return "failed"
    return "completed"


# ------------------------------------------------------------------------------ store files, batches
def store_file_get(*, store: VectorStore, file_id: str) -> VectorStoreFile:
    found = (
        VectorStoreFile.objects.filter(vector_store=store, file_id=file_id).first()
        if _plausible(file_id)
        else None
    )
    if found is None:
        raise store_file_not_found(file_id, store.id)
    return found


def store_file_list(
    *,
    store: VectorStore,
    batch: VectorStoreFileBatch | None = None,
    status: str | None,
    after: str | None,
    before: str | None,
    limit: int,
    order: str,
) -> Page[VectorStoreFile]:
    every = VectorStoreFile.objects.filter(vector_store=store)
    if batch is not None:
        every = every.filter(batch=batch)
    rows = every if status is None else every.filter(status=status)
    return keyset_page(
        rows,
        key="file_id",
        anchor_after=_anchor(every, {"file_id": after}, after, "after"),
        anchor_before=_anchor(every, {"file_id": before}, before, "before"),
        limit=limit,
        order=order,
    )


def batch_get(*, store: VectorStore, batch_id: str) -> VectorStoreFileBatch:
    found = (
        VectorStoreFileBatch.objects.filter(vector_store=store, id=batch_id).first()
        if _plausible(batch_id)
        else None
    )
    if found is None:
        raise batch_not_found(batch_id, store.id)
    return found


def store_file_chunks(store_file: VectorStoreFile) -> list[str]:
    """The texts of a store file's published chunks, in order."""
    return list(
        Chunk.objects.filter(store_file=store_file).order_by("position").values_list("text", flat=True)
    )
