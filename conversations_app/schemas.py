"""Wire models of the Conversations API and the validation of what clients send.

Items follow the ``openai`` SDK's ``ResponseInputItemParam`` union, checked field by field;
``check_input_item`` applies the same models to a Responses input item. Unknown members are kept
(``extra="allow"``) so newer SDK fields survive a round trip. Every refusal is an OpenAI-shaped
400 whose ``param`` and ``code`` are OpenAI's (``items[0].content[1].text``, ``invalid_type``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
)

from gateway.core import errors
from gateway.core.ids import new_id
from gateway.core.params import (
    METADATA_MAX_KEY_LENGTH,
    METADATA_MAX_PAIRS,
    METADATA_MAX_VALUE_LENGTH,
    validate_metadata,
)

MAX_ITEMS_PER_REQUEST = 20

ROLES = ("user", "assistant", "system", "developer")
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)

# OpenAI's id prefix per item type, which we mint too; other types accept any well-formed id.
ITEM_ID_PREFIXES: dict[str, str] = {
    "message": "msg",
    "function_call": "fc",
    "reasoning": "rs",
    "custom_tool_call": "ctc",
    "mcp_call": "mcp",
    "compaction": "cmp",
    "web_search_call": "ws",
    "file_search_call": "fs",
    "computer_call": "cu",
    "code_interpreter_call": "ci",
    "image_generation_call": "ig",
}
# Ids we mint for types OpenAI does not pin a prefix for.
MINTED_PREFIXES: dict[str, str] = {
    "function_call_output": "fco",
    "custom_tool_call_output": "ctco",
    "computer_call_output": "cuo",
}
GENERIC_ITEM_TYPES = (
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "web_search_call",
    "tool_search_call",
    "tool_search_output",
    "additional_tools",
    "configuration_update",
    "compaction",
    "compaction_trigger",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "program",
    "program_output",
)
ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "custom_tool_call",
    "custom_tool_call_output",
    "item_reference",
    *GENERIC_ITEM_TYPES,
)

# Our ids and OpenAI's: a short lower-case type prefix, "_", then an opaque token.
_ID_SHAPE = re.compile(r"^[a-z]+_[A-Za-z0-9_\-]*$")
MAX_ID_LENGTH = 128


# --------------------------------------------------------------------------------------- content
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class InputText(_Open):
    type: Literal["input_text"]
    text: str


class OutputText(_Open):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] = []


class Refusal(_Open):
    type: Literal["refusal"]
    refusal: str


class InputImage(_Open):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str = "auto"


class InputFile(_Open):
    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


class SummaryText(_Open):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Open):
    type: Literal["reasoning_text"]
    text: str


CONTENT_TYPES = (
    "input_text",
    "output_text",
    "refusal",
    "input_image",
    "input_file",
    "summary_text",
    "reasoning_text",
)
ContentPart = Annotated[
    InputText | OutputText | Refusal | InputImage | InputFile | SummaryText | ReasoningText,
    Discriminator("type"),
]


# ----------------------------------------------------------------------------------------- items
class _Item(_Open):
    id: str | None = None


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class ReasoningItem(_Item):
    type: Literal["reasoning"]
    summary: list[SummaryText]
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


class CustomToolCallItem(_Item):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str


class CustomToolCallOutputItem(_Item):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPart]


# Built-in tool items a client replays: the members the gateway reads typed, the rest kept as sent.
class WebSearchSource(_Open):
    url: str


class WebSearchAction(_Open):
    type: str
    query: str | None = None
    queries: list[str] | None = None
    sources: list[WebSearchSource] | None = None
    url: str | None = None
    pattern: str | None = None


class WebSearchCallItem(_Item):
    type: Literal["web_search_call"]
    action: WebSearchAction | None = None
    status: str | None = None


class CodeInterpreterOutput(_Open):
    type: str
    logs: str | None = None
    url: str | None = None


class CodeInterpreterCallItem(_Item):
    type: Literal["code_interpreter_call"]
    code: str | None = None
    container_id: str | None = None
    outputs: list[CodeInterpreterOutput] | None = None
    status: str | None = None


class McpCallItem(_Item):
    type: Literal["mcp_call"]
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    approval_request_id: str | None = None
    status: str | None = None


class McpListedTool(_Open):
    name: str
    description: str | None = None


class McpListToolsItem(_Item):
    type: Literal["mcp_list_tools"]
    server_label: str
    tools: list[McpListedTool]
    error: str | None = None


class McpApprovalRequestItem(_Item):
    type: Literal["mcp_approval_request"]
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(_Item):
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: StrictBool
    reason: str | None = None


# The other tool items of the SDK union: their members typed (all optional: a replay is kept as sent).
class FileSearchCallItem(_Item):
    type: Literal["file_search_call"]
    queries: list[str] | None = None
    status: str | None = None
    results: list[dict[str, Any]] | None = None


class ComputerCallItem(_Item):
    type: Literal["computer_call"]
    call_id: str | None = None
    action: dict[str, Any] | None = None
    actions: list[dict[str, Any]] | None = None
    pending_safety_checks: list[dict[str, Any]] | None = None
    status: str | None = None


class ComputerCallOutputItem(_Item):
    type: Literal["computer_call_output"]
    call_id: str | None = None
    output: dict[str, Any] | None = None
    acknowledged_safety_checks: list[dict[str, Any]] | None = None
    status: str | None = None


class ImageGenerationCallItem(_Item):
    type: Literal["image_generation_call"]
    result: str | None = None
    status: str | None = None


class LocalShellAction(_Open):
    command: list[str] | None = None
    env: dict[str, str] | None = None
    timeout_ms: int | None = None
    working_directory: str | None = None


class LocalShellCallItem(_Item):
    type: Literal["local_shell_call"]
    call_id: str | None = None
    action: LocalShellAction | None = None
    status: str | None = None


class LocalShellCallOutputItem(_Item):
    type: Literal["local_shell_call_output"]
    output: str | None = None
    status: str | None = None


class ShellAction(_Open):
    commands: list[str] | None = None
    max_output_length: int | None = None
    timeout_ms: int | None = None


class ShellCallItem(_Item):
    type: Literal["shell_call"]
    call_id: str | None = None
    action: ShellAction | None = None
    status: str | None = None


class ShellCallOutputItem(_Item):
    type: Literal["shell_call_output"]
    call_id: str | None = None
    output: list[dict[str, Any]] | None = None
    max_output_length: int | None = None
    status: str | None = None


class PatchOperation(_Open):
    type: str
    path: str | None = None
    diff: str | None = None


class ApplyPatchCallItem(_Item):
    type: Literal["apply_patch_call"]
    call_id: str | None = None
    operation: PatchOperation | None = None
    status: str | None = None


class ApplyPatchCallOutputItem(_Item):
    type: Literal["apply_patch_call_output"]
    call_id: str | None = None
    output: str | None = None
    status: str | None = None


class CompactionItem(_Item):
    type: Literal["compaction"]
    encrypted_content: str | None = None


class ProgramItem(_Item):
    type: Literal["program"]
    call_id: str | None = None
    code: str | None = None
    fingerprint: str | None = None


class ProgramOutputItem(_Item):
    type: Literal["program_output"]
    call_id: str | None = None
    result: str | None = None
    status: str | None = None


class ToolSearchOutputItem(_Item):
    type: Literal["tool_search_output"]
    call_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    status: str | None = None


TYPED_TOOL_ITEMS: dict[str, type[_Item]] = {
    "web_search_call": WebSearchCallItem,
    "code_interpreter_call": CodeInterpreterCallItem,
    "mcp_call": McpCallItem,
    "mcp_list_tools": McpListToolsItem,
    "mcp_approval_request": McpApprovalRequestItem,
    "mcp_approval_response": McpApprovalResponseItem,
    "file_search_call": FileSearchCallItem,
    "computer_call": ComputerCallItem,
    "computer_call_output": ComputerCallOutputItem,
    "image_generation_call": ImageGenerationCallItem,
    "local_shell_call": LocalShellCallItem,
    "local_shell_call_output": LocalShellCallOutputItem,
    "shell_call": ShellCallItem,
    "shell_call_output": ShellCallOutputItem,
    "apply_patch_call": ApplyPatchCallItem,
    "apply_patch_call_output": ApplyPatchCallOutputItem,
    "compaction": CompactionItem,
    "program": ProgramItem,
    "program_output": ProgramOutputItem,
    "tool_search_output": ToolSearchOutputItem,
}


class ItemReference(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["item_reference"]
    id: str


class GenericItem(_Item):
    type: Literal[GENERIC_ITEM_TYPES]  # type: ignore[valid-type]  # the tags _item_tag sends here


def _item_tag(value: Any) -> str | None:
    """The union member for ``value``: its ``type``; a typeless item with a role is a message."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind is None and "role" in value:
        return "message"
    if kind in GENERIC_ITEM_TYPES:
        return "generic"
    return kind if isinstance(kind, str) else None


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ItemReference, Tag("item_reference")]
    | Annotated[GenericItem, Tag("generic")],
    Discriminator(_item_tag),
]
_ITEM_ADAPTER: TypeAdapter[Any] = TypeAdapter(InputItem)
# Each typed tool item by its own model (the union's tags stay the core items above).
_TOOL_ITEM_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    kind: TypeAdapter(model) for kind, model in TYPED_TOOL_ITEMS.items()
}


def _validate_item(raw: dict[str, Any]) -> Any:
    adapter = _TOOL_ITEM_ADAPTERS.get(raw.get("type"))  # type: ignore[arg-type]
    return (adapter or _ITEM_ADAPTER).validate_python(raw)


# ------------------------------------------------------------------------------ request bodies
Metadata = Annotated[
    Annotated[
        dict[
            Annotated[str, StringConstraints(max_length=METADATA_MAX_KEY_LENGTH)],
            Annotated[str, StringConstraints(max_length=METADATA_MAX_VALUE_LENGTH)],
        ],
        Field(max_length=METADATA_MAX_PAIRS),
    ]
    | None,
    Field(description="Up to 16 pairs; keys up to 64 characters, values up to 512; `null` clears."),
]
Items = Annotated[list[InputItem], Field(max_length=MAX_ITEMS_PER_REQUEST)]


class _Params(BaseModel):
    """A request body. The model describes it (the OpenAPI document); :meth:`parse` checks it
    with the rules below, whose refusals are OpenAI's exact 400s (``param``, ``code``)."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def parse(cls, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.BadRequest("The request body must be a JSON object.", code="invalid_json")
        for key in body:
            if key not in cls.model_fields:
                raise errors.BadRequest(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
        return cls.check(body)

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class ConversationCreateParams(_Params):
    items: Items | None = Field(None, description="Up to 20 initial items, stored atomically.")
    metadata: Metadata = None

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "items": validate_items(body.get("items"), required=False),
            "metadata": validate_metadata(body.get("metadata")),
        }


class ConversationUpdateParams(_Params):
    metadata: Metadata

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        if "metadata" not in body:
            raise missing_parameter("metadata")
        return {"metadata": validate_metadata(body["metadata"])}


class ItemCreateParams(_Params):
    items: Annotated[Items, Field(min_length=1)]

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        return {"items": validate_items(body.get("items"), required=True)}


# -------------------------------------------------------------------------------------- answers
class ConversationObject(BaseModel):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int = Field(description="Unix seconds.")
    metadata: dict[str, str]


class ConversationDeleted(BaseModel):
    id: str
    object: Literal["conversation.deleted"]
    deleted: bool


class ConversationItem(_Open):
    """An item as the API returns it (:func:`render_item`): its type's own members besides these."""

    id: str
    type: str


class NewItem(BaseModel):
    """One validated item of a request: either stored data to create, or a reference."""

    id: str
    type: str
    data: dict[str, Any] | None  # None: a reference to an already stored item
    param: str


# ------------------------------------------------------------------------------------ validation
invalid_type = errors.invalid_type


invalid_value = errors.invalid_value
missing_parameter = errors.missing_parameter


def invalid_id(param: str, value: str, prefix: str) -> errors.BadRequest:
    return errors.BadRequest(
        f"Invalid '{param}': '{value}'. Expected an ID that begins with '{prefix}'.",
        param=param,
        code="invalid_value",
    )


def _check_id(param: str, value: Any, kind: str) -> str:
    if not isinstance(value, str):
        raise invalid_type(param, "a string", value)
    prefix = ITEM_ID_PREFIXES.get(kind)
    if prefix is not None and not value.startswith(prefix + "_"):
        raise invalid_id(param, value, prefix)
    if len(value) > MAX_ID_LENGTH or not _ID_SHAPE.match(value):
        raise errors.BadRequest(
            f"Invalid '{param}': '{value}'. Expected an ID made of a type prefix, '_' and letters, "
            f"digits, '_' or '-' (at most {MAX_ID_LENGTH} characters).",
            param=param,
            code="invalid_value",
        )
    return value


def _normalize_message(data: dict[str, Any]) -> dict[str, Any]:
    content = data["content"]
    if isinstance(content, str):
        part = "output_text" if data["role"] == "assistant" else "input_text"
        text: dict[str, Any] = {"type": part, "text": content}
        if part == "output_text":
            text["annotations"] = []
        data["content"] = [text]
    return data


def validate_item(raw: Any, param: str) -> NewItem:
    """One request item, validated and normalized to what the API returns, or a reference."""
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    tag = _item_tag(raw)
    if tag is None or (tag != "generic" and tag not in ITEM_TYPES):
        if "type" not in raw:
            raise missing_parameter(param + ".type")
        if not isinstance(raw["type"], str):
            raise invalid_type(param + ".type", "a string", raw["type"])
        raise invalid_value(param + ".type", raw["type"], ITEM_TYPES)
    if tag == "generic":
        if "id" in raw and raw["id"] is not None:
            _check_id(param + ".id", raw["id"], raw["type"])
    elif "id" in raw and raw["id"] is not None:
        _check_id(param + ".id", raw["id"], tag)
    _refuse_reserved(raw, param)
    try:
        model = _validate_item(raw)
    except ValidationError as exc:
        raise errors.validation_error(exc, raw, param=param, tags=CONTENT_TYPES) from None
    if isinstance(model, ItemReference):
        return NewItem(id=model.id, type="item_reference", data=None, param=param + ".id")
    errors.refuse_nul(raw, param)
    # Tool items of the union beyond the core ones are checked, then stored as sent.
    data = dict(raw) if tag == "generic" else model.model_dump(mode="json", exclude_none=False)
    kind = data["type"]
    # Unsent optional members stay out (OpenAI's output has no nulls for them); API defaults stay in.
    for key in [k for k, v in data.items() if v is None and k not in raw]:
        del data[key]
    if kind == "message":
        data = _normalize_message(data)
    item_id = data.get("id") or new_id(ITEM_ID_PREFIXES.get(kind) or MINTED_PREFIXES.get(kind, "item"))
    data = {"id": item_id, **{k: v for k, v in data.items() if k != "id"}}
    return NewItem(id=item_id, type=kind, data=data, param=param)


def _refuse_reserved(raw: dict[str, Any], param: str) -> None:
    """Members named ``_…`` are the gateway's own (a tool call's private model view): never a client's."""
    for key in raw:
        if isinstance(key, str) and key.startswith("_"):
            raise errors.BadRequest(
                f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}", code="unknown_parameter"
            )


def check_input_item(raw: Any, param: str) -> None:
    """One Responses input item against the same models (``param``: ``input[0]``); types not modelled
    here pass unchanged."""
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    tag = _item_tag(raw)
    if tag is None:
        if "type" not in raw:
            raise missing_parameter(param + ".type")
        raise invalid_type(param + ".type", "a string", raw["type"])
    _refuse_reserved(raw, param)
    if tag != "generic" and tag not in ITEM_TYPES:
        return
    try:
        _validate_item(raw)
    except ValidationError as exc:
        raise errors.validation_error(exc, raw, param=param, tags=CONTENT_TYPES) from None


def validate_items(raw: Any, *, param: str = "items", required: bool) -> list[NewItem]:
    if raw is None:
        if required:
            raise missing_parameter(param)
        return []
    if not isinstance(raw, list):
        raise invalid_type(param, "an array", raw)
    if len(raw) > MAX_ITEMS_PER_REQUEST:
        raise errors.BadRequest(
            f"Invalid '{param}': array too long. Expected an array with maximum length "
            f"{MAX_ITEMS_PER_REQUEST}, but got an array with length {len(raw)} instead.",
            param=param,
            code="array_above_max_length",
        )
    if required and not raw:
        raise errors.BadRequest(
            f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param=param,
            code="empty_array",
        )
    return [validate_item(item, f"{param}[{i}]") for i, item in enumerate(raw)]


# ---------------------------------------------------------------------------------- list options
def validate_include(values: list[str]) -> tuple[str, ...]:
    for value in values:
        if value not in INCLUDABLE:
            raise invalid_value("include", value, INCLUDABLE)
    return tuple(values)


def query_include(query: Any) -> list[str]:
    """``include`` as the SDK sends it (``include=a&include=b``) or with brackets (``include[]=a``)."""
    return [*query.getlist("include"), *query.getlist("include[]")]


def render_item(data: dict[str, Any], include: tuple[str, ...] = ()) -> dict[str, Any]:
    """An item as the API returns it; members only sent when asked for with ``include``."""
    view = data.get("_gateway")
    if "_gateway" in data:  # the model's private view of a gateway tool item (responses_app.engine.tool_loop)
        data = {k: v for k, v in data.items() if k != "_gateway"}
    if data.get("type") == "file_search_call":
        # Results are kept with the model's view; shown only when asked for, whatever the create asked.
        results = view.get("results") if isinstance(view, dict) else data.get("results")
        shown = "file_search_call.results" in include and isinstance(results, list)
        data = {**data, "results": results if shown else None}
    if (
        data.get("type") == "reasoning"
        and "reasoning.encrypted_content" not in include
        and "encrypted_content" in data
    ):
        data = {k: v for k, v in data.items() if k != "encrypted_content"}
    if data.get("type") == "message" and isinstance(data.get("content"), list):
        # An assistant's output_text always carries ``logprobs`` (OpenAI sends []); other parts never do.
        keep = "message.output_text.logprobs" in include
        data = dict(data)
        data["content"] = [_logprobs(part, keep) for part in data["content"]]
    return data


def _logprobs(part: Any, keep: bool) -> Any:
    if not isinstance(part, dict):
        return part
    if part.get("type") != "output_text":
        return {k: v for k, v in part.items() if k != "logprobs"} if "logprobs" in part else part
    logprobs = part.get("logprobs") if keep else None
    return {**part, "logprobs": logprobs if isinstance(logprobs, list) else []}
