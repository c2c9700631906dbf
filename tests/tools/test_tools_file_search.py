"""file_search in the gateway-tool library: classification, the call it makes (with its owner),
where it runs (always the gateway process), and the model's view of its results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from asgiref.sync import sync_to_async

from gateway.core.config import load_config, replace
from inference_app.tools import classify_tools, run_gateway_calls
from inference_app.tools.dispatch import runs_in_gateway
from inference_app.tools.file_search import model_output, queries_of, result_of
from tests.responses.file_search_fixtures import make_store

CONFIG = load_config({})
TOOL = {"type": "file_search", "vector_store_ids": ["vs_1"], "max_num_results": 3}


def test_file_search_is_a_gateway_function_whose_calls_carry_the_owner() -> None:
    ts = classify_tools([TOOL, {"type": "function", "name": "f"}], config=CONFIG, owner="oidc:me")
    assert ts.owner("file_search") == "gateway"
    fn = ts.functions["file_search"]
    assert fn.kind == "file_search" and fn.tool_index == 0
    assert fn.parameters["required"] == ["queries"]
    call = ts.make_call("call_1", "file_search", '{"queries": ["a"]}')
    assert (call.kind, call.owner, call.tool) == ("file_search", "oidc:me", TOOL)
    assert runs_in_gateway(call)  # the database is the gateway's: never a Celery tools task
    web = classify_tools([{"type": "web_search"}], config=CONFIG).make_call("c", "web_search", "{}")
    assert not runs_in_gateway(web)


def test_queries_and_the_text_the_model_reads() -> None:
    assert queries_of('{"queries": ["a", " ", 3, "b"]}') == ["a", "b"]
    assert queries_of('{"query": "solo"}') == ["solo"]
    assert queries_of("not json") == []
    hit = {
        "file_id": "file-1",
        "filename": "a.txt",
        "score": 0.5,
        "attributes": {"k": "v"},
        "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
    }
    result = result_of(hit)
    assert result == {
        "file_id": "file-1",
        "filename": "a.txt",
        "score": 0.5,
        "attributes": {"k": "v"},
        "text": "one\ntwo",
    }
    shown = model_output(["q"], [result])
    assert '<result index="1" file_id="file-1" filename="a.txt">\none\ntwo\n</result>' in shown
    assert "[cite:<file_id>]" in shown
    assert model_output(["q"], []) == 'No results found in the files for "q".'
    assert orjson.loads(orjson.dumps(result)) == result


@pytest.mark.django_db(transaction=True)
async def test_with_a_broker_and_no_tools_worker_a_search_still_runs(settings: Any, tmp_path: Path) -> None:
    """No ``tools`` worker consumes: a call sent there would time out. file_search runs here."""
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    store, (file,) = await sync_to_async(make_store)([("a.txt", "alpha beta", {})])
    config = replace(CONFIG, redis_url="redis://127.0.0.1:6379/9", tools__call_timeout_s=5.0)
    assert config.broker_enabled
    ts = classify_tools([{**TOOL, "vector_store_ids": [store.id]}], config=config, owner="default")
    call = ts.make_call("call_1", "file_search", '{"queries": ["alpha"]}')
    [result] = await run_gateway_calls([call], config=config)
    assert result.ok, result.error
    assert [r["file_id"] for r in result.results or ()] == [file.id]
