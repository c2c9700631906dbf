"""``GET /v1/models`` (upstream list, or the Codex catalog) and ``GET /v1/models/{model}``.

Spec (gateway-api.txt, "Models"): "GET /v1/models returns the upstream model list unchanged. Codex
clients, which send client_version, receive it in the Codex catalog shape instead." and "A model the
upstream does not list returns 404 with the error code model_not_found, and an upstream error is
returned unchanged."
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.servers import LiveServer, free_port
from tests.upstream import MAX_MODEL_LEN, ScriptedUpstream, json_answer, models_body, vllm_error

pytestmark = pytest.mark.django_db(transaction=True)

SLASH_ID = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any) -> LiveServer:
    gateway_config(llm_api_base=upstream.url)
    upstream.models = ["test-model", SLASH_ID]
    return live_gateway


def sdk(gw: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-x", max_retries=0)


def test_list_is_the_upstream_list_unchanged(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    listing = b'{"object":"list","data":[{"id":"test-model","object":"model","created":1,"owned_by":"vllm","max_model_len":4096,"extra":{"a":1}}]}'
    upstream.script("/v1/models", json_answer(listing, headers={"X-Upstream": "yes"}))
    r = httpx.get(f"{gw.url}/v1/models")
    assert r.status_code == 200
    assert r.content == listing
    assert r.headers["x-upstream"] == "yes"
    assert r.headers["content-type"] == "application/json"


def test_list_through_the_sdk(gw: LiveServer) -> None:
    ids = [m.id for m in sdk(gw).models.list()]
    assert ids == ["test-model", SLASH_ID]


def test_list_forwards_the_credential_rule(
    live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, openai_api_key="sk-upstream")
    httpx.get(f"{live_gateway.url}/v1/models")
    assert upstream.last("/v1/models").headers["authorization"] == "Bearer sk-upstream"
    httpx.get(f"{live_gateway.url}/v1/models", headers={"authorization": "Bearer mine"})
    assert upstream.last("/v1/models").headers["authorization"] == "Bearer mine"


def test_codex_catalog_shape(gw: LiveServer) -> None:
    r = httpx.get(f"{gw.url}/v1/models", params={"client_version": "0.171.0"})
    assert r.status_code == 200
    models = r.json()["models"]
    assert [m["slug"] for m in models] == ["test-model", SLASH_ID]
    assert models[0] == {
        "slug": "test-model",
        "display_name": "test-model",
        "description": None,
        "supported_in_api": True,
        "priority": 1,
        "visibility": "list",
        "shell_type": "shell_command",
        "base_instructions": "",
        "supported_reasoning_levels": [
            {"effort": "low", "description": "Fast responses with lighter reasoning"},
            {"effort": "medium", "description": "Balances speed and reasoning depth"},
            {"effort": "high", "description": "Greater reasoning depth for complex problems"},
        ],
        "default_reasoning_level": "medium",
        "supports_reasoning_summaries": False,
        "default_reasoning_summary": "auto",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "web_search_tool_type": "text",
        "truncation_policy": {"mode": "bytes", "limit": 100000},
        "supports_parallel_tool_calls": True,
        "supports_image_detail_original": False,
        "input_modalities": ["text"],
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "supports_search_tool": False,
        "upgrade": None,
        "context_window": MAX_MODEL_LEN,
        "max_context_window": MAX_MODEL_LEN,
    }


def test_codex_catalog_without_max_model_len_omits_context_window(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        "/v1/models", json_answer({"object": "list", "data": [{"id": "gpt-x", "object": "model"}]})
    )
    models = httpx.get(f"{gw.url}/v1/models?client_version=0.171.0").json()["models"]
    assert models[0]["slug"] == "gpt-x"
    assert "context_window" not in models[0]


def test_codex_catalog_passes_upstream_errors_unchanged(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    error = orjson.dumps(vllm_error("engine dead", "InternalServerError", 500))
    upstream.script("/v1/models", json_answer(error, status=500))
    r = httpx.get(f"{gw.url}/v1/models?client_version=0.171.0")
    assert r.status_code == 500
    assert r.content == error


@pytest.mark.parametrize("path", [SLASH_ID, "meta-llama%2FLlama-3.1-8B-Instruct", "test-model"])
def test_retrieve_slash_ids_encoded_or_not(gw: LiveServer, path: str) -> None:
    r = httpx.get(f"{gw.url}/v1/models/{path}")
    assert r.status_code == 200
    expected = next(
        m for m in models_body(["test-model", SLASH_ID])["data"] if m["id"] == path.replace("%2F", "/")
    )
    assert r.json() == expected
    # vLLM has no per-model route: the gateway asked for the list.
    assert r.headers["content-type"] == "application/json"


def test_retrieve_through_the_sdk(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    model = sdk(gw).models.retrieve(SLASH_ID)
    assert model.id == SLASH_ID
    assert model.owned_by == "vllm"
    assert upstream.last().path == "/v1/models"


def test_retrieve_unknown_model_is_404_model_not_found(gw: LiveServer) -> None:
    r = httpx.get(f"{gw.url}/v1/models/nope/nothing")
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "The model `nope/nothing` does not exist.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    with pytest.raises(openai.NotFoundError):
        sdk(gw).models.retrieve("nope")


def test_retrieve_upstream_error_unchanged(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    error = orjson.dumps(vllm_error("Unauthorized", "Unauthorized", 401))
    upstream.script("/v1/models", json_answer(error, status=401, headers={"WWW-Authenticate": "Bearer"}))
    r = httpx.get(f"{gw.url}/v1/models/test-model")
    assert r.status_code == 401
    assert r.content == error
    assert r.headers["www-authenticate"] == "Bearer"


def test_models_upstream_down_is_502(live_gateway: LiveServer, gateway_config: Any) -> None:
    gateway_config(llm_api_base=f"http://127.0.0.1:{free_port()}")
    for path in ("/v1/models", "/v1/models/test-model", "/v1/models?client_version=1"):
        r = httpx.get(f"{live_gateway.url}{path}")
        assert r.status_code == 502
        assert r.json()["error"] == {
            "message": "Could not reach the upstream model server.",
            "type": "server_error",
            "param": None,
            "code": "upstream_error",
        }


def test_models_method_not_allowed(gw: LiveServer) -> None:
    r = httpx.post(f"{gw.url}/v1/models", content=b"{}")
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.slow
def test_codex_cli_parses_the_catalog(gw: LiveServer, upstream: ScriptedUpstream, tmp_path: Any) -> None:
    """Codex itself fetches ``/v1/models?client_version=…`` from the gateway and accepts every entry.

    Codex only asks a custom provider for its catalog when the provider has command auth, so the
    config gives it one (``[model_providers.gateway.auth]``).
    """
    import json
    import subprocess

    from tests.clients import codex_cli

    codex = str(codex_cli())
    (tmp_path / "config.toml").write_text(
        'model = "test-model"\nmodel_provider = "gateway"\n\n'
        "[model_providers.gateway]\n"
        f'name = "gateway"\nbase_url = "{gw.url}/v1"\nwire_api = "responses"\nrequires_openai_auth = false\n\n'
        '[model_providers.gateway.auth]\ncommand = "echo"\nargs = ["sk-codex"]\n'
    )
    result = subprocess.run(
        [codex, "debug", "models"],
        env={"CODEX_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    catalog = {m["slug"]: m for m in json.loads(result.stdout)["models"]}
    for slug in ("test-model", SLASH_ID):
        assert catalog[slug]["context_window"] == MAX_MODEL_LEN
        assert catalog[slug]["default_reasoning_level"] == "medium"
        assert [level["effort"] for level in catalog[slug]["supported_reasoning_levels"]] == [
            "low",
            "medium",
            "high",
        ]
    rec = upstream.last("/v1/models")
    assert rec.headers["authorization"] == "Bearer sk-codex"
