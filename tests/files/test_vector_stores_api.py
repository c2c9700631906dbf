"""Vector stores, their files and file batches through the official SDK on a live gateway.

Where a test holds ingestion back (``held_ingestion``), attachments are moved through their states
directly in the database, as ingestion would, to check that ``file_counts``, ``usage_bytes`` and
``status`` are read true at every moment; the last test runs the real in-process ingestion.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import httpx
import openai
import pytest
from django.utils import timezone

from files_app.models import Chunk, File, VectorStore, VectorStoreFile, VectorStoreFileBatch
from tests.servers import LiveServer

AUTO = {"type": "static", "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400}}


def upload(client: openai.OpenAI, name: str = "a.txt", data: bytes = b"some text") -> str:
    return client.files.create(file=(name, data), purpose="assistants").id


def set_status(file_id: str, status: str, usage_bytes: int = 0, **fields: Any) -> None:
    """What ingestion does when it finishes a file (in every store it is attached to)."""
    VectorStoreFile.objects.filter(file_id=file_id).update(status=status, usage_bytes=usage_bytes, **fields)


def test_store_crud(client: openai.OpenAI) -> None:
    created = client.vector_stores.create(
        name="docs",
        description="the manuals",
        metadata={"team": "search"},
        expires_after={"anchor": "last_active_at", "days": 7},
    )
    assert created.id.startswith("vs_")
    assert (created.object, created.name, created.status, created.usage_bytes) == (
        "vector_store",
        "docs",
        "completed",
        0,
    )
    assert created.file_counts.model_dump() == {
        "in_progress": 0,
        "completed": 0,
        "failed": 0,
        "cancelled": 0,
        "total": 0,
    }
    assert created.metadata == {"team": "search"}
    assert created.expires_after is not None and created.expires_after.days == 7
    assert created.expires_at == created.last_active_at + 7 * 86400  # type: ignore[operator]
    row = VectorStore.objects.get(id=created.id)
    assert (row.owner, row.description, row.embedding_model) == ("default", "the manuals", "")

    assert client.vector_stores.retrieve(created.id) == created
    updated = client.vector_stores.update(created.id, name="renamed", metadata={"v": "2"}, expires_after=None)
    assert (updated.name, updated.metadata, updated.expires_after, updated.expires_at) == (
        "renamed",
        {"v": "2"},
        None,
        None,
    )
    kept = client.vector_stores.update(created.id, name=None)
    assert (kept.name, kept.metadata) == ("renamed", {"v": "2"})  # only what is sent changes

    second = client.vector_stores.create()
    assert second.name == "" and second.metadata == {}
    listed = client.vector_stores.list()
    assert [s.id for s in listed.data] == [second.id, created.id]
    assert [s.id for s in client.vector_stores.list(order="asc", limit=1)] == [created.id, second.id]
    assert [s.id for s in client.vector_stores.list(before=created.id).data] == [second.id]
    assert [s.id for s in client.vector_stores.list(after=second.id).data] == [created.id]

    deleted = client.vector_stores.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "vector_store.deleted", True)
    with pytest.raises(openai.NotFoundError) as exc:
        client.vector_stores.retrieve(created.id)
    assert exc.value.body == {
        "message": f"No vector store found with id '{created.id}'.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_an_expired_store_says_so(client: openai.OpenAI) -> None:
    store = client.vector_stores.create(expires_after={"anchor": "last_active_at", "days": 1})
    VectorStore.objects.filter(id=store.id).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert client.vector_stores.retrieve(store.id).status == "expired"


def test_counts_usage_and_status_are_true_at_every_moment(
    client: openai.OpenAI, held_ingestion: list[int]
) -> None:
    a, b, c = (upload(client, f"{n}.txt") for n in "abc")
    store = client.vector_stores.create(name="s", file_ids=[a, b, c])
    assert store.status == "in_progress"
    assert store.file_counts.model_dump() == {
        "in_progress": 3,
        "completed": 0,
        "failed": 0,
        "cancelled": 0,
        "total": 3,
    }
    set_status(a, "completed", 100)
    set_status(b, "failed", last_error={"code": "unsupported_file", "message": "not text"})
    now = client.vector_stores.retrieve(store.id)
    assert (now.status, now.usage_bytes) == ("in_progress", 100)
    assert (now.file_counts.in_progress, now.file_counts.completed, now.file_counts.failed) == (1, 1, 1)
    set_status(c, "completed", 23)
    done = client.vector_stores.retrieve(store.id)
    assert (done.status, done.usage_bytes, done.file_counts.completed, done.file_counts.total) == (
        "completed",
        123,
        2,
        3,
    )
    assert [s.usage_bytes for s in client.vector_stores.list().data] == [123]
    failed = client.vector_stores.files.retrieve(b, vector_store_id=store.id)
    assert failed.status == "failed"
    assert failed.last_error is not None and failed.last_error.code == "unsupported_file"


def test_store_files_attach_list_update_content_and_detach(
    client: openai.OpenAI, held_ingestion: list[int]
) -> None:
    store = client.vector_stores.create(name="s")
    a, b, c = (upload(client, f"{n}.txt") for n in "abc")
    attached = client.vector_stores.files.create(
        vector_store_id=store.id,
        file_id=a,
        attributes={"author": "ann", "year": 2024, "draft": False, "score": 0.5},
        chunking_strategy={
            "type": "static",
            "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 100},
        },
    )
    assert (attached.id, attached.object, attached.vector_store_id, attached.status) == (
        a,
        "vector_store.file",
        store.id,
        "in_progress",
    )
    assert attached.attributes == {"author": "ann", "year": 2024, "draft": False, "score": 0.5}
    assert attached.chunking_strategy is not None
    assert attached.chunking_strategy.model_dump() == {
        "type": "static",
        "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 100},
    }
    auto = client.vector_stores.files.create(
        vector_store_id=store.id, file_id=b, chunking_strategy={"type": "auto"}
    )
    assert auto.chunking_strategy is not None and auto.chunking_strategy.model_dump() == AUTO
    assert auto.attributes == {}
    client.vector_stores.files.create(vector_store_id=store.id, file_id=c)

    # Attaching a file again answers its attachment as it is: nothing is attached twice.
    set_status(a, "completed", 9)
    again = client.vector_stores.files.create(vector_store_id=store.id, file_id=a, attributes={"x": "y"})
    assert (again.status, again.attributes["author"]) == ("completed", "ann")
    assert VectorStoreFile.objects.filter(vector_store_id=store.id).count() == 3

    listed = client.vector_stores.files.list(vector_store_id=store.id)
    assert [f.id for f in listed.data] == [c, b, a]
    assert [
        f.id for f in client.vector_stores.files.list(vector_store_id=store.id, filter="completed").data
    ] == [a]
    assert [
        f.id for f in client.vector_stores.files.list(vector_store_id=store.id, filter="in_progress").data
    ] == [
        c,
        b,
    ]
    page = client.vector_stores.files.list(vector_store_id=store.id, limit=1, order="asc")
    assert [f.id for f in page.data] == [a] and page.has_more
    assert [
        f.id for f in client.vector_stores.files.list(vector_store_id=store.id, limit=1, order="asc")
    ] == [a, b, c]
    assert [f.id for f in client.vector_stores.files.list(vector_store_id=store.id, before=b).data] == [c]
    with pytest.raises(openai.BadRequestError) as exc:
        client.vector_stores.files.list(vector_store_id=store.id, filter="done")  # type: ignore[arg-type]
    assert (exc.value.body["param"], exc.value.body["code"]) == ("filter", "invalid_value")

    revision = VectorStore.objects.get(id=store.id).revision
    updated = client.vector_stores.files.update(a, vector_store_id=store.id, attributes={"author": "bob"})
    assert updated.attributes == {"author": "bob"}
    assert VectorStore.objects.get(id=store.id).revision == revision + 1
    cleared = client.vector_stores.files.update(a, vector_store_id=store.id, attributes=None)
    assert cleared.attributes == {}

    attachment = VectorStoreFile.objects.get(vector_store_id=store.id, file_id=a)
    for position, text in enumerate(["first chunk", "second chunk"]):
        Chunk.objects.create(
            store_file=attachment, vector_store_id=store.id, file_id=a, position=position, text=text, tokens=2
        )
    content = client.vector_stores.files.content(a, vector_store_id=store.id)
    assert [(p.type, p.text) for p in content.data] == [("text", "first chunk"), ("text", "second chunk")]
    assert client.vector_stores.files.content(b, vector_store_id=store.id).data == []

    detached = client.vector_stores.files.delete(a, vector_store_id=store.id)
    assert (detached.id, detached.object, detached.deleted) == (a, "vector_store.file.deleted", True)
    assert Chunk.objects.filter(file_id=a).count() == 0
    assert client.files.retrieve(a).id == a  # the file stays
    with pytest.raises(openai.NotFoundError) as exc:
        client.vector_stores.files.retrieve(a, vector_store_id=store.id)
    assert exc.value.body["message"] == f"No file found with id '{a}' in vector store '{store.id}'."
    assert client.vector_stores.retrieve(store.id).file_counts.total == 2

    # Deleting the store keeps the files.
    client.vector_stores.delete(store.id)
    assert VectorStoreFile.objects.count() == 0
    assert {f.id for f in client.files.list()} == {a, b, c}


def test_file_batches_create_retrieve_list_and_cancel(
    client: openai.OpenAI, held_ingestion: list[int]
) -> None:
    store = client.vector_stores.create(name="s")
    ids = [upload(client, f"{i}.txt") for i in range(4)]
    batch = client.vector_stores.file_batches.create(
        vector_store_id=store.id, file_ids=ids[:3], attributes={"kind": "doc"}
    )
    assert batch.id.startswith("vsfb_")
    assert (batch.object, batch.vector_store_id, batch.status) == (
        "vector_store.files_batch",
        store.id,
        "in_progress",
    )
    assert batch.file_counts.model_dump() == {
        "in_progress": 3,
        "completed": 0,
        "failed": 0,
        "cancelled": 0,
        "total": 3,
    }
    assert {f.attributes["kind"] for f in client.vector_stores.files.list(vector_store_id=store.id)} == {
        "doc"
    }  # type: ignore[index]

    set_status(ids[0], "completed", 5)
    listed = client.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id)
    assert {f.id for f in listed.data} == set(ids[:3])
    done = client.vector_stores.file_batches.list_files(
        batch.id, vector_store_id=store.id, filter="completed"
    )
    assert [f.id for f in done.data] == [ids[0]]

    cancelled = client.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id)
    assert cancelled.status == "cancelled"
    assert cancelled.file_counts.model_dump() == {
        "in_progress": 0,
        "completed": 1,
        "failed": 0,
        "cancelled": 2,
        "total": 3,
    }
    assert client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id) == cancelled
    assert client.vector_stores.retrieve(store.id).status == "completed"
    assert client.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id) == cancelled

    # ``files``: each with its own attributes and chunking; a file already in the store stays outside.
    second = client.vector_stores.file_batches.create(
        vector_store_id=store.id,
        files=[
            {"file_id": ids[3], "attributes": {"n": 3}, "chunking_strategy": {"type": "auto"}},
            {"file_id": ids[0]},
        ],
    )
    assert second.file_counts.total == 1
    attached = client.vector_stores.files.retrieve(ids[3], vector_store_id=store.id)
    assert (attached.attributes, attached.chunking_strategy.model_dump()) == ({"n": 3}, AUTO)  # type: ignore[union-attr]
    set_status(ids[3], "failed")
    failed = client.vector_stores.file_batches.retrieve(second.id, vector_store_id=store.id)
    assert failed.status == "failed"
    with pytest.raises(openai.BadRequestError) as exc:
        client.vector_stores.file_batches.cancel(second.id, vector_store_id=store.id)
    assert exc.value.body["code"] == "invalid_state"

    with pytest.raises(openai.NotFoundError) as exc:
        client.vector_stores.file_batches.retrieve("vsfb_nope", vector_store_id=store.id)
    assert (
        exc.value.body["message"] == f"No file batch found with id 'vsfb_nope' in vector store '{store.id}'."
    )


def _refused(call: Any, status: int, param: str | None, code: str | None = None) -> dict[str, Any]:
    with pytest.raises(openai.APIStatusError) as exc:
        call()
    assert exc.value.status_code == status, exc.value.body
    body: dict[str, Any] = exc.value.body  # type: ignore[assignment]
    assert body["param"] == param, body
    if code is not None:
        assert body["code"] == code, body
    return body


def test_every_refusal_names_its_param_and_stores_nothing(client: openai.OpenAI, gateway_config: Any) -> None:
    mine = upload(client)
    store = client.vector_stores.create(name="s")
    vs = client.vector_stores
    static = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 51}}
    cases: list[tuple[Any, int, str | None, str | None]] = [
        (lambda: vs.create(file_ids=[mine, "file-nope"]), 404, "file_ids[1]", None),
        (lambda: vs.create(file_ids=[mine, mine]), 400, "file_ids[1]", "duplicate_file_id"),
        (lambda: vs.create(file_ids=[7]), 400, "file_ids[0]", "invalid_type"),  # type: ignore[list-item]
        (
            lambda: vs.create(metadata={str(i): "v" for i in range(17)}),
            400,
            "metadata",
            "object_above_max_properties",
        ),
        (lambda: vs.create(metadata={"k": "v" * 513}), 400, "metadata.k", "string_above_max_length"),
        (
            lambda: vs.create(metadata={"k" * 65: "v"}),
            400,
            "metadata." + "k" * 65,
            "property_name_above_max_length",
        ),
        (lambda: vs.create(metadata={"k": 1}), 400, "metadata.k", "invalid_type"),  # type: ignore[dict-item]
        (
            lambda: vs.create(expires_after={"anchor": "created_at", "days": 1}),  # type: ignore[typeddict-item]
            400,
            "expires_after.anchor",
            "invalid_value",
        ),
        (
            lambda: vs.create(expires_after={"anchor": "last_active_at", "days": 366}),
            400,
            "expires_after.days",
            "integer_above_max_value",
        ),
        (
            lambda: vs.create(file_ids=[mine], chunking_strategy=static),  # type: ignore[arg-type]
            400,
            "chunking_strategy.static.chunk_overlap_tokens",
            "integer_above_max_value",
        ),
        (
            lambda: vs.create(
                chunking_strategy={
                    "type": "static",
                    "static": {"max_chunk_size_tokens": 99, "chunk_overlap_tokens": 0},
                }
            ),
            400,
            "chunking_strategy.static.max_chunk_size_tokens",
            "integer_below_min_value",
        ),
        (
            lambda: vs.create(chunking_strategy={"type": "semantic"}),
            400,
            "chunking_strategy.type",
            "invalid_value",
        ),  # type: ignore[arg-type,typeddict-item]
        (lambda: vs.create(extra_body={"colour": "red"}), 400, "colour", "unknown_parameter"),
        (lambda: vs.create(name=5), 400, "name", "invalid_type"),  # type: ignore[arg-type]
        (lambda: vs.update(store.id, metadata=[]), 400, "metadata", "invalid_type"),  # type: ignore[arg-type]
        (lambda: vs.files.create(vector_store_id=store.id, file_id="file-nope"), 404, "file_id", None),
        (
            lambda: vs.files.create(vector_store_id=store.id, file_id=mine, extra_body={"x": 1}),
            400,
            "x",
            None,
        ),
        (
            lambda: vs.files.create(vector_store_id=store.id, file_id=mine, attributes={"a": [1]}),  # type: ignore[dict-item]
            400,
            "attributes.a",
            "invalid_type",
        ),
        (
            lambda: vs.files.create(
                vector_store_id=store.id, file_id=mine, attributes={str(i): i for i in range(17)}
            ),
            400,
            "attributes",
            "object_above_max_properties",
        ),
        (
            lambda: vs.files.create(vector_store_id=store.id, file_id=mine, attributes={"a": "x" * 513}),
            400,
            "attributes.a",
            "string_above_max_length",
        ),
        (lambda: vs.files.create(vector_store_id="vs_nope", file_id=mine), 404, None, None),
        (
            lambda: vs.file_batches.create(vector_store_id=store.id, file_ids=[]),
            400,
            "file_ids",
            "empty_array",
        ),
        (
            lambda: vs.file_batches.create(vector_store_id=store.id, file_ids=[mine, "file-x"]),
            404,
            "file_ids[1]",
            None,
        ),
        (
            lambda: vs.file_batches.create(
                vector_store_id=store.id, files=[{"file_id": mine}, {"file_id": "file-x"}]
            ),
            404,
            "files[1].file_id",
            None,
        ),
        (
            lambda: vs.file_batches.create(
                vector_store_id=store.id, files=[{"file_id": mine}, {"file_id": mine}]
            ),
            400,
            "files[1].file_id",
            "duplicate_file_id",
        ),
        (
            lambda: vs.file_batches.create(vector_store_id=store.id, files=[{"attributes": {}}]),  # type: ignore[typeddict-item]
            400,
            "files[0].file_id",
            "missing_required_parameter",
        ),
        (
            lambda: vs.file_batches.create(
                vector_store_id=store.id, file_ids=[mine], files=[{"file_id": mine}]
            ),
            400,
            "files",
            None,
        ),
        (
            lambda: vs.file_batches.create(
                vector_store_id=store.id, files=[{"file_id": mine}], attributes={"a": "b"}
            ),
            400,
            "attributes",
            None,
        ),
        (
            lambda: vs.file_batches.create(vector_store_id=store.id),
            400,
            "file_ids",
            "missing_required_parameter",
        ),
        (lambda: vs.files.list(vector_store_id=store.id, after="file-nope"), 404, "after", None),
        (lambda: vs.list(limit=101), 400, "limit", None),
        (lambda: vs.list(extra_query={"filter": "completed"}), 400, "filter", "unknown_parameter"),
    ]
    for call, status, param, code in cases:
        _refused(call, status, param, code)
    assert VectorStore.objects.count() == 1
    assert VectorStoreFile.objects.count() == 0
    assert VectorStoreFileBatch.objects.count() == 0

    # A store built in another embedding space takes no new files (one or a batch), before any work.
    VectorStore.objects.filter(id=store.id).update(embedding_model="old-embedder", embedding_dimensions=8)
    body = _refused(
        lambda: vs.files.create(vector_store_id=store.id, file_id=mine),
        400,
        "vector_store_id",
        "embedding_model_mismatch",
    )
    assert store.id in body["message"] and "old-embedder" in body["message"]
    _refused(
        lambda: vs.file_batches.create(vector_store_id=store.id, file_ids=[mine]), 400, "vector_store_id"
    )
    gateway_config(file_search__embedding_model="old-embedder")
    assert vs.files.create(vector_store_id=store.id, file_id=mine).status == "in_progress"
    assert VectorStoreFileBatch.objects.count() == 0


def test_a_new_store_records_the_configured_embedding_model(
    client: openai.OpenAI, gateway_config: Any
) -> None:
    gateway_config(file_search__embedding_model="e5-small")
    store = client.vector_stores.create(name="s")
    assert VectorStore.objects.get(id=store.id).embedding_model == "e5-small"


def test_json_routes_answer_json_errors(live_gateway: LiveServer) -> None:
    answer = httpx.post(
        f"{live_gateway.url}/v1/vector_stores", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_json")
    answer = httpx.put(f"{live_gateway.url}/v1/vector_stores")
    assert answer.status_code == 405


def test_attached_files_reach_completed_with_chunks(client: openai.OpenAI) -> None:
    """Needs ``files_app.ingest`` (in process without a broker): files attached at a store's creation,
    one by one and in a batch are all ingested, and their chunks are the content the API shows."""
    text = ("The gateway stores files and searches them. " * 200).encode()
    first, second, third = (upload(client, f"doc{n}.txt", text) for n in range(3))
    store = client.vector_stores.create(name="s", file_ids=[first])
    client.vector_stores.files.create(vector_store_id=store.id, file_id=second)
    batch = client.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=[third])
    deadline = time.monotonic() + 60
    while client.vector_stores.retrieve(store.id).status != "completed" and time.monotonic() < deadline:
        time.sleep(0.1)
    done = client.vector_stores.retrieve(store.id)
    assert done.status == "completed", done
    assert done.file_counts.completed == 3 and done.usage_bytes > 0
    assert (
        client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id).status == "completed"
    )
    for file_id in (first, second, third):
        content = client.vector_stores.files.content(file_id, vector_store_id=store.id)
        assert content.data and "gateway stores files" in (content.data[0].text or "")
        assert Chunk.objects.filter(file_id=file_id).count() == len(content.data)
    assert File.objects.count() == 3
