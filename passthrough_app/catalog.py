"""Models: ``GET /v1/models`` and ``GET /v1/models/{model}``.

The list is the upstream's (its ids, each time it is read, are the model labels of the usage
metrics). Codex (it sends ``client_version``) gets its own catalog shape, one ``ModelInfo`` per
model with ``context_window`` from vLLM's ``max_model_len``. vLLM has no per-model route, so
``/v1/models/{model}`` answers from the list (``/`` in ids, encoded or not).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from gateway.core import errors
from gateway.core.config import get_config
from gateway.core.http import allow_methods, json_response
from gateway.core.principal import credential_consumed
from inference_app.upstream.http import UpstreamResponse, forward_headers, get_upstream
from inference_app.upstream.types import model_cards
from usage_app import metrics as usage_metrics

# What Codex shows for each effort (same wording as the reference gateway).
REASONING_LEVELS = [
    {"effort": "low", "description": "Fast responses with lighter reasoning"},
    {"effort": "medium", "description": "Balances speed and reasoning depth"},
    {"effort": "high", "description": "Greater reasoning depth for complex problems"},
]


async def _upstream_models(request: HttpRequest, query: str = "") -> tuple[UpstreamResponse, bytes]:
    headers = forward_headers(
        list(request.headers.items()),
        get_config(),
        caller_credential_consumed=credential_consumed(request),
    )
    response = await get_upstream().send("GET", "/v1/models", headers=headers, query=query)
    try:
        body = await response.read()
    finally:
        await response.aclose()
    if response.status == 200 and not query:
        entries = model_cards(body)
        if entries is not None:  # the models the metrics label by name (usage_app.metrics)
            usage_metrics.models_listed(entry["id"] for entry in entries)
    return response, body


def _relayed(response: UpstreamResponse, body: bytes) -> HttpResponse:
    """The upstream's answer as it was: status, headers and body bytes."""
    out = HttpResponse(body, status=response.status)
    del out["Content-Type"]
    for key, value in response.headers:
        if key.lower() != "content-length":
            out[key] = value
    return out


def codex_model_info(entry: dict[str, Any], priority: int) -> dict[str, Any]:
    """One Codex ``ModelInfo`` for an upstream model: every field codex-rs requires, the optional ones it
    reads given neutral values."""
    slug = entry["id"]
    info: dict[str, Any] = {
        "slug": slug,
        "display_name": slug,
        "description": None,
        "supported_in_api": True,
        "priority": priority,
        "visibility": "list",
        "shell_type": "shell_command",
        "base_instructions": "",
        "supported_reasoning_levels": REASONING_LEVELS,
        "default_reasoning_level": "medium",
        "supports_reasoning_summaries": False,
        "default_reasoning_summary": "auto",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "web_search_tool_type": "text",
        "truncation_policy": {"mode": "bytes", "limit": 100_000},
        "supports_parallel_tool_calls": True,
        "supports_image_detail_original": False,
        "input_modalities": ["text"],
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "supports_search_tool": False,
        "upgrade": None,
    }
    max_model_len = entry.get("max_model_len")
    if isinstance(max_model_len, int) and not isinstance(max_model_len, bool) and max_model_len > 0:
        info["context_window"] = max_model_len
        info["max_context_window"] = max_model_len
    return info


@allow_methods("GET")
async def models_list(request: HttpRequest) -> HttpResponse:
    """``GET /v1/models``: the upstream list unchanged, or the Codex catalog for Codex clients."""
    if "client_version" not in request.GET:
        response, body = await _upstream_models(request, request.META.get("QUERY_STRING", ""))
        return _relayed(response, body)
    response, body = await _upstream_models(request)
    entries = model_cards(body) if response.status == 200 else None
    if entries is None:
        return _relayed(response, body)
    return json_response({"models": [codex_model_info(e, 1) for e in entries]})


@allow_methods("GET")
async def model_retrieve(request: HttpRequest, model: str) -> HttpResponse:
    """``GET /v1/models/{model}``: the upstream's own entry for ``model``."""
    response, body = await _upstream_models(request)
    if response.status != 200:
        return _relayed(response, body)
    entries = model_cards(body)
    if entries is None:
        raise errors.UpstreamError("The upstream model server answered an invalid model list.")
    for entry in entries:
        if entry["id"] == model:
            return json_response(entry)
    raise errors.NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
