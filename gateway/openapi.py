"""The OpenAPI 3.1 document of the whole ``/v1`` API, generated from the code.

drf-spectacular describes the DRF resource views (Conversations; retrieve, delete, input items and
cancel of stored responses) from their serializers and ``extend_schema`` annotations. The lean
routes (``POST /v1/responses`` and its siblings, the pass-through routes, Anthropic Messages, the
model catalog) are not DRF views: :data:`LEAN_ROUTES` names each with the pydantic type of its body
and of its answer — our own models (``responses_app.schemas``) or the ``openai`` / ``anthropic`` SDK
types — and :func:`add_lean_routes` (a drf-spectacular post-processing hook) writes their JSON
schemas into the document. Nothing here is a hand-written copy of a schema that could drift.

``GET /v1/openapi.json`` serves the document and ``/docs/`` a Swagger UI whose assets come from
``drf-spectacular-sidecar`` (no CDN); both are public like ``/health`` (``gateway.auth.requires_auth``):
the document describes the API's shape, never stored data, and client generators and ops tools
fetch it without credentials.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from pydantic import ConfigDict, PydanticSchemaGenerationError, TypeAdapter, create_model
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema
from rest_framework import serializers

# -- the error envelopes ---------------------------------------------------------------------------


class ErrorDetailSerializer(serializers.Serializer[Any]):
    message = serializers.CharField()
    type = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    code = serializers.CharField(allow_null=True)


class ErrorSerializer(serializers.Serializer[Any]):
    """OpenAI's error envelope, as ``gateway.errors`` renders it."""

    error = ErrorDetailSerializer()


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


ERROR_RESPONSES: dict[int, OpenApiResponse] = {
    400: _error("Invalid request: the envelope names the parameter (`param`) and the rule (`code`)."),
    401: _error("Missing or invalid credential (API keys, OIDC, or the stored-state rule)."),
    404: _error("Unknown id, or another owner's id."),
    409: _error("Conflicting state (a concurrent change; a response without a stored snapshot)."),
}


class PrincipalAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """``gateway.drf.PrincipalAuthentication`` in the document: a bearer token (or ``x-api-key``)."""

    target_class = "gateway.drf.PrincipalAuthentication"
    name = "bearer"
    priority = 1

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key or OIDC access token, or none on an open gateway "
            "(see docs/auth.md). Anthropic clients may send it as `x-api-key`.",
        }

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[str]]]:
        return [{"bearer": []}, {}]  # open gateways take requests without a credential


# -- lean routes -----------------------------------------------------------------------------------


class _Generate(GenerateJsonSchema):
    """Pydantic's JSON schema, with file uploads (``IO[bytes]`` in the SDKs' params) as binary strings."""

    def is_instance_schema(self, schema: core_schema.IsInstanceSchema) -> JsonSchemaValue:
        return {"type": "string", "format": "binary"}


@dataclass(frozen=True)
class Body:
    """A request or response body: ``type`` resolved lazily (``module:attr``), its media type."""

    type: str
    media_type: str = "application/json"

    def resolve(self) -> Any:
        module, _, attr = self.type.partition(":")
        target: Any = __import__(module, fromlist=[attr.split(".")[0]])
        for part in attr.split("."):
            target = getattr(target, part)
        return target


SSE = "text/event-stream"
# One server-sent event; ``data`` carries the JSON of the route's stream event (``[DONE]`` ends
# the Chat Completions and Completions streams).
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"}},
}


@dataclass(frozen=True)
class LeanRoute:
    path: str
    method: str
    operation_id: str
    tag: str
    summary: str
    request: Body | None = None
    ok: tuple[Body, ...] = ()  # the 200 answers (JSON, and the SSE stream when asked for)
    errors: tuple[int, ...] = (400, 401)
    envelope: str = "openai"  # or "anthropic" (``/v1/messages*``)
    path_params: tuple[str, ...] = field(default=())
    ok_status: int = 200


_OPENAI_UPSTREAM_ERRORS = (400, 401, 404, 413, 422)
LEAN_ROUTES: tuple[LeanRoute, ...] = (
    LeanRoute(
        "/v1/responses",
        "post",
        "responses_create",
        "Responses",
        "Create a model response (JSON, or a server-sent event stream with `stream: true`).",
        request=Body("responses_app.schemas:ResponseCreateRequest"),
        ok=(Body("openai.types.responses:Response"), Body("builtins:str", SSE)),
        errors=(400, 401, 404, 409, 413, 415),
    ),
    LeanRoute(
        "/v1/responses/input_tokens",
        "post",
        "responses_input_tokens",
        "Responses",
        "Count the input tokens a response request would send (the upstream's `/tokenize`).",
        request=Body("openai.types.responses:InputTokenCountParams"),
        ok=(Body("openai.types.responses:InputTokenCountResponse"),),
        errors=(400, 401, 404, 413, 415, 501),
    ),
    LeanRoute(
        "/v1/responses/compact",
        "post",
        "responses_compact",
        "Responses",
        "Compact a conversation's history into a compaction item (one summary round).",
        request=Body("openai.types.responses:ResponseCompactParams"),
        ok=(Body("openai.types.responses:CompactedResponse"),),
        errors=(400, 401, 404, 413, 415),
    ),
    LeanRoute(
        "/v1/chat/completions",
        "post",
        "chat_completions_create",
        "Pass-through",
        "Chat Completions, relayed to the upstream byte for byte.",
        request=Body("openai.types.chat:CompletionCreateParams"),
        ok=(Body("openai.types.chat:ChatCompletion"), Body("builtins:str", SSE)),
        errors=_OPENAI_UPSTREAM_ERRORS,
        envelope="upstream",
    ),
    LeanRoute(
        "/v1/completions",
        "post",
        "completions_create",
        "Pass-through",
        "Completions, relayed to the upstream byte for byte.",
        request=Body("openai.types:CompletionCreateParams"),
        ok=(Body("openai.types:Completion"), Body("builtins:str", SSE)),
        errors=_OPENAI_UPSTREAM_ERRORS,
        envelope="upstream",
    ),
    LeanRoute(
        "/v1/embeddings",
        "post",
        "embeddings_create",
        "Pass-through",
        "Embeddings, relayed to the upstream byte for byte.",
        request=Body("openai.types:EmbeddingCreateParams"),
        ok=(Body("openai.types:CreateEmbeddingResponse"),),
        errors=_OPENAI_UPSTREAM_ERRORS,
        envelope="upstream",
    ),
    LeanRoute(
        "/v1/audio/transcriptions",
        "post",
        "audio_transcriptions_create",
        "Pass-through",
        "Audio transcription (multipart upload streamed to the upstream).",
        request=Body("openai.types.audio:TranscriptionCreateParams", "multipart/form-data"),
        ok=(
            Body("openai.types.audio:Transcription"),
            Body("builtins:str", SSE),
            Body("builtins:str", "text/plain"),
        ),
        errors=_OPENAI_UPSTREAM_ERRORS,
        envelope="upstream",
    ),
    LeanRoute(
        "/v1/audio/translations",
        "post",
        "audio_translations_create",
        "Pass-through",
        "Audio translation (multipart upload streamed to the upstream).",
        request=Body("openai.types.audio:TranslationCreateParams", "multipart/form-data"),
        ok=(Body("openai.types.audio:Translation"), Body("builtins:str", "text/plain")),
        errors=_OPENAI_UPSTREAM_ERRORS,
        envelope="upstream",
    ),
    LeanRoute(
        "/v1/messages",
        "post",
        "messages_create",
        "Anthropic Messages",
        "Anthropic Messages (JSON, or Anthropic's event stream with `stream: true`).",
        request=Body("anthropic.types:MessageCreateParams"),
        ok=(Body("anthropic.types:Message"), Body("builtins:str", SSE)),
        errors=(400, 401, 404, 413, 422),
        envelope="anthropic",
    ),
    LeanRoute(
        "/v1/messages/count_tokens",
        "post",
        "messages_count_tokens",
        "Anthropic Messages",
        "Count the input tokens of a Messages request.",
        request=Body("anthropic.types:MessageCountTokensParams"),
        ok=(Body("anthropic.types:MessageTokensCount"),),
        errors=(400, 401, 404, 413, 422),
        envelope="anthropic",
    ),
    LeanRoute(
        "/v1/models",
        "get",
        "models_list",
        "Models",
        "The upstream's model list.",
        ok=(Body("gateway.openapi:ModelList"),),
        errors=(401,),
        envelope="upstream",
    ),
    LeanRoute(
        "/v1/models/{model}",
        "get",
        "models_retrieve",
        "Models",
        "One model of the upstream's list.",
        ok=(Body("openai.types:Model"),),
        errors=(401, 404),
        envelope="upstream",
        path_params=("model",),
    ),
)


def _model_list() -> Any:
    from typing import Literal

    from openai.types import Model
    from pydantic import BaseModel

    class ModelList(BaseModel):
        object: Literal["list"]
        data: list[Model]

    return ModelList


def __getattr__(name: str) -> Any:  # ``Body("gateway.openapi:ModelList")``, built on first use
    if name == "ModelList":
        return _model_list()
    raise AttributeError(name)


class Components:
    """JSON schemas of pydantic types, their ``$defs`` gathered as document components."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def schema(self, body: Body, mode: str) -> dict[str, Any]:
        if body.media_type == SSE:
            return SSE_EVENT
        target = body.resolve()
        if target is str:
            return {"type": "string"}
        prefix = body.type.split(".")[0].split(":")[0].replace("_app", "")
        ref_template = f"#/components/schemas/{prefix}_{{model}}"
        schema = _json_schema(target, mode, ref_template)
        for name, definition in schema.pop("$defs", {}).items():
            self.schemas[f"{prefix}_{name}"] = definition
        if _is_model(target):  # a named model is a component (the DRF views refer to some)
            self.schemas[f"{prefix}_{target.__name__}"] = schema
            return sdk_ref(f"{prefix}_{target.__name__}")
        return schema


def _json_schema(target: Any, mode: Any, ref_template: str) -> dict[str, Any]:
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(target)
    except PydanticSchemaGenerationError:
        # A file upload (``IO[bytes]``) in the SDK's params: hold it in a model that allows
        # arbitrary types; _Generate writes it as a binary string.
        holder = create_model(
            "Holder", __config__=ConfigDict(arbitrary_types_allowed=True), value=(target, ...)
        )
        wrapped = holder.model_json_schema(mode=mode, ref_template=ref_template, schema_generator=_Generate)
        value: dict[str, Any] = wrapped["properties"]["value"]
        if "$defs" in wrapped:
            value = {**value, "$defs": wrapped["$defs"]}
        return value
    return adapter.json_schema(mode=mode, ref_template=ref_template, schema_generator=_Generate)


def _is_model(target: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(target, type) and issubclass(target, BaseModel)


def _error_schema(envelope: str) -> dict[str, Any]:
    if envelope == "upstream":
        # The gateway's own refusals, or the upstream's relayed as sent (vLLM's ``code`` is the status).
        return {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": ["string", "null"]},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": ["string", "integer", "null"]},
                    },
                }
            },
        }
    if envelope == "anthropic":
        return {
            "type": "object",
            "required": ["type", "error"],
            "properties": {
                "type": {"type": "string", "enum": ["error"]},
                "error": {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                },
                "request_id": {"type": "string"},
            },
        }
    return {"$ref": "#/components/schemas/Error"}


_STATUS_TEXT = {
    400: "Invalid request.",
    401: "Missing or invalid credential.",
    404: "Unknown id, model or route.",
    409: "Conflicting state.",
    413: "Request body over the size limit.",
    415: "Unsupported media type.",
    422: "The upstream refused the request.",
    501: "Not supported by this gateway (yet).",
}


def lean_operation(route: LeanRoute, components: Components) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
        "security": [{"bearer": []}, {}],
        "responses": {},
    }
    if route.path_params:
        operation["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in route.path_params
        ]
    if route.request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {route.request.media_type: {"schema": components.schema(route.request, "validation")}},
        }
    if route.ok:
        operation["responses"][str(route.ok_status)] = {
            "description": "OK",
            "content": {
                body.media_type: {"schema": components.schema(body, "serialization")} for body in route.ok
            },
        }
    for status in route.errors:
        operation["responses"][str(status)] = {
            "description": _STATUS_TEXT.get(status, "Error."),
            "content": {"application/json": {"schema": _error_schema(route.envelope)}},
        }
    return operation


@functools.cache
def lean_paths() -> tuple[dict[str, Any], dict[str, Any]]:
    """The paths of :data:`LEAN_ROUTES` and the components they refer to (built once per process)."""
    components = Components()
    paths: dict[str, Any] = {}
    for route in LEAN_ROUTES:
        paths.setdefault(route.path, {})[route.method] = lean_operation(route, components)
    return paths, components.schemas


# Usage counters the SDK declares required but the gateway omits when the upstream did not report
# them (docs/responses.md: an unreported count is absent, never a made-up 0).
UNREPORTED_COUNTERS = ("openai_InputTokensDetails", "openai_OutputTokensDetails")

# OpenAPI links: where an answer's ids lead (clients, and schemathesis' stateful phase, follow them).
_CONVERSATION = {"conversation_id": "$response.body#/id"}
_RESPONSE = {"response_id": "$response.body#/id"}
_ITEM = {"conversation_id": "$request.path.conversation_id", "item_id": "$response.body#/data/0/id"}
LINKS: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "conversations_create": {
        "RetrieveConversation": ("conversations_retrieve", _CONVERSATION),
        "UpdateConversation": ("conversations_update", _CONVERSATION),
        "ListItems": ("conversations_items_list", _CONVERSATION),
        "CreateItems": ("conversations_items_create", _CONVERSATION),
        "DeleteConversation": ("conversations_delete", _CONVERSATION),
    },
    "conversations_items_create": {
        "RetrieveItem": ("conversations_items_retrieve", _ITEM),
        "DeleteItem": ("conversations_items_delete", _ITEM),
        "ListItems": ("conversations_items_list", {"conversation_id": "$request.path.conversation_id"}),
    },
    "responses_create": {
        "RetrieveResponse": ("responses_retrieve", _RESPONSE),
        "ListInputItems": ("responses_input_items_list", _RESPONSE),
        "CancelResponse": ("responses_cancel", _RESPONSE),
        "DeleteResponse": ("responses_delete", _RESPONSE),
    },
}


def _add_links(paths: dict[str, Any]) -> None:
    for operations in paths.values():
        for operation in operations.values():
            links = LINKS.get(operation.get("operationId", ""))
            ok = operation.get("responses", {}).get("200")
            if links and ok is not None:
                ok["links"] = {
                    name: {"operationId": target, "parameters": dict(parameters)}
                    for name, (target, parameters) in links.items()
                }


def add_lean_routes(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the lean routes next to the DRF views, paths sorted,
    and the :data:`LINKS` between operations."""
    paths, schemas = lean_paths()
    merged = {path: dict(operations) for path, operations in result.get("paths", {}).items()}
    for path, operations in paths.items():
        merged.setdefault(path, {}).update(copy.deepcopy(operations))
    _add_links(merged)
    result["paths"] = dict(sorted(merged.items()))
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(schemas)
    for name in UNREPORTED_COUNTERS:  # our answers next to the SDK's stricter types
        components["schemas"][name] = {
            k: v for k, v in components["schemas"][name].items() if k != "required"
        }
    components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    return result


# Referenced by the DRF views whose answers are SDK types (added to the document by the hook).
def sdk_ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}
