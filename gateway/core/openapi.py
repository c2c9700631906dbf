"""The OpenAPI 3.1 document of the ``/v1`` API, generated from pydantic types (none written by hand).

DRF views name their models in ``extend_schema``; the lean routes are added by
:func:`add_lean_routes` from :data:`LEAN_ROUTES`, other pass-through routes as the upstream's JSON.
``/v1/openapi.json`` and the Swagger UI at ``/docs/`` (assets from ``drf-spectacular-sidecar``) are
public: they describe the API's shape, never stored data.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Literal, NotRequired

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from pydantic import BaseModel, ConfigDict, PydanticSchemaGenerationError, TypeAdapter, create_model
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema
from typing_extensions import TypedDict  # pydantic needs it on Python 3.11

# -- envelopes -------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class Error(BaseModel):
    """OpenAI's error envelope, as ``gateway.core.errors`` renders it."""

    error: ErrorDetail


class UpstreamErrorDetail(BaseModel):
    message: str
    type: str | None = None
    param: str | None = None
    code: str | int | None = None


class UpstreamError(BaseModel):
    """A pass-through route's error: the gateway's own, or the upstream's as sent (vLLM's ``code``
    is the status)."""

    error: UpstreamErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error envelope (``/v1/messages*``)."""

    type: Literal["error"]
    error: AnthropicErrorDetail
    request_id: str | None = None


# One server-sent event; ``data`` carries the JSON of the route's stream event (``[DONE]`` ends the
# Chat Completions and Completions streams).
class ServerSentEvent(TypedDict):
    data: str
    event: NotRequired[str]
    id: NotRequired[str]


_STATUS_TEXT = {
    400: "Invalid request: the envelope names the parameter (`param`) and the rule (`code`).",
    401: "Missing or invalid credential (API keys, OIDC, or the stored-state rule).",
    404: "Unknown id, model or route (another owner's id too).",
    409: "Conflicting state (a concurrent change; a response without a stored snapshot).",
    413: "Request body over the size limit.",
    415: "Unsupported media type.",
    422: "The upstream refused the request.",
    501: "Not supported by this gateway (yet).",
}
# The error answers of the DRF views (drf-spectacular renders the pydantic envelope).
ERROR_RESPONSES = {
    status: OpenApiResponse(Error, description=_STATUS_TEXT[status]) for status in (400, 401, 404, 409)
}


class PrincipalAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """``gateway.core.drf.PrincipalAuthentication`` in the document: a bearer token (or ``x-api-key``)."""

    target_class = "gateway.core.drf.PrincipalAuthentication"
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

JSON, SSE, TEXT, AUDIO = "application/json", "text/event-stream", "text/plain", "audio/*"
MULTIPART = "multipart/form-data"


@dataclass(frozen=True)
class Lean:
    """A route served outside DRF: its body's type and its 200 answers, each a pydantic type
    (``module:attr``, resolved when the document is built) or a media type (a stream, text, audio)."""

    summary: str
    request: str | None = None
    answers: tuple[str, ...] = ()
    errors: tuple[int, ...] = (400, 401, 404, 413, 422)
    envelope: str = "gateway.core.openapi:UpstreamError"
    request_media: str = JSON
    operation_id: str = ""  # default: the path's words and the verb (``chat_completions_create``)


OURS, ANTHROPIC = "gateway.core.openapi:Error", "gateway.core.openapi:AnthropicError"  # error envelopes
LEAN_ROUTES: dict[tuple[str, str], Lean] = {
    ("post", "/v1/responses"): Lean(
        "Create a model response (JSON, or a server-sent event stream with `stream: true`).",
        "responses_app.protocol.schemas:ResponseCreateRequest",
        ("openai.types.responses:Response", SSE),
        errors=(400, 401, 404, 409, 413, 415),
        envelope=OURS,
    ),
    ("post", "/v1/responses/input_tokens"): Lean(
        "Count the input tokens a response request would send (the upstream's `/tokenize`).",
        "openai.types.responses:InputTokenCountParams",
        ("openai.types.responses:InputTokenCountResponse",),
        errors=(400, 401, 404, 413, 415, 501),
        envelope=OURS,
        operation_id="responses_input_tokens",
    ),
    ("post", "/v1/responses/compact"): Lean(
        "Compact a conversation's history into a compaction item (one summary round).",
        "openai.types.responses:ResponseCompactParams",
        ("openai.types.responses:CompactedResponse",),
        errors=(400, 401, 404, 413, 415),
        envelope=OURS,
        operation_id="responses_compact",
    ),
    ("post", "/v1/chat/completions"): Lean(
        "Chat Completions, relayed to the upstream byte for byte.",
        "openai.types.chat:CompletionCreateParams",
        ("openai.types.chat:ChatCompletion", SSE),
    ),
    ("post", "/v1/completions"): Lean(
        "Completions, relayed to the upstream byte for byte.",
        "openai.types:CompletionCreateParams",
        ("openai.types:Completion", SSE),
    ),
    ("post", "/v1/embeddings"): Lean(
        "Embeddings, relayed to the upstream byte for byte.",
        "openai.types:EmbeddingCreateParams",
        ("openai.types:CreateEmbeddingResponse",),
    ),
    ("post", "/v1/audio/transcriptions"): Lean(
        "Audio transcription (multipart upload streamed to the upstream).",
        "openai.types.audio:TranscriptionCreateParams",
        ("openai.types.audio:Transcription", SSE, TEXT),
        request_media=MULTIPART,
    ),
    ("post", "/v1/audio/translations"): Lean(
        "Audio translation (multipart upload streamed to the upstream).",
        "openai.types.audio:TranslationCreateParams",
        ("openai.types.audio:Translation", TEXT),
        request_media=MULTIPART,
    ),
    ("post", "/v1/audio/speech"): Lean(
        "Speech from text: the upstream's audio relayed as it arrives.",
        "openai.types.audio:SpeechCreateParams",
        (AUDIO,),
    ),
    ("post", "/v1/messages"): Lean(
        "Anthropic Messages (JSON, or Anthropic's event stream with `stream: true`).",
        "anthropic.types:MessageCreateParams",
        ("anthropic.types:Message", SSE),
        envelope=ANTHROPIC,
    ),
    ("post", "/v1/messages/count_tokens"): Lean(
        "Count the input tokens of a Messages request.",
        "anthropic.types:MessageCountTokensParams",
        ("anthropic.types:MessageTokensCount",),
        envelope=ANTHROPIC,
        operation_id="messages_count_tokens",
    ),
    ("get", "/v1/models"): Lean(
        "The upstream's model list.", None, ("gateway.core.openapi:ModelList",), errors=(401,)
    ),
    ("get", "/v1/models/{model}"): Lean(
        "One model of the upstream's list.", None, ("openai.types:Model",), errors=(401, 404)
    ),
}
# A pass-through route without an entry above: vLLM's own API or an operator's extra route.
RELAYED_AS_IS = Lean(
    "Relayed to the upstream as it is: vLLM's own API, or `[passthrough] extra_routes` "
    "(docs/passthrough.md).",
    "builtins:dict",
    ("builtins:dict",),
)


def __getattr__(name: str) -> Any:  # ``gateway.core.openapi:ModelList``, built on first use (imports openai)
    if name == "ModelList":
        from openai.types import Model

        class ModelList(BaseModel):
            object: Literal["list"]
            data: list[Model]

        return ModelList
    raise AttributeError(name)


def _resolve(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    target: Any = __import__(module, fromlist=[attr.split(".")[0]])
    for part in attr.split("."):
        target = getattr(target, part)
    return target


class _Generate(GenerateJsonSchema):
    """Pydantic's JSON schema, with file uploads (``IO[bytes]`` in the SDKs' params) as binary strings."""

    def is_instance_schema(self, schema: core_schema.IsInstanceSchema) -> JsonSchemaValue:
        return {"type": "string", "format": "binary"}


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


class Components:
    """JSON schemas of pydantic types, their ``$defs`` gathered as document components, named
    after their package (``openai_Response``, ``anthropic_Message``; none for the gateway's own)."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def schema(self, spec: str, mode: str) -> dict[str, Any]:
        if "/" in spec:  # a media type
            return {SSE: _json_schema(ServerSentEvent, mode, ""), TEXT: {"type": "string"}}.get(
                spec, {"type": "string", "format": "binary"}
            )
        target = _resolve(spec)
        package = spec.split(".")[0].split(":")[0].replace("_app", "")
        prefix = "" if package == "gateway" else f"{package}_"
        schema = _json_schema(target, mode, f"#/components/schemas/{prefix}{{model}}")
        for name, definition in schema.pop("$defs", {}).items():
            self.schemas[f"{prefix}{name}"] = definition
        if isinstance(target, type) and issubclass(target, BaseModel):  # a named model is a component
            self.schemas[f"{prefix}{target.__name__}"] = schema
            return sdk_ref(f"{prefix}{target.__name__}")
        return schema


def _operation_id(method: str, path: str) -> str:
    words = [part for part in path.removeprefix("/v1/").split("/") if part and not part.startswith("{")]
    verb = {"post": "create", "delete": "delete"}.get(method, "retrieve" if "{" in path else "list")
    return "_".join([*words, verb]).replace("-", "_")


def lean_operation(method: str, path: str, route: Lean, components: Components) -> dict[str, Any]:
    tags = {"/v1/responses": "Responses", "/v1/messages": "Anthropic Messages", "/v1/models": "Models"}
    operation: dict[str, Any] = {
        "operationId": route.operation_id or _operation_id(method, path),
        "summary": route.summary,
        "tags": [next((tag for prefix, tag in tags.items() if path.startswith(prefix)), "Pass-through")],
        "security": [{"bearer": []}, {}],
        "responses": {},
    }
    if "{" in path:
        operation["parameters"] = [
            {"name": name.split("}")[0], "in": "path", "required": True, "schema": {"type": "string"}}
            for name in path.split("{")[1:]
        ]
    if route.request is not None:
        schema = components.schema(route.request, "validation")
        operation["requestBody"] = {"required": True, "content": {route.request_media: {"schema": schema}}}
    operation["responses"]["200"] = {
        "description": "OK",
        "content": {
            (spec if "/" in spec else JSON): {"schema": components.schema(spec, "serialization")}
            for spec in route.answers
        },
    }
    error = {JSON: {"schema": components.schema(route.envelope, "serialization")}}
    for status in route.errors:
        operation["responses"][str(status)] = {"description": _STATUS_TEXT[status], "content": error}
    return operation


@functools.cache
def lean_paths() -> tuple[dict[str, Any], dict[str, Any]]:
    """The lean routes' paths and the components they refer to (built once per process)."""
    from gateway.core import fastroutes

    routes = dict(LEAN_ROUTES)
    for path, relayed in fastroutes.RELAYED.items():
        for method in sorted(relayed.methods):
            routes.setdefault((method.lower(), path), RELAYED_AS_IS)
    components = Components()
    paths: dict[str, Any] = {}
    for (method, path), route in routes.items():
        operation = lean_operation(method, path, route, components)
        if route is RELAYED_AS_IS:
            operation["operationId"] = "passthrough_" + "_".join(path.strip("/").split("/")).replace("-", "_")
        paths.setdefault(path, {})[method] = operation
    return paths, components.schemas


# Usage counters the SDK declares required but the gateway omits when the upstream did not report
# them (docs/responses.md: an unreported count is absent, never a made-up 0).
UNREPORTED_COUNTERS = ("openai_InputTokensDetails", "openai_OutputTokensDetails")


def _add_links(paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    """OpenAPI links from a creating ``POST`` to the operations on its path and below whose new parameter
    is the created id; clients and schemathesis' stateful phase follow them."""
    for path, operations in paths.items():
        ok = operations.get("post", {}).get("responses", {}).get("200")
        if ok is None or path.endswith("}"):
            continue
        answer = ok.get("content", {}).get(JSON, {}).get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
        created = (
            "$response.body#/data/0/id"
            if "has_more" in schemas.get(answer, {}).get("properties", {})
            else "$response.body#/id"
        )
        links = {}
        for target, target_operations in paths.items():
            if target != path and not target.startswith(path + "/{"):
                continue
            for method, operation in target_operations.items():
                if (target, method) == (path, "post"):
                    continue
                names = [part.split("}")[0] for part in target.split("{")[1:]]
                if sum("{" + name + "}" not in path for name in names) > 1:
                    continue  # a path below another created thing
                parameters = {
                    name: f"$request.path.{name}" if "{" + name + "}" in path else created for name in names
                }
                links[operation["operationId"]] = {
                    "operationId": operation["operationId"],
                    "parameters": parameters,
                }
        if links:
            ok["links"] = links


def add_lean_routes(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the lean routes next to the DRF views, paths sorted,
    and the links between operations."""
    paths, schemas = lean_paths()
    merged = {path: dict(operations) for path, operations in result.get("paths", {}).items()}
    for path, operations in paths.items():
        merged.setdefault(path, {}).update(copy.deepcopy(operations))
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(schemas)
    _add_links(merged, components["schemas"])
    result["paths"] = dict(sorted(merged.items()))
    for name in UNREPORTED_COUNTERS:  # our answers next to the SDK's stricter types
        components["schemas"][name] = {
            k: v for k, v in components["schemas"][name].items() if k != "required"
        }
    components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    return result


def sdk_ref(name: str) -> dict[str, Any]:
    """A reference to a component the hook adds (DRF views whose answers are SDK types use it)."""
    return {"$ref": f"#/components/schemas/{name}"}
