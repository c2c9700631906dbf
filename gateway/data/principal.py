"""Everything stored for one principal: exported as JSON lines, or deleted (docs/operations.md,
"A principal's data").

A principal is named by its owner key, as stored on every row: ``default`` (the open gateway's one
principal), ``oidc:<issuer>#<subject>``, ``key:<api key id>``. Every table is filtered by that exact
owner, so nothing of another principal is read or touched; items are owned per principal too (an id
another owner stored is refused, never shared), so a principal's items go with it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator
from typing import IO, Any

import orjson
from django.db import models, transaction

from conversations_app.models import Conversation, ConversationItem, Item
from files_app import services as file_services
from files_app.models import File, VectorStore, VectorStoreFile, VectorStoreFileBatch
from gateway.core import errors
from gateway.data.retention import delete_pks, forget_checkpoints
from responses_app.models import Response, ResponseEvent
from responses_app.storage import rawsql
from usage_app.models import QuotaState, UsageRecord

_SUBJECT = re.compile(r"default|oidc:.+#.+|key:[0-9]+")
_BATCH = 500


class SubjectError(ValueError):
    pass


def check_subject(subject: str) -> str:
    """``subject`` if it is an owner key (``default``, ``oidc:<iss>#<sub>``, ``key:<id>``)."""
    if not _SUBJECT.fullmatch(subject):
        raise SubjectError(
            f"{subject!r} is not an owner key: expected 'default', 'oidc:<issuer>#<subject>' or 'key:<id>'"
        )
    return subject


# --- export --------------------------------------------------------------------------------------


def _by_pk(queryset: models.QuerySet[Any]) -> Iterator[list[dict[str, Any]]]:
    """``queryset``'s rows as dictionaries, in batches walked by primary key (keyset: each batch
    one short read, whatever the table's size)."""
    last: Any = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        rows = list(page.values()[:_BATCH])
        if not rows:
            return
        yield rows
        last = rows[-1][queryset.model._meta.pk.attname]


def _line(kind: str, row: dict[str, Any]) -> bytes:
    if isinstance(row.get("embedding"), (bytes, memoryview)):
        row["embedding"] = None
    return (
        orjson.dumps({"type": kind, "data": row}, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z) + b"\n"
    )


def export(owner: str, out: IO[bytes]) -> dict[str, int]:
    """Write every row stored for ``owner`` as one JSON line ``{"type": …, "data": {column: value}}``;
    returns the count per type. File bytes and search chunks are not included (the file rows are)."""
    check_subject(owner)
    counts: dict[str, int] = {}

    def write(kind: str, rows: Iterable[Any]) -> None:
        for row in rows:
            out.write(_line(kind, row))
            counts[kind] = counts.get(kind, 0) + 1

    for rows in _by_pk(Response.objects.filter(owner=owner)):
        write("response", rows)
        events = ResponseEvent.objects.filter(response_id__in=[r["id"] for r in rows])
        write("response_event", events.order_by("response_id", "sequence_number").values())
    for rows in _by_pk(Conversation.objects.filter(owner=owner)):
        write("conversation", rows)
        entries = ConversationItem.objects.filter(conversation_id__in=[r["id"] for r in rows])
        write("conversation_item", entries.order_by("conversation_id", "position").values())
    for rows in _by_pk(Item.objects.filter(owner=owner)):
        write("item", rows)
    for rows in _by_pk(File.objects.filter(owner=owner)):
        write("file", rows)
    for rows in _by_pk(VectorStore.objects.filter(owner=owner)):
        write("vector_store", rows)
        ids = [r["id"] for r in rows]
        write(
            "vector_store_file_batch",
            list(VectorStoreFileBatch.objects.filter(vector_store_id__in=ids).values()),
        )
        write("vector_store_file", VectorStoreFile.objects.filter(vector_store_id__in=ids).values())
    for rows in _by_pk(UsageRecord.objects.filter(owner=owner)):
        write("usage_record", rows)
    for rows in _by_pk(QuotaState.objects.filter(owner=owner)):
        write("quota_state", rows)
    return counts


# --- delete --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Deleted:
    responses: int = 0
    conversations: int = 0
    items: int = 0
    files: int = 0
    vector_stores: int = 0
    usage: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def _pks(queryset: models.QuerySet[Any], after: Any) -> list[Any]:
    page = queryset.order_by("pk")
    if after is not None:
        page = page.filter(pk__gt=after)
    return list(page.values_list("pk", flat=True)[:_BATCH])


def delete(owner: str) -> Deleted:
    """Delete every row stored for ``owner``, in short transactions of at most a few hundred rows
    (uploaded bytes once their row's deletion commits). The API keys themselves stay (the admin
    revokes or deletes them)."""
    check_subject(owner)
    done = Deleted()
    last: Any = None
    while ids := _pks(Response.objects.filter(owner=owner), last):
        last = ids[-1]
        with rawsql.writing():
            ResponseEvent.objects.filter(response_id__in=ids).delete()
            Response.objects.filter(previous_response_id__in=ids).update(previous_response=None)
            done.responses += delete_pks(Response, ids)
            transaction.on_commit(functools.partial(forget_checkpoints, ids))
    last = None
    while ids := _pks(Conversation.objects.filter(owner=owner), last):
        last = ids[-1]
        with rawsql.writing():
            ConversationItem.objects.filter(conversation_id__in=ids).delete()
            done.conversations += delete_pks(Conversation, ids)
    last = None
    while ids := _pks(Item.objects.filter(owner=owner), last):
        last = ids[-1]
        with rawsql.writing():
            # Only this owner's conversations list its items (the conversations above are gone).
            ConversationItem.objects.filter(item_id__in=ids).delete()
            done.items += delete_pks(Item, ids)
    for store_id in list(VectorStore.objects.filter(owner=owner).values_list("pk", flat=True)):
        with rawsql.writing():
            try:
                file_services.vector_store_delete(id=store_id, owner=owner)
            except errors.NotFound:
                continue  # deleted meanwhile
            done.vector_stores += 1
    for file_id in list(File.objects.filter(owner=owner).values_list("pk", flat=True)):
        with rawsql.writing():
            found = File.objects.select_for_update().filter(pk=file_id, owner=owner).first()
            if found is not None:
                file_services.file_remove(found)
                done.files += 1
    last = None
    while ids := _pks(UsageRecord.objects.filter(owner=owner), last):
        last = ids[-1]
        with rawsql.writing():
            done.usage += delete_pks(UsageRecord, ids)
    QuotaState.objects.filter(owner=owner).delete()
    return done
