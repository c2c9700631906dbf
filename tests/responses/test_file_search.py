"""The ``file_search`` tool through the public API: the item and its events, results with
``include`` (at create and on retrieve), citations, filters, ``max_tool_calls``, continuations.

The live gateway runs in front of the scripted upstream (both wire APIs); stores, files and chunks
are made with the ORM; the search itself is ``files_app.retrieval``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from files_app.models import VectorStore
from tests.responses.conftest import wait_terminal
from tests.responses.file_search_fixtures import make_store
from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import ToolsGateway, args, model_input, offered_tools, types_of
from tests.responses.wsutil import Client, connect, create

FILE_SEARCH_EVENTS = [
    "response.output_item.added",
    "response.file_search_call.in_progress",
    "response.file_search_call.searching",
    "response.file_search_call.completed",
    "response.output_item.done",
]
# Wire-independent behaviour runs on one wire (the tool loop's wire handling is covered by the rest).
ONE_WIRE = pytest.mark.parametrize("wire", ["responses"])
LAUNCH = "The rocket launch is planned for May on the northern pad."
BUDGET = "The travel budget for the team is four thousand euros."


@pytest.fixture(autouse=True)
def files_storage(settings: Any, tmp_path: Path) -> Iterator[None]:
    storages = dict(settings.STORAGES)
    storages["files"] = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "files")},
    }
    settings.STORAGES = storages
    yield


def docs() -> tuple[VectorStore, list[Any]]:
    return make_store([("launch.txt", LAUNCH, {"team": "rocket"}), ("budget.txt", BUDGET, {"team": "ops"})])


def tool(store: VectorStore, **fields: Any) -> dict[str, Any]:
    return {"type": "file_search", "vector_store_ids": [store.id], **fields}


def test_file_search_streams_its_item_and_the_answer_cites_the_file(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, (launch, _budget) = docs()
    gw.script(call("file_search", args(queries=["rocket launch"]), call_id="call_fs1"))
    gw.script(text("The launch is in May ", f"[cite:{launch.id}]", ". Ask ", "[cite:file-nope] later."))
    events = gw.events({"model": "m", "input": "when is the launch?", "tools": [tool(store)]})
    kinds = types_of(events)
    assert kinds[:7] == ["response.created", "response.in_progress", *FILE_SEARCH_EVENTS]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.annotation.added") == 1
    added, done = events[2], events[6]
    item_id = added["item"]["id"]
    assert item_id.startswith("fs_")
    assert added["item"] == {
        "id": item_id,
        "type": "file_search_call",
        "status": "in_progress",
        "queries": ["rocket launch"],
        "results": None,
    }
    assert all(e["item_id"] == item_id and e["output_index"] == 0 for e in events[3:6])
    assert done["item"] == {**added["item"], "status": "completed"}  # results only with include

    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["file_search_call", "message"]
    part = final["output"][1]["content"][0]
    clean = "The launch is in May. Ask [cite:file-nope] later."  # an unknown file stays as written
    assert part["text"] == clean
    annotation = {"type": "file_citation", "file_id": launch.id, "filename": "launch.txt", "index": 20}
    assert part["annotations"] == [annotation]
    assert clean[: annotation["index"]] == "The launch is in May"
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert streamed == clean
    added_event = next(e for e in events if e["type"] == "response.output_text.annotation.added")
    assert added_event["annotation"] == annotation and added_event["annotation_index"] == 0
    assert added_event["output_index"] == 1 and added_event["content_index"] == 0
    assert final["tools"] == [
        {
            "type": "file_search",
            "vector_store_ids": [store.id],
            "filters": None,
            "max_num_results": 20,
            "ranking_options": {"hybrid_search": None, "ranker": "auto", "score_threshold": 0.0},
        }
    ]

    # The model saw a plain function, then the passages with their file ids and how to cite them.
    assert offered_tools(gw, 0) == ["file_search"]
    seen = model_input(gw, 1)
    assert seen[1] == {"call": ("file_search", '{"queries":["rocket launch"]}', "call_fs1")}
    call_id, output = seen[2]["output"]
    assert call_id == "call_fs1"
    assert LAUNCH in output and launch.id in output and "launch.txt" in output
    assert "[cite:<file_id>]" in output
    for body in gw.upstream_bodies():
        assert all(t.get("type") == "function" for t in body.get("tools", []))

    stored = httpx.get(f"{gw.url}/v1/responses/{final['id']}").json()
    assert stored["output"] == final["output"]


@ONE_WIRE
def test_include_returns_results_at_create_and_on_retrieve(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, (launch, _budget) = docs()
    gw.script(call("file_search", args(queries=["launch"])))
    gw.script(text(f"In May[cite:{launch.id}]."))
    response = gw.client.responses.create(
        model="m", input="when?", tools=[tool(store)], include=["file_search_call.results"]
    )
    assert response.output_text == "In May."  # a JSON answer: markers stripped, annotated all the same
    annotations = response.output[1].content[0].annotations  # type: ignore[union-attr]
    assert [(a.type, a.file_id, a.filename, a.index) for a in annotations] == [  # type: ignore[union-attr]
        ("file_citation", launch.id, "launch.txt", 6)
    ]
    item = response.output[0]
    assert item.type == "file_search_call" and item.status == "completed"
    assert item.results is not None and len(item.results) == 1
    result = item.results[0]
    assert (result.file_id, result.filename, result.text) == (launch.id, "launch.txt", LAUNCH)
    assert result.attributes == {"team": "rocket"}
    assert result.score is not None and result.score > 0

    # On retrieve, results again only when include asks (they are kept with the stored item).
    plain = gw.client.responses.retrieve(response.id)
    assert plain.output[0].results is None  # type: ignore[union-attr]
    included = gw.client.responses.retrieve(response.id, include=["file_search_call.results"])
    assert included.output[0].model_dump() == item.model_dump()


@ONE_WIRE
def test_filters_narrow_the_results(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, (_launch, budget) = docs()
    gw.script(call("file_search", args(queries=["launch", "budget"])))  # each matches one file
    gw.script(text("ok"))
    filters = {"type": "eq", "key": "team", "value": "ops"}
    final = gw.create(
        {
            "model": "m",
            "input": "x",
            "tools": [tool(store, filters=filters, max_num_results=5)],
            "include": ["file_search_call.results"],
            "tool_choice": {"type": "file_search"},
        }
    )
    assert gw.upstream_bodies()[0]["tool_choice"] == {"type": "function", "name": "file_search"}
    assert [r["file_id"] for r in final["output"][0]["results"]] == [budget.id]
    assert final["tools"][0]["filters"] == filters and final["tools"][0]["max_num_results"] == 5


def test_max_tool_calls_refuses_the_second_search(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, _files = docs()
    gw.script(
        call("file_search", args(queries=["launch"]), call_id="call_a"),
        call("file_search", args(queries=["budget"]), call_id="call_b"),
    )
    gw.script(text("done"))
    final = gw.create({"model": "m", "input": "x", "tools": [tool(store)], "max_tool_calls": 1})
    assert [i["type"] for i in final["output"]] == ["file_search_call", "message"]
    assert final["output"][0]["queries"] == ["launch"]
    seen = model_input(gw, 1)
    outputs = dict(s["output"] for s in seen if "output" in s)
    assert outputs["call_b"] == '{"error":"UserError: Reached tool call limit of 1"}'
    assert LAUNCH in outputs["call_a"]
    assert offered_tools(gw, 1) == []  # no more gateway tools once one was refused


@ONE_WIRE
def test_a_search_without_results_tells_the_model(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, _files = docs()
    gw.script(call("file_search", args(queries=["zebra"])))
    gw.script(text("Nothing [cite:file-x]."))
    final = gw.create({"model": "m", "input": "x", "tools": [tool(store)]})
    assert final["output"][0]["status"] == "completed"
    assert final["output"][1]["content"][0]["annotations"] == []
    assert final["output"][1]["content"][0]["text"] == "Nothing [cite:file-x]."
    assert "No results" in model_input(gw, 1)[2]["output"][1]


def test_continuations_replay_the_search_to_the_model(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, _files = docs()
    gw.script(call("file_search", args(queries=["launch"]), call_id="call_1"))
    gw.script(text("May."))
    gw.script(text("Still May."))
    first = gw.create({"model": "m", "input": "when?", "tools": [tool(store)]})
    second = gw.create({"model": "m", "input": "sure?", "previous_response_id": first["id"]})
    assert second["status"] == "completed"
    seen = model_input(gw, 2)
    assert seen[1] == {"call": ("file_search", '{"queries":["launch"]}', "call_1")}
    assert seen[2]["output"][0] == "call_1" and LAUNCH in seen[2]["output"][1]
    assert seen[-1] == {"text": ("user", "sure?")}

    conversation = httpx.post(f"{gw.url}/v1/conversations", json={}).json()["id"]
    gw.script(call("file_search", args(queries=["budget"]), call_id="call_2"))
    gw.script(text("4000."))
    gw.script(text("Yes."))
    gw.create({"model": "m", "input": "budget?", "tools": [tool(store)], "conversation": conversation})
    gw.create({"model": "m", "input": "really?", "conversation": conversation})
    seen = model_input(gw, 5)
    assert seen[1] == {"call": ("file_search", '{"queries":["budget"]}', "call_2")}
    assert BUDGET in seen[2]["output"][1]
    items = httpx.get(f"{gw.url}/v1/conversations/{conversation}/items?order=asc").json()["data"]
    search = next(i for i in items if i["type"] == "file_search_call")
    assert "_gateway" not in search and search["queries"] == ["budget"]
    assert search["results"] is None  # only with include
    listed = gw.client.conversations.items.list(conversation, include=["file_search_call.results"])
    search_item = next(i for i in listed.data if i.type == "file_search_call")
    assert [r.text for r in search_item.results or ()] == [BUDGET]  # type: ignore[union-attr]


def test_store_false_and_a_replayed_item(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, _files = docs()
    gw.script(call("file_search", args(queries=["launch"]), call_id="call_1"))
    gw.script(text("May."))
    first = gw.create(
        {
            "model": "m",
            "input": "when?",
            "tools": [tool(store)],
            "store": False,
            "include": ["file_search_call.results"],
        }
    )
    assert httpx.get(f"{gw.url}/v1/responses/{first['id']}").status_code == 404
    # A stateless client replays the output; the model sees the search as a call and its results.
    gw.script(text("Yes."))
    replay = [{"role": "user", "content": "when?"}, *first["output"], {"role": "user", "content": "sure?"}]
    gw.create({"model": "m", "input": replay, "store": False})
    seen = model_input(gw, 2)
    assert seen[1]["call"][0] == "file_search"
    assert LAUNCH in seen[2]["output"][1]


@ONE_WIRE
def test_websocket_streams_the_search_and_the_citation(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, (launch, _budget) = docs()
    gw.script(call("file_search", args(queries=["launch"])))
    gw.script(text(f"May[cite:{launch.id}]."))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            client = Client(ws)
            await client.send(create(tools=[tool(store)], store=False, include=["file_search_call.results"]))
            return await client.until_terminal()

    events = asyncio.run(scenario())
    assert types_of(events)[2:7] == FILE_SEARCH_EVENTS
    final = events[-1]["response"]
    assert final["output"][0]["results"][0]["file_id"] == launch.id
    part = final["output"][1]["content"][0]
    assert part["text"] == "May."
    assert part["annotations"] == [
        {"type": "file_citation", "file_id": launch.id, "filename": "launch.txt", "index": 3}
    ]


@ONE_WIRE
def test_sdk_stream_and_background(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    store, (launch, _budget) = docs()
    gw.script(call("file_search", args(queries=["launch"])))
    gw.script(text(f"May[cite:{launch.id}]"))
    with gw.client.responses.stream(model="m", input="when?", tools=[tool(store)]) as stream:  # type: ignore[list-item]
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[2:7] == FILE_SEARCH_EVENTS
    assert "response.output_text.annotation.added" in kinds
    message = final.output[1]
    assert message.type == "message"
    annotation = message.content[0].annotations[0]  # type: ignore[union-attr]
    assert (annotation.type, annotation.file_id, annotation.index) == ("file_citation", launch.id, 3)  # type: ignore[union-attr]

    # Background: checked when queued, run later, retrievable with its results.
    gw.script(call("file_search", args(queries=["launch"])))
    gw.script(text("May."))
    queued = gw.client.responses.create(model="m", input="when?", tools=[tool(store)], background=True)  # type: ignore[list-item]
    row = wait_terminal(queued.id)
    assert row.status == "completed"
    done = gw.client.responses.retrieve(queued.id, include=["file_search_call.results"])
    assert [r.file_id for r in done.output[0].results or ()] == [launch.id]  # type: ignore[union-attr]
