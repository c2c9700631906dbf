"""The Files API through the official SDK on a live gateway: upload, list, retrieve, download, delete,
the upload ceiling (``[files] max_upload_bytes``) and every refusal, each storing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from files_app import services
from files_app.models import Chunk, File, VectorStore, VectorStoreFile
from responses_app.tasks import sweep_once
from tests.files.conftest import stored_names
from tests.servers import LiveServer, raw_http


def test_upload_retrieve_download_list_and_delete(client: openai.OpenAI, file_storage: Path) -> None:
    data = "naïve café\n".encode() * 1000
    uploaded = client.files.create(file=("notes.md", data, "text/markdown"), purpose="assistants")
    assert uploaded.id.startswith("file-")
    assert (uploaded.object, uploaded.bytes, uploaded.filename) == ("file", len(data), "notes.md")
    assert (uploaded.purpose, uploaded.status, uploaded.expires_at) == ("assistants", "processed", None)
    row = File.objects.get(id=uploaded.id)
    assert (row.owner, row.content_type, row.bytes) == ("default", "text/markdown", len(data))
    assert stored_names(file_storage) == [row.storage_name]
    assert (file_storage / row.storage_name).read_bytes() == data

    assert client.files.retrieve(uploaded.id) == uploaded
    download = client.files.content(uploaded.id)
    assert download.read() == data
    assert download.response.headers["content-type"] == "application/octet-stream"
    assert download.response.headers["content-length"] == str(len(data))

    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (uploaded.id, "file", True)
    assert not File.objects.filter(id=uploaded.id).exists()
    assert stored_names(file_storage) == []  # the bytes left the storage
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as exc:
            call(uploaded.id)
        assert exc.value.body == {
            "message": f"No file found with id '{uploaded.id}'.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }


def test_list_pages_orders_and_filters_by_purpose(client: openai.OpenAI) -> None:
    ids = [
        client.files.create(file=(f"f{i}.txt", b"x" * (i + 1)), purpose="batch" if i % 2 else "user_data").id
        for i in range(5)
    ]
    everything = client.files.list()
    assert [f.id for f in everything.data] == ids[::-1]  # newest first
    assert everything.has_more is False

    first = client.files.list(limit=2, order="asc")
    assert [f.id for f in first.data] == ids[:2] and first.has_more is True
    assert [f.id for f in client.files.list(limit=2, order="asc", after=ids[1]).data] == ids[2:4]
    assert [f.id for f in client.files.list(limit=2, order="asc")] == ids  # the SDK follows the pages
    assert [f.id for f in client.files.list(purpose="batch").data] == [ids[3], ids[1]]
    assert [f.id for f in client.files.list(purpose="vision").data] == []

    with pytest.raises(openai.BadRequestError) as exc:
        client.files.list(limit=0)
    assert exc.value.body["param"] == "limit"
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.list(order="sideways")  # type: ignore[arg-type]
    assert exc.value.body["param"] == "order"
    with pytest.raises(openai.NotFoundError) as exc:
        client.files.list(after="file-unknown")
    assert exc.value.body["param"] == "after"


def test_expires_after_sets_expires_at_and_an_expired_file_is_gone(
    client: openai.OpenAI, file_storage: Path
) -> None:
    uploaded = client.files.create(
        file=("e.txt", b"soon gone"), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert uploaded.expires_at == uploaded.created_at + 3600
    File.objects.filter(id=uploaded.id).update(expires_at=File.objects.get(id=uploaded.id).created_at)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    assert client.files.list().data == []
    # The periodic sweep (every gateway process runs it) deletes it for good: row, attachments, bytes.
    keeps = client.files.create(file=("k.txt", b"keeps"), purpose="batch")
    client.vector_stores.create(file_ids=[keeps.id])
    VectorStoreFile.objects.create(vector_store_id=VectorStore.objects.get().id, file_id=uploaded.id)
    sweep_once()
    assert list(File.objects.values_list("id", flat=True)) == [keeps.id]
    assert list(VectorStoreFile.objects.values_list("file_id", flat=True)) == [keeps.id]
    assert stored_names(file_storage) == [File.objects.get().storage_name]
    assert services.files_expired_delete() == 0


@pytest.mark.parametrize(
    ("fields", "files", "param", "code"),
    [
        ({"purpose": "fine-tuning"}, {"file": ("a.txt", b"x")}, "purpose", "invalid_value"),
        ({}, {"file": ("a.txt", b"x")}, "purpose", "missing_required_parameter"),
        ({"purpose": "assistants"}, {"file": ("a.txt", b"")}, "file", "empty_file"),
        ({"purpose": "assistants", "file": "not a file"}, None, "file", "invalid_type"),
        ({"purpose": "assistants"}, {"other": ("a.txt", b"x")}, "other", "unknown_parameter"),
        ({"purpose": "assistants", "color": "red"}, {"file": ("a.txt", b"x")}, "color", "unknown_parameter"),
        (
            {
                "purpose": "assistants",
                "expires_after[anchor]": "last_active_at",
                "expires_after[seconds]": "3600",
            },
            {"file": ("a.txt", b"x")},
            "expires_after.anchor",
            "invalid_value",
        ),
        (
            {"purpose": "assistants", "expires_after[anchor]": "created_at", "expires_after[seconds]": "60"},
            {"file": ("a.txt", b"x")},
            "expires_after.seconds",
            "integer_below_min_value",
        ),
    ],
)
def test_bad_uploads_are_400s_that_store_nothing(
    live_gateway: LiveServer,
    file_storage: Path,
    fields: dict[str, str],
    files: dict[str, Any] | None,
    param: str,
    code: str,
) -> None:
    answer = httpx.post(
        f"{live_gateway.url}/v1/files", data=fields, files=files or {"ignored": ("", b"")}, timeout=30
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert answer.json()["error"]["code"] == code
    assert File.objects.count() == 0
    assert stored_names(file_storage) == []


def test_missing_file_and_wrong_content_type_are_400s(
    client: openai.OpenAI, live_gateway: LiveServer
) -> None:
    answer = httpx.post(f"{live_gateway.url}/v1/files", data={"purpose": "assistants"}, files={}, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] in ("file", None)
    answer = httpx.post(f"{live_gateway.url}/v1/files", json={"purpose": "assistants"}, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_content_type"
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("a.txt", b"x"), purpose="nope")  # type: ignore[arg-type]
    assert exc.value.body["message"] == (
        "Invalid value: 'nope'. Supported values are: 'assistants', 'batch', 'fine-tune', 'vision', "
        "'user_data', and 'evals'."
    )
    assert File.objects.count() == 0


def test_uploads_over_the_ceiling_are_413s_that_store_nothing(
    client: openai.OpenAI, live_gateway: LiveServer, gateway_config: Any, file_storage: Path
) -> None:
    """The file ceiling replaces the 10 MiB JSON one on this route only, and is checked three ways:
    a declared length (before reading), a counted chunked body, and the file itself while parsed."""
    gateway_config(files__max_upload_bytes=1000, server__max_request_body_size_bytes=100)
    # Over the JSON ceiling, within the file one: accepted, byte for byte (exactly at the limit).
    ok = client.files.create(file=("limit.bin", b"\x00\xff" * 500), purpose="user_data")
    assert ok.bytes == 1000
    assert client.files.content(ok.id).read() == b"\x00\xff" * 500
    File.objects.all().delete()
    for name in stored_names(file_storage):
        (file_storage / name).unlink()

    expected = {
        "message": "File exceeds the maximum upload size of 1000 bytes.",
        "type": "invalid_request_error",
        "param": "file",
        "code": "file_too_large",
    }
    # The file one byte over (the body within the framing allowance): refused while it is parsed.
    with pytest.raises(openai.APIStatusError) as exc:
        client.files.create(file=("big.bin", b"x" * 1001), purpose="user_data")
    assert exc.value.status_code == 413 and exc.value.body == expected

    # A declared length over the ceiling: answered before a byte of the body is read.
    head, _, body = (
        raw_http(
            live_gateway.port,
            b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            b"Content-Length: 999999999\r\n\r\n",
        )
    ).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert orjson.loads(body) == {"error": expected}

    # A chunked body (no length) is counted as it arrives and cut off past the ceiling.
    def chunks() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="c.bin"\r\n\r\n'
        for _ in range(40):
            yield b"y" * 4096

    answer = httpx.post(
        f"{live_gateway.url}/v1/files",
        content=chunks(),
        headers={"Content-Type": "multipart/form-data; boundary=b"},
        timeout=30,
    )
    assert answer.status_code == 413 and answer.json() == {"error": expected}

    # The JSON ceiling still holds everywhere else.
    assert httpx.post(f"{live_gateway.url}/v1/vector_stores", json={"name": "x" * 200}).status_code == 413
    assert File.objects.count() == 0
    assert stored_names(file_storage) == []


def test_a_chunked_upload_within_the_ceiling_is_stored(live_gateway: LiveServer, file_storage: Path) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="c.txt"\r\n\r\n'
        yield b"hello " * 1000
        yield b"\r\n--b--\r\n"

    answer = httpx.post(
        f"{live_gateway.url}/v1/files",
        content=chunks(),
        headers={"Content-Type": "multipart/form-data; boundary=b"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    row = File.objects.get(id=answer.json()["id"])
    assert (file_storage / row.storage_name).read_bytes() == b"hello " * 1000


@pytest.fixture
def file_rows_refused() -> Iterator[None]:
    """The database refuses every new file row (a trigger): the commit after the bytes fails."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION refuse_file_row() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER refuse_file BEFORE INSERT ON files_app_file "
                "FOR EACH ROW EXECUTE FUNCTION refuse_file_row()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER refuse_file BEFORE INSERT ON files_app_file "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
    yield
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER refuse_file ON files_app_file")
            cursor.execute("DROP FUNCTION refuse_file_row()")
        else:
            cursor.execute("DROP TRIGGER refuse_file")


def test_a_failed_row_leaves_no_bytes(
    client: openai.OpenAI, file_storage: Path, file_rows_refused: None
) -> None:
    """The bytes are stored first; when the row cannot be committed they are removed again."""
    with pytest.raises(openai.InternalServerError):
        client.files.create(file=("a.txt", b"data"), purpose="assistants")
    assert File.objects.count() == 0
    assert stored_names(file_storage) == []


def test_deleting_a_file_removes_its_attachments_and_chunks_in_every_store(
    client: openai.OpenAI, file_storage: Path
) -> None:
    kept = client.files.create(file=("kept.txt", b"kept"), purpose="assistants")
    gone = client.files.create(file=("gone.txt", b"gone"), purpose="assistants")
    stores = [client.vector_stores.create(name=f"s{i}", file_ids=[kept.id, gone.id]) for i in range(2)]
    for attachment in VectorStoreFile.objects.all():  # as ingestion would publish them
        Chunk.objects.create(
            store_file=attachment,
            vector_store_id=attachment.vector_store_id,
            file_id=attachment.file_id,
            position=0,
            text=attachment.file_id,
            tokens=1,
        )
    VectorStoreFile.objects.update(status="completed", usage_bytes=4)
    revisions = {s.id: s.revision for s in VectorStore.objects.all()}

    client.files.delete(gone.id)
    assert set(VectorStoreFile.objects.values_list("file_id", flat=True)) == {kept.id}
    assert set(Chunk.objects.values_list("file_id", flat=True)) == {kept.id}
    assert stored_names(file_storage) == [File.objects.get(id=kept.id).storage_name]
    for store in stores:
        again = client.vector_stores.retrieve(store.id)
        assert again.file_counts.total == again.file_counts.completed == 1
        assert again.usage_bytes == 4
        assert VectorStore.objects.get(id=store.id).revision == revisions[store.id] + 1
    assert client.files.retrieve(kept.id).id == kept.id
