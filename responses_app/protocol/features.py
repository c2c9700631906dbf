"""What the gateway does with each part of a ``responses.create`` request: honour it, forward it on
purpose, or refuse it.

A feature it does not implement is refused with a 400 naming its ``param`` before any lookup,
storage or inference, on every route (``docs/responses.md`` has the table in prose).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.core import errors
from inference_app.tools.base import CLIENT_TOOL_TYPES, GATEWAY_TOOL_TYPES
from inference_app.tools.file_search import check_declaration as check_file_search
from responses_app.features import async_tools, compaction
from responses_app.protocol.multi_agent_config import AGENT_ITEM_TYPES, multi_agent_config
from responses_app.protocol.tool_decls import check_declared_tool

# Tools the gateway runs itself or hands to the client (``tool_search``: either execution).
RUNNABLE_TOOL_TYPES = CLIENT_TOOL_TYPES | GATEWAY_TOOL_TYPES | {"tool_search"}
# What a tool search may load (``tool_search_output.tools``).
LOADABLE_TOOL_TYPES = frozenset({"function", "custom", "namespace"})
# Tool types the OpenAI SDK defines that need a capability the gateway does not have.
UNRUNNABLE_TOOL_TYPES = frozenset(
    {
        "computer",
        "computer_use_preview",
        "image_generation",
        "programmatic_tool_calling",
    }
)

# Input item types the gateway translates for the model (and stores).
KNOWN_ITEM_TYPES = frozenset(
    {
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "web_search_call",
        "code_interpreter_call",
        "file_search_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "item_reference",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "tool_search_call",
        "tool_search_output",
        "compaction",
        "compaction_trigger",
        # Multi-agent public items: accepted, stored, never given to a model (multi_agent_config).
        *AGENT_ITEM_TYPES,
    }
)
# Items of the SDK's input union for capabilities the gateway does not have.
UNRUNNABLE_ITEM_TYPES = frozenset(
    {
        "computer_call",
        "computer_call_output",
        "image_generation_call",
        "additional_tools",
        "configuration_update",
        "program",
        "program_output",
    }
)
# Top-level request fields the gateway does not implement: refused when set (non-null).
UNBUILT_FIELDS: tuple[str, ...] = ()
# OpenAI-only request fields with no meaning in front of vLLM: refused when set (non-null).
REFUSED_FIELDS = ("access_programs", "background_options", "image", "moderation", "prompt")


def _unsupported(message: str, param: str) -> errors.BadRequest:
    return errors.BadRequest(message, param=param, code="unsupported_parameter")


def refuse_unsupported(raw: Mapping[str, Any]) -> None:
    """Raise the 400 for the first part of ``raw`` the gateway does not implement."""
    async_tools.check_multi_agent(raw)  # before multi-agent's own checks: its exact 400 comes first
    compaction.compact_threshold(raw.get("context_management"))  # malformed entries: 400 with param
    for name in UNBUILT_FIELDS:
        if raw.get(name) is not None:
            raise _unsupported(f"'{name}' is not supported by this gateway yet.", name)
    refuse_hosted_fields(raw)
    multi_agent_config(raw)  # multi-agent mode (beta): its own refusals
    tools = raw.get("tools")
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            if isinstance(tool, Mapping):
                _check_tool(tool, f"tools[{index}]")
    items = raw.get("input")
    if isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, Mapping):
                _check_item(item, f"input[{index}]")
        compaction.check_trigger_position(items)


def refuse_hosted_fields(raw: Mapping[str, Any]) -> None:
    """The 400 for a :data:`REFUSED_FIELDS` field set (non-null); ``POST /v1/responses/compact``
    answers them the same way."""
    for name in REFUSED_FIELDS:
        if raw.get(name) is not None:
            raise _unsupported(f"'{name}' is not supported by this gateway.", name)


def _check_tool(tool: Mapping[str, Any], param: str) -> None:
    kind = tool.get("type")
    if not isinstance(kind, str):
        return  # the typed request model reports the missing type
    if kind in UNRUNNABLE_TOOL_TYPES:
        raise errors.BadRequest(
            f"Tool type '{kind}' is not supported by this gateway.",
            param=f"{param}.type",
            code="unsupported_value",
        )
    if kind not in RUNNABLE_TOOL_TYPES:
        raise errors.BadRequest(
            f"Invalid value: '{kind}'. Unknown tool type.", param=f"{param}.type", code="invalid_value"
        )
    async_tools.check_tool_declaration(tool, param)
    if kind == "file_search":
        check_file_search(tool, param)
    if kind == "tool_search":
        _check_execution(tool.get("execution"), f"{param}.execution")
    if kind == "tool_search" and tool.get("execution") != "client" and tool.get("parameters") is not None:
        # The gateway's own search takes a query; a parameter schema is the client's business.
        raise _unsupported(
            "'parameters' applies to a client-executed tool search ('execution': 'client') only; "
            "the gateway's own search takes a 'query'.",
            f"{param}.parameters",
        )
    if kind == "tool_search":
        for field, expected, types in (("description", "a string", str), ("parameters", "an object", dict)):
            value = tool.get(field)
            if value is not None and not isinstance(value, types):
                raise errors.invalid_type(f"{param}.{field}", expected, value)


def _check_item(item: Mapping[str, Any], param: str) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    if not isinstance(kind, str):
        return  # the typed request model reports the missing or mistyped type
    if kind in UNRUNNABLE_ITEM_TYPES:
        raise errors.BadRequest(
            f"Input items of type '{kind}' are not supported by this gateway.",
            param=param,
            code="unsupported_value",
        )
    if kind not in KNOWN_ITEM_TYPES:
        raise errors.BadRequest(
            f"Invalid value: '{kind}'. Unknown input item type.", param=param, code="invalid_value"
        )
    async_tools.check_item(item, kind, param)
    if kind in ("tool_search_call", "tool_search_output"):
        _check_tool_search_item(item, param)
    if kind in CLIENT_CALL_FIELDS:
        _check_client_call_item(item, kind, param)
    if kind == "compaction":
        compaction.check_compaction_item(dict(item), param)


# Client tool call items and their outputs: the fields the gateway needs (besides the typed
# shapes), in the SDK's order. A ``local_shell_call_output`` names its call by ``call_id`` or, as the
# SDK types it, by ``id``.
CLIENT_CALL_FIELDS: dict[str, tuple[str, ...]] = {
    "apply_patch_call": ("call_id", "operation"),
    "apply_patch_call_output": ("call_id", "status"),
    "local_shell_call": ("call_id", "action"),
    "local_shell_call_output": ("call_id", "output"),
}


def _check_client_call_item(item: Mapping[str, Any], kind: str, param: str) -> None:
    for name in CLIENT_CALL_FIELDS[kind]:
        value = item.get(name)
        if name == "call_id" and kind == "local_shell_call_output" and value is None:
            value = item.get("id")
        if value is None or value == "":
            raise errors.BadRequest(
                f"Missing required parameter: '{param}.{name}'.",
                param=f"{param}.{name}",
                code="missing_required_parameter",
            )
    status = item.get("status")
    if kind == "apply_patch_call_output" and status not in ("completed", "failed"):
        shown = f"'{status}'" if isinstance(status, str) else errors.json_type_name(status)
        raise errors.BadRequest(
            f"Invalid value: {shown}. Supported values are: 'completed' and 'failed'.",
            param=f"{param}.status",
            code="invalid_value",
        )


def _check_execution(value: Any, param: str) -> None:
    if value is not None and value not in ("server", "client"):
        shown = f"'{value}'" if isinstance(value, str) else errors.json_type_name(value)
        raise errors.BadRequest(
            f"Invalid value: {shown}. Supported values are: 'server' and 'client'.",
            param=param,
            code="invalid_value",
        )


def _check_tool_search_item(item: Mapping[str, Any], param: str) -> None:
    """Tool-search state (either execution): a call and its output pair by ``call_id``; the output
    loads tools the model can call."""
    _check_execution(item.get("execution"), f"{param}.execution")
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:  # a client call and its output pair by call_id
        raise errors.BadRequest(
            f"Missing required parameter: '{param}.call_id'.",
            param=f"{param}.call_id",
            code="missing_required_parameter",
        )
    if item.get("type") != "tool_search_output":
        return
    tools = item.get("tools")
    if tools is None:
        raise errors.BadRequest(
            f"Missing required parameter: '{param}.tools'.",
            param=f"{param}.tools",
            code="missing_required_parameter",
        )
    if not isinstance(tools, list):
        raise errors.invalid_type(f"{param}.tools", "an array", tools)
    for index, tool in enumerate(tools):
        where = f"{param}.tools[{index}]"
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind not in LOADABLE_TOOL_TYPES:
            raise errors.BadRequest(
                f"Invalid value: {kind!r}. A client tool search can load 'function', 'custom' and "
                "'namespace' tools only.",
                param=f"{where}.type",
                code="unsupported_value",
            )
        # Typed like a declared tool (the same check), then held to what the gateway builds.
        check_declared_tool(dict(tool), where)
        _check_tool(tool, where)


def refuse_executor_only(raw: Mapping[str, Any]) -> None:
    """Parts the executor cannot serve yet (direct routing passes them to the upstream as sent):
    files given as ``file_data`` or ``file_url``, and images given by ``file_id``."""
    items = raw.get("input")
    if not isinstance(items, list):
        return
    for index, item in enumerate(items):
        content = item.get("content") if isinstance(item, Mapping) else None
        if not isinstance(content, list):
            continue
        for part_index, part in enumerate(content):
            if not isinstance(part, Mapping):
                continue
            if part.get("type") == "input_file" and part.get("file_id") is None:
                # By file_id the gateway reads its own files (responses_app.storage.input_files).
                raise _unsupported(
                    "'input_file' content is supported by 'file_id' only on this route: upload the file "
                    "with the Files API and name it by its id ('file_data' and 'file_url' are not supported).",
                    f"input[{index}].content[{part_index}]",
                )
            if part.get("type") == "input_image" and part.get("file_id") is not None:
                raise _unsupported(
                    "'input_image' with a 'file_id' is not supported on this route yet: the gateway cannot "
                    "resolve files; send the image as 'image_url' (a URL or a data URL).",
                    f"input[{index}].content[{part_index}]",
                )
