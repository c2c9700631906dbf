"""File search end to end with the official SDK, every piece real: files uploaded, a vector store
built from them by the in-process ingestion, searched through the API and by the ``file_search``
tool (JSON and SSE), citations, then deleting a file takes its chunks out of the store and its bytes
out of storage, and deleting the store keeps the files. Runs on SQLite and, in the PostgreSQL leg,
on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from files_app.models import Chunk, File
from tests.files.ingest_helpers import make_pdf
from tests.responses.conftest import Gateway
from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import args

pytestmark = pytest.mark.parametrize("wire", ["responses"])  # the tool loop's wires have their own tests

LAUNCH = "The rocket launch is planned for May on the northern pad, weather permitting."
BUDGET = "# Budget\n\nThe travel budget for the team is four thousand euros this year."
MENU = ["Canteen menu", "Monday: lentil soup and bread", "Tuesday: grilled fish with rice"]


@pytest.fixture
def storage_dir(settings: Any, tmp_path: Path) -> Iterator[Path]:
    location = tmp_path / "files"
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(location)},
        },
    }
    yield location


def stored(location: Path) -> set[str]:
    return {p.name for p in location.rglob("*") if p.is_file()} if location.exists() else set()


def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_upload_ingest_search_tool_cite_and_delete(gw: Gateway, storage_dir: Path) -> None:
    client = gw.client
    launch = client.files.create(file=("launch.txt", LAUNCH.encode(), "text/plain"), purpose="assistants")
    budget = client.files.create(file=("budget.md", BUDGET.encode(), "text/markdown"), purpose="assistants")
    menu = client.files.create(file=("menu.pdf", make_pdf(MENU), "application/pdf"), purpose="assistants")
    assert (launch.filename, launch.bytes, launch.purpose) == ("launch.txt", len(LAUNCH), "assistants")
    assert client.files.content(budget.id).read() == BUDGET.encode()

    store = client.vector_stores.create(name="handbook", file_ids=[launch.id, budget.id, menu.id])
    done = eventually(lambda: (s := client.vector_stores.retrieve(store.id)).status == "completed" and s)
    assert done, client.vector_stores.retrieve(store.id)
    assert done.file_counts.completed == 3 and done.file_counts.total == 3 and done.usage_bytes > 0
    files = {f.id: f for f in client.vector_stores.files.list(vector_store_id=store.id)}
    assert {f.status for f in files.values()} == {"completed"} and set(files) == {
        launch.id,
        budget.id,
        menu.id,
    }

    # The search endpoint finds each file by its own words, the PDF's text included.
    for query, wanted in (
        ("rocket launch pad", launch),
        ("travel budget euros", budget),
        ("lentil soup", menu),
    ):
        page = client.vector_stores.search(store.id, query=query)
        assert page.data and page.data[0].file_id == wanted.id, (query, page.data)
        assert page.data[0].filename == wanted.filename
    assert "lentil soup" in client.vector_stores.search(store.id, query="lentil soup").data[0].content[0].text

    # The tool: the model searches, reads the passages and cites the file.
    gw.script(call("file_search", args(queries=["when is the rocket launch"]), call_id="call_fs"))
    gw.script(text("It is in May ", f"[cite:{launch.id}]", "."))
    tool = {"type": "file_search", "vector_store_ids": [store.id]}
    response = client.responses.create(
        model="m", input="When is the launch?", tools=[tool], include=["file_search_call.results"]
    )
    search_call, message = response.output
    assert search_call.type == "file_search_call" and search_call.status == "completed"
    assert search_call.queries == ["when is the rocket launch"]
    assert search_call.results and search_call.results[0].file_id == launch.id
    assert search_call.results[0].filename == "launch.txt" and "northern pad" in (
        search_call.results[0].text or ""
    )
    assert message.type == "message"
    part = message.content[0]
    assert part.type == "output_text" and part.text == "It is in May."
    assert [a.model_dump() for a in part.annotations] == [
        {
            "type": "file_citation",
            "file_id": launch.id,
            "filename": "launch.txt",
            "index": len("It is in May"),
        }
    ]
    round_two = gw.upstream_bodies()[-1]
    assert LAUNCH in str(round_two["input"])  # the passage reached the model

    # The same over SSE, through the SDK's stream.
    gw.script(call("file_search", args(queries=["travel budget"]), call_id="call_fs2"))
    gw.script(text("Four thousand euros ", f"[cite:{budget.id}]", "."))
    with client.responses.stream(model="m", input="Budget?", tools=[tool]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    searching = [k for k in kinds if k.startswith("response.file_search_call.")]
    assert searching == [
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.file_search_call.completed",
    ]
    assert final.output[0].type == "file_search_call" and final.output[0].results is None  # no include
    assert final.output[1].content[0].annotations[0].file_id == budget.id  # type: ignore[union-attr]

    # Deleting a file takes its chunks out of every store and its bytes out of storage.
    launch_row = File.objects.get(id=launch.id)
    assert launch_row.storage_name.rsplit("/", 1)[-1] in stored(storage_dir)
    assert client.files.delete(launch.id).deleted
    assert not Chunk.objects.filter(file_id=launch.id).exists()
    assert launch_row.storage_name.rsplit("/", 1)[-1] not in stored(storage_dir)
    hits = client.vector_stores.search(store.id, query="rocket launch pad", max_num_results=50).data
    assert launch.id not in {hit.file_id for hit in hits}
    assert {f.id for f in client.vector_stores.files.list(vector_store_id=store.id)} == {budget.id, menu.id}
    assert client.vector_stores.retrieve(store.id).file_counts.total == 2

    # Deleting the store keeps the files and their bytes.
    assert client.vector_stores.delete(store.id).deleted
    assert {f.id for f in client.files.list()} >= {budget.id, menu.id}
    assert client.files.content(menu.id).read() == make_pdf(MENU)
    assert not Chunk.objects.exists()


def test_the_sdk_s_polling_helpers(gw: Gateway, storage_dir: Path) -> None:
    """``upload_and_poll`` and ``create_and_poll``, as SDK users ingest files: they return once the
    attachment or the batch is no longer ``in_progress``."""
    client = gw.client
    store = client.vector_stores.create(name="helpers")
    one = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=("launch.txt", LAUNCH.encode()), poll_interval_ms=50
    )
    assert one.status == "completed" and one.usage_bytes > 0
    batch = client.vector_stores.file_batches.upload_and_poll(
        store.id,
        files=[("budget.md", BUDGET.encode()), ("menu.pdf", make_pdf(MENU))],
        poll_interval_ms=50,
    )
    assert batch.status == "completed" and batch.file_counts.completed == 2
    broken = client.files.create(file=("broken.pdf", b"%PDF-1.4 not really"), purpose="assistants")
    failed = client.vector_stores.files.create_and_poll(
        broken.id, vector_store_id=store.id, poll_interval_ms=50
    )
    assert failed.status == "failed" and failed.last_error is not None
    assert failed.last_error.code in ("invalid_file", "unsupported_file")
    done = client.vector_stores.retrieve(store.id)
    assert (done.file_counts.completed, done.file_counts.failed, done.status) == (3, 1, "completed")
    assert client.vector_stores.search(store.id, query="lentil soup").data[0].filename == "menu.pdf"
