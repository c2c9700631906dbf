"""Client tool declarations: the typed models of the tools the executor reads (``function``,
``custom``, ``namespace``; other tool types have their own checks), used for a request's
``tools`` (``schemas``) and for the tools a client tool search loaded (``features``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError

from gateway.core import errors


class _Declared(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionTool(_Declared):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class CustomToolFormat(_Declared):
    type: str
    syntax: str | None = None
    definition: str | None = None


class CustomTool(_Declared):
    type: Literal["custom"]
    name: str
    description: str | None = None
    format: CustomToolFormat | None = None


class NamespaceTool(_Declared):
    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[dict[str, Any]]


_TOOL_MODELS: dict[str, type[_Declared]] = {
    "function": FunctionTool,
    "custom": CustomTool,
    "namespace": NamespaceTool,
}


def check_declared_tool(tool: dict[str, Any], param: str, *, members: tuple[str, ...] = ()) -> None:
    kind = tool.get("type")
    if members and kind not in members:
        if not isinstance(kind, str):
            raise errors.invalid_type(f"{param}.type", "a string", kind)
        raise errors.BadRequest(
            f"Invalid value: '{kind}'. Supported values are: "
            + " and ".join(f"'{m}'" for m in members)
            + ".",
            param=f"{param}.type",
            code="invalid_value",
        )
    model = _TOOL_MODELS.get(str(kind))
    if model is None:
        return
    try:
        model.model_validate(tool)
    except ValidationError as exc:
        raise errors.validation_error(exc, tool, param=param) from None
    if kind == "namespace":
        for index, member in enumerate(tool["tools"]):
            check_declared_tool(member, f"{param}.tools[{index}]", members=("function", "custom"))
