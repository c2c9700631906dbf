"""Wire models of the Responses API: the ``responses.create`` request body, in the SDK's field order.
Unknown fields are kept (``extra="allow"``) so vLLM's extras reach the upstream."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conversations_app.schemas import check_input_item
from gateway.core import errors
from inference_app.tools import validate_max_tool_calls
from responses_app.protocol.features import refuse_unsupported
from responses_app.protocol.tool_decls import check_declared_tool

INT64_MAX = 9223372036854775807

# Top-level fields the gateway owns: never sent to the upstream model server.
NOT_FORWARDED = frozenset(
    {
        "conversation",
        "context_management",
        "stream_options",
        "previous_response_id",
        "background",
        "background_options",
        "max_tool_calls",
        "metadata",
        "multi_agent",  # the gateway coordinates the agents; the model server sees plain function tools
        "store",
        "stream",
        # WebSocket-only fields (Codex): never meaningful upstream.
        "generate",
        "stream_id",
        "client_metadata",
    }
)


class ConversationParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str


class ResponseCreateRequest(BaseModel):
    """``POST /v1/responses`` (``openai.types.responses.ResponseCreateParams``)."""

    # The example is the OpenAPI document's (gateway/core/openapi.py).
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [{"model": "meta-llama/Llama-3.1-8B-Instruct", "input": "Say hello."}]
        },
    )

    access_programs: dict[str, Any] | None = None
    background: bool | None = None
    background_options: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    conversation: str | ConversationParam | None = None
    image: dict[str, Any] | None = None
    include: list[str] | None = None
    input: str | list[Any] | None = None  # items: checked one by one (_check_items_and_tools)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    # Validated before the model by inference_app.tools.validate_max_tool_calls (one implementation).
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str
    moderation: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    reasoning: dict[str, Any] | None = None
    safety_identifier: str | None = None
    # Any tier name: an explicit value is forwarded unchanged (spec), and the SDK's list grows
    # ("fast", "ultrafast" in openai 3.57); the upstream decides what it serves.
    service_tier: str | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    top_p: float | None = Field(default=None, ge=0, le=1)
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None

    @property
    def conversation_id(self) -> str | None:
        if self.conversation is None:
            return None
        return self.conversation if isinstance(self.conversation, str) else self.conversation.id

    @property
    def stores(self) -> bool:
        """``store`` defaults to true (OpenAI behaviour)."""
        return self.store is not False


def parse_create_request(body: bytes) -> tuple[ResponseCreateRequest, dict[str, Any]]:
    """The typed request and the raw JSON object (for forwarding and echoing)."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise errors.BadRequest(
            "We could not parse the JSON body of your request. The request body must be valid JSON.",
            code="invalid_json",
        ) from None
    if not isinstance(raw, dict):
        raise errors.BadRequest("The request body must be a JSON object.", code="invalid_json")
    validate_max_tool_calls(raw.get("max_tool_calls"))
    try:
        request = ResponseCreateRequest.model_validate(raw, strict=False)
    except ValidationError as exc:
        raise errors.validation_error(exc, raw) from None
    _check_strict_types(raw)
    _check_items_and_tools(request)
    _check_stored_lengths(request)
    refuse_unsupported(raw)  # well-formed, but a feature the gateway does not build
    # Last, U+0000: in a parsed string it can only come from the escape \u0000, so a body without that
    # escape skips the walk over every string.
    if body.find(b"\\u0000") >= 0:  # find: "in" on bytes raises and clears a TypeError first
        errors.refuse_nul(raw, "")
    return request, raw


# JSON-level type checks pydantic's lax mode would coerce ("1" → 1, 1 → 1.0 is fine).
_INT_FIELDS = ("max_output_tokens", "top_logprobs")
_BOOL_FIELDS = ("background", "parallel_tool_calls", "store", "stream")


def _check_strict_types(raw: dict[str, Any]) -> None:
    for name in _INT_FIELDS:
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise errors.BadRequest(
                f"Invalid type for '{name}': expected an integer, but got {errors.json_type_name(value)} instead.",
                param=name,
                code="invalid_type",
            )
    for name in _BOOL_FIELDS:
        value = raw.get(name)
        if value is not None and not isinstance(value, bool):
            raise errors.BadRequest(
                f"Invalid type for '{name}': expected a boolean, but got {errors.json_type_name(value)} instead.",
                param=name,
                code="invalid_type",
            )
    for name in ("temperature", "top_p"):
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise errors.BadRequest(
                f"Invalid type for '{name}': expected a decimal, but got {errors.json_type_name(value)} instead.",
                param=name,
                code="invalid_type",
            )
    for name in ("model", "instructions", "previous_response_id", "prompt_cache_key", "user"):
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise errors.BadRequest(
                f"Invalid type for '{name}': expected a string, but got {errors.json_type_name(value)} instead.",
                param=name,
                code="invalid_type",
            )


def _check_items_and_tools(request: ResponseCreateRequest) -> None:
    if isinstance(request.input, list):
        for index, item in enumerate(request.input):
            if not isinstance(item, dict):
                raise errors.invalid_type(f"input[{index}]", "an object", item)
            if "type" not in item and "role" not in item:
                raise errors.BadRequest(
                    f"Missing required parameter: 'input[{index}].type'.",
                    param=f"input[{index}].type",
                    code="missing_required_parameter",
                )
            kind = item.get("type", "message")
            call_id = item.get("call_id")
            if kind in ("function_call_output", "custom_tool_call_output", "function_call") and (
                not isinstance(call_id, str) or not call_id
            ):
                raise errors.BadRequest(
                    f"Missing required parameter: 'input[{index}].call_id'.",
                    param=f"input[{index}].call_id",
                    code="missing_required_parameter",
                )
            if kind == "item_reference" and not isinstance(item.get("id"), str):
                raise errors.BadRequest(
                    f"Missing required parameter: 'input[{index}].id'.",
                    param=f"input[{index}].id",
                    code="missing_required_parameter",
                )
            # Every content part and replayed tool item, field by field (the Conversations models).
            check_input_item(item, f"input[{index}]")
    for index, tool in enumerate(request.tools or ()):
        if not isinstance(tool.get("type"), str):
            raise errors.BadRequest(
                f"Missing required parameter: 'tools[{index}].type'.",
                param=f"tools[{index}].type",
                code="missing_required_parameter",
            )
        if tool["type"] in ("function", "custom") and not isinstance(tool.get("name"), str):
            raise errors.BadRequest(
                f"Missing required parameter: 'tools[{index}].name'.",
                param=f"tools[{index}].name",
                code="missing_required_parameter",
            )
        check_declared_tool(tool, f"tools[{index}]")


def _check_stored_lengths(request: ResponseCreateRequest) -> None:
    """Strings stored in a column are held to its length here, the same on SQLite and PostgreSQL."""
    model_limit, type_limit = _stored_limits()
    errors.refuse_too_long(request.model, "model", model_limit)
    if isinstance(request.input, list):
        for index, item in enumerate(request.input):
            errors.refuse_too_long(item.get("type"), f"input[{index}].type", type_limit)


@cache
def _stored_limits() -> tuple[int, int]:
    """The lengths of ``Response.model`` and ``Item.type``, looked up once (the models are imported
    here, on first use: this module is imported before Django's apps are ready)."""
    from conversations_app.models import Item
    from responses_app.models import Response

    return _max_length(Response, "model"), _max_length(Item, "type")


def _max_length(model: Any, name: str) -> int:
    return int(model._meta.get_field(name).max_length)


# --- prompt_cache_options: the typed mode/TTL subset -------------------------------------------

_PCO_VALUES = {"mode": ("implicit", "explicit"), "ttl": ("30m",)}
_PCO_UNSUPPORTED = ("prewarm", "comparison_response_id")


def check_prompt_cache_options(value: Any, *, supported: bool) -> dict[str, Any] | None:
    """Validate typed-execution ``prompt_cache_options``; absent/null is unset."""
    if value is None:
        return None
    if not supported:
        raise errors.BadRequest(
            "prompt_cache_options is not supported by the configured upstream. An operator can enable "
            "forwarding with [responses] prompt_cache_options_supported = true after verifying it.",
            param="prompt_cache_options",
            code="unsupported_parameter",
        )
    if not isinstance(value, dict):
        raise errors.BadRequest(
            f"Invalid type for 'prompt_cache_options': expected an object, but got "
            f"{errors.json_type_name(value)} instead.",
            param="prompt_cache_options",
            code="invalid_type",
        )
    for key, member in value.items():
        param = f"prompt_cache_options.{key}"
        if key in _PCO_UNSUPPORTED:
            raise errors.BadRequest(
                f"'{param}' is not supported by typed execution.", param=param, code="unsupported_parameter"
            )
        if key not in _PCO_VALUES:
            raise errors.BadRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
        allowed = _PCO_VALUES[key]
        if member not in allowed:
            supported_values = " and ".join(f"'{a}'" for a in allowed)
            raise errors.BadRequest(
                f"Invalid value for '{param}': {orjson.dumps(member).decode()}. "
                f"Supported values are: {supported_values}.",
                param=param,
                code="invalid_value",
            )
    return value
