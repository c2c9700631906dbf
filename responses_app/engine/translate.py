"""The one items ↔ messages module: ``normalize_input``, ``output_to_input`` and ``items_to_messages``.

System and developer text becomes one leading system message for Chat Completions upstreams,
because several chat templates refuse a second system message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.core import errors
from gateway.core.ids import new_id
from inference_app.tools.base import WEB_SEARCH_TYPES

# Our public id prefix for each stored item type.
ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
    "shell_call": "sh",
    "shell_call_output": "sho",
    "apply_patch_call": "apc",
    "apply_patch_call_output": "apco",
    "local_shell_call": "lsc",
    "local_shell_call_output": "lsco",
    "tool_search_call": "tsc",
    "tool_search_output": "tso",
    "compaction": "cmp",
}

CALL_TYPES = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "local_shell_call": "local_shell_call_output",
    "tool_search_call": "tool_search_output",
}
OUTPUT_TYPES = {v: k for k, v in CALL_TYPES.items()}


def mint_item_id(item_type: str) -> str:
    return new_id(ID_PREFIX.get(item_type, "item"))


def _text_part(role: str, text: str) -> dict[str, Any]:
    if role == "assistant":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": "input_text", "text": text}


def normalize_input(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Request ``input`` as a list of typed input items (``type`` always set)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [_text_part("user", value)]}]
    items: list[dict[str, Any]] = []
    for raw in value:
        item = dict(raw)
        kind = item.setdefault("type", "message")
        if kind == "message" and isinstance(item.get("content"), str):
            role = str(item.get("role", "user"))
            item["content"] = [_text_part(role, item["content"])]
        elif kind == "local_shell_call_output" and "call_id" not in item and isinstance(item.get("id"), str):
            # The SDK's output names its call by ``id`` (OpenAI's guide sends ``call_id``): pair by it.
            item["call_id"] = item.pop("id")
        items.append(item)
    return items


def output_to_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the input item that replays it (the one output→input conversion)."""
    kind = item.get("type")
    if kind == "message":
        parts = []
        for part in item.get("content") or ():
            part = dict(part)
            part.pop("logprobs", None)  # not an input field
            parts.append(part)
        out = {k: v for k, v in item.items() if k != "content"}
        out["content"] = parts
        return out
    if kind == "reasoning":
        return {k: v for k, v in item.items() if v is not None}
    return item


# --- Chat Completions rendering ----------------------------------------------------------------


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
    return "".join(texts)


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    """User content as a plain string, or chat content parts when it carries images."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    has_media = False
    for part in content or ():
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            has_media = True
            url = part.get("image_url") or part.get("file_id") or ""
            image: dict[str, Any] = {"url": url}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file" and part.get("file_data"):
            has_media = True
            parts.append({"type": "file", "file": {"file_data": part["file_data"]}})
    if not has_media:
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(value: Any) -> str:
    """A tool output (string or content parts) as the text of a ``tool`` message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _content_text(value)
    return orjson.dumps(value).decode()


def items_to_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items → Chat Completions messages."""
    system_parts: list[str] = [instructions] if instructions else []
    messages: list[dict[str, Any]] = []
    pending_reasoning: list[str] = []
    assistant: dict[str, Any] | None = None  # the assistant message being assembled

    def flush_assistant() -> None:
        nonlocal assistant
        if assistant is not None:
            messages.append(assistant)
            assistant = None

    def open_assistant() -> dict[str, Any]:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": None}
            if pending_reasoning:
                assistant["reasoning"] = "".join(pending_reasoning)
                pending_reasoning.clear()
        return assistant

    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role in ("system", "developer"):
                text = _content_text(item.get("content"))
                if text:
                    system_parts.append(text)
                continue
            if role == "assistant":
                msg = open_assistant()
                if msg.get("tool_calls"):
                    flush_assistant()
                    msg = open_assistant()
                text = _content_text(item.get("content"))
                msg["content"] = (msg["content"] or "") + text
                continue
            flush_assistant()
            messages.append({"role": "user", "content": _user_content(item.get("content"))})
        elif kind == "reasoning":
            flush_assistant()
            text = "".join(
                part.get("text", "") for part in item.get("content") or () if isinstance(part, dict)
            ) or "".join(part.get("text", "") for part in item.get("summary") or () if isinstance(part, dict))
            if text:
                pending_reasoning.append(text)
        elif kind in ("function_call", "custom_tool_call"):
            msg = open_assistant()
            arguments = item.get("arguments", "")
            if kind == "custom_tool_call":
                arguments = orjson.dumps({"input": item.get("input", "")}).decode()
            msg.setdefault("tool_calls", []).append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": arguments},
                }
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            flush_assistant()
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _output_text(item.get("output")),
                }
            )
        # Other item types (gateway tool calls, compaction) have no chat rendering yet.
    flush_assistant()
    if system_parts:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system_parts)})
    return messages


def tools_to_chat(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Client tools as Chat Completions function tools (see :class:`ToolMap`)."""
    return ToolMap.build(tools).chat_tools()


def tool_choice_to_chat(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and choice.get("name"):  # already mapped by ToolMap
        return {"type": "function", "function": {"name": choice["name"]}}
    return None


def text_to_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


# --- client tool declarations as the upstream sees them -----------------------------------------

# Longest function name the OpenAI tool schema allows, which vLLM's parsers and templates assume.
MAX_TOOL_NAME = 64
_SHORT_HASH = 8
# A namespace member ``ns`` / ``fn`` reaches the model as one flat function ``ns__fn``.
NAMESPACE_SEPARATOR = "__"
SEARCH_TOOL_TYPES = WEB_SEARCH_TYPES


def upstream_tool_name(name: str) -> str:
    """``name`` if it fits in 64 characters, else a stable shortened form (prefix + hash)."""
    if len(name) <= MAX_TOOL_NAME:
        return name
    import hashlib

    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:_SHORT_HASH]
    return f"{name[: MAX_TOOL_NAME - _SHORT_HASH - 1]}_{digest}"


@dataclass(frozen=True)
class ClientTool:
    """One client-executed tool: how the client declared it and the name the upstream sees."""

    kind: str  # function | custom | shell | apply_patch | local_shell | tool_search
    name: str
    namespace: str | None
    upstream_name: str
    declaration: dict[str, Any]


@dataclass
class ToolMap:
    """The request's tools as the upstream model sees them, and the way back.

    ``namespace`` members become functions ``<namespace>__<name>``; ``custom`` tools become functions
    taking one string ``input``; the client-owned ``shell``, ``apply_patch``, ``local_shell`` and
    ``tool_search`` become functions (:data:`FIXED_FUNCTIONS`). Names over 64 characters are shortened
    stably, and two tools reaching the model under one name are refused. ``web_search`` is withheld
    without a search provider. Tools loaded by a tool search join through :meth:`load`.
    """

    client: list[ClientTool] = field(default_factory=list)
    forwarded: list[dict[str, Any]] = field(default_factory=list)
    by_upstream: dict[str, ClientTool] = field(default_factory=dict)
    by_client: dict[tuple[str | None, str], ClientTool] = field(default_factory=dict)

    @classmethod
    def build(cls, tools: list[dict[str, Any]] | None, *, search_available: bool = False) -> ToolMap:
        out = cls()
        for index, tool in enumerate(tools or ()):
            kind = tool.get("type")
            if kind in ("function", "custom") and tool.get("defer_loading") is True:
                continue  # deferred: the model sees it once a tool_search_output loads it (load())
            if kind in ("function", "custom"):
                out._add(index, kind, tool, None)
            elif kind in FIXED_FUNCTIONS:
                out._add(index, kind, {**tool, "name": FIXED_FUNCTIONS[kind][0]}, None)
            elif kind == "tool_search" and tool.get("execution") == "client":
                out._add(index, "tool_search", {**tool, "name": TOOL_SEARCH_FUNCTION}, None)
            elif kind == "tool_search":
                continue  # server-executed: the tool loop offers it and runs it (responses_app.engine.tool_search)
            elif kind == "namespace":
                namespace = tool.get("name")
                if not isinstance(namespace, str) or not namespace:
                    raise errors.BadRequest(
                        f"Missing required parameter: 'tools[{index}].name'.",
                        param=f"tools[{index}].name",
                        code="missing_required_parameter",
                    )
                for member in tool.get("tools") or ():
                    if (
                        isinstance(member, dict)
                        and member.get("type") in ("function", "custom")
                        and member.get("defer_loading") is not True
                    ):
                        out._add(index, member["type"], member, namespace)
            elif kind in SEARCH_TOOL_TYPES and not search_available:
                continue  # withheld: no search provider is configured
            else:
                out.forwarded.append(tool)
        return out

    def _add(self, index: int, kind: str, declaration: dict[str, Any], namespace: str | None) -> None:
        name = declaration.get("name")
        if not isinstance(name, str) or not name:
            raise errors.BadRequest(
                f"Missing required parameter: 'tools[{index}].name'.",
                param=f"tools[{index}].name",
                code="missing_required_parameter",
            )
        flat = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name
        upstream = upstream_tool_name(flat)
        if upstream in self.by_upstream:
            other = self.by_upstream[upstream]
            first = f"{other.namespace}.{other.name}" if other.namespace else other.name
            this = f"{namespace}.{name}" if namespace else name
            raise errors.BadRequest(
                f"Invalid 'tools[{index}]': tool '{this}' reaches the model under the same name "
                f"'{upstream}' as tool '{first}'. Tool names must be unique after namespace "
                "flattening and shortening to 64 characters.",
                param=f"tools[{index}]",
                code="tool_name_collision",
            )
        tool = ClientTool(kind, name, namespace, upstream, declaration)
        self.client.append(tool)
        self.by_upstream[upstream] = tool
        self.by_client[(namespace, name)] = tool

    def load(self, items: list[dict[str, Any]]) -> None:
        """Add the tools loaded by the ``tool_search_output`` items of ``items``; a flat name already taken
        is not added again."""
        for item in items:
            if item.get("type") != "tool_search_output" or not isinstance(item.get("tools"), list):
                continue
            for tool in item["tools"]:
                if not isinstance(tool, dict):
                    continue
                if tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
                    members = [(m, tool["name"]) for m in tool.get("tools") or () if isinstance(m, dict)]
                else:
                    members = [(tool, None)]
                for member, namespace in members:
                    name = member.get("name")
                    if (
                        member.get("type") not in ("function", "custom")
                        or not isinstance(name, str)
                        or not name
                    ):
                        continue
                    flat = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name
                    if upstream_tool_name(flat) not in self.by_upstream:
                        self._add(-1, member["type"], member, namespace)  # checked: no refusal

    def restore(self, upstream_name: str) -> ClientTool | None:
        return self.by_upstream.get(upstream_name)

    def _function(self, tool: ClientTool) -> dict[str, Any]:
        """The flat function declaration (Responses shape) for one client tool."""
        d = tool.declaration
        if tool.kind in FIXED_FUNCTIONS:
            return {"type": "function", "name": tool.upstream_name, **FIXED_FUNCTIONS[tool.kind][1]}
        if tool.kind == "tool_search":
            return {
                "type": "function",
                "name": tool.upstream_name,
                "description": d.get("description") or TOOL_SEARCH_DECLARATION["description"],
                "parameters": d.get("parameters") or TOOL_SEARCH_DECLARATION["parameters"],
            }
        if tool.kind == "custom":
            description = d.get("description") or ""
            fmt = d.get("format")
            if isinstance(fmt, dict) and fmt.get("type") == "grammar" and fmt.get("definition"):
                description += f"\n\nThe input must match this {fmt.get('syntax', '')} grammar:\n"
                description += str(fmt["definition"])
            return {
                "type": "function",
                "name": tool.upstream_name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string"}},
                    "required": ["input"],
                },
            }
        out: dict[str, Any] = {"type": "function", "name": tool.upstream_name}
        if d.get("description") is not None:
            out["description"] = d["description"]
        out["parameters"] = d.get("parameters") or {"type": "object", "properties": {}}
        if d.get("strict") is not None:
            out["strict"] = d["strict"]
        return out

    def responses_tools(self) -> list[dict[str, Any]]:
        return [self._function(tool) for tool in self.client] + list(self.forwarded)

    def chat_tools(self) -> list[dict[str, Any]]:
        out = []
        for tool in self.client:
            flat = self._function(tool)
            flat.pop("type")
            out.append({"type": "function", "function": flat})
        return out

    def upstream_item(self, item: dict[str, Any]) -> dict[str, Any]:
        """A history item as the upstream sees it (flat names; custom calls as function calls)."""
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):
            tool = self.by_client.get((item.get("namespace"), str(item.get("name", ""))))
            name = tool.upstream_name if tool else upstream_tool_name(str(item.get("name", "")))
            out = {k: v for k, v in item.items() if k not in ("namespace", "input")}
            out["type"] = "function_call"
            out["name"] = name
            if kind == "custom_tool_call":
                out["arguments"] = orjson.dumps({"input": item.get("input", "")}).decode()
            return out
        if kind == "custom_tool_call_output":
            out = dict(item)
            out["type"] = "function_call_output"
            return out
        if kind in FIXED_CALLS:
            tool_kind, field_name = FIXED_CALLS[kind]
            name = FIXED_FUNCTIONS[tool_kind][0]
            tool = self.by_client.get((None, name))
            return {
                "type": "function_call",
                "id": item.get("id"),
                "call_id": item.get("call_id"),
                "name": tool.upstream_name if tool else name,
                "arguments": orjson.dumps(item.get(field_name) or {}).decode(),
                "status": "completed",
            }
        if kind == "tool_search_call":
            tool = self.by_client.get((None, TOOL_SEARCH_FUNCTION))
            arguments = item.get("arguments")
            return {
                "type": "function_call",
                "id": item.get("id"),
                "call_id": item.get("call_id"),
                "name": tool.upstream_name if tool else TOOL_SEARCH_FUNCTION,
                "arguments": arguments
                if isinstance(arguments, str)
                else orjson.dumps(arguments or {}).decode(),
                "status": "completed",
            }
        if kind in ("shell_call_output", "tool_search_output"):
            return {
                "type": "function_call_output",
                "call_id": item.get("call_id"),
                "output": orjson.dumps(
                    item.get("output" if kind == "shell_call_output" else "tools") or []
                ).decode(),
            }
        if kind == "apply_patch_call_output":
            # The model needs the status (a failed patch) as much as the log text.
            result = {"status": item.get("status"), "output": item.get("output")}
            return {
                "type": "function_call_output",
                "call_id": item.get("call_id"),
                "output": orjson.dumps(result).decode(),
            }
        if kind == "local_shell_call_output":
            output = item.get("output")  # already a JSON string of the command's result
            return {
                "type": "function_call_output",
                "call_id": item.get("call_id"),
                "output": _output_text(output),
            }
        return item

    def tool_choice(self, choice: Any) -> Any:
        """A named ``tool_choice`` pointing at a client tool, with the name the upstream sees."""
        if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
            tool = self.by_client.get((choice.get("namespace"), str(choice.get("name", ""))))
            if tool is not None:
                return {"type": "function", "name": tool.upstream_name}
        if isinstance(choice, dict) and choice.get("type") == "apply_patch":
            tool = self.by_client.get((None, APPLY_PATCH_FUNCTION))
            if tool is not None:
                return {"type": "function", "name": tool.upstream_name}
        return choice


# --- the client-owned shell tool ---------------------------------------------------------------

# The model sees the shell tool as this function; the client's ``shell_call_output`` comes back as
# its output.
SHELL_FUNCTION = "shell"
SHELL_DECLARATION: dict[str, Any] = {
    "description": "Run shell commands on the user's machine and get their stdout, stderr and exit status.",
    "parameters": {
        "type": "object",
        "properties": {
            "commands": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Commands to run, in order.",
            },
            "timeout_ms": {"type": "integer", "description": "Optional time limit for the commands."},
            "max_output_length": {"type": "integer", "description": "Optional limit on the output kept."},
        },
        "required": ["commands"],
    },
}


def shell_call_item(item_id: str, call_id: str, arguments: str) -> dict[str, Any]:
    """The public ``shell_call`` for the model's call of the shell function."""
    try:
        args = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    commands = args.get("commands")
    if isinstance(commands, str):
        commands = [commands]
    action: dict[str, Any] = {
        "commands": [c for c in commands if isinstance(c, str)] if isinstance(commands, list) else []
    }
    for key in ("timeout_ms", "max_output_length"):
        value = args.get(key)
        action[key] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return {"id": item_id, "type": "shell_call", "call_id": call_id, "action": action, "status": "completed"}


# --- the client-executed tool_search tool ------------------------------------------------------

# A client-executed ``tool_search`` reaches the model as this function; the tools its output loaded
# join :class:`ToolMap`.
TOOL_SEARCH_FUNCTION = "tool_search"
TOOL_SEARCH_DECLARATION: dict[str, Any] = {
    "description": "Search for more tools to use. The tools found become callable in the next turns.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What the tools should do."}},
        "required": ["query"],
    },
}


def tool_search_call_item(item_id: str, call_id: str, arguments: str) -> dict[str, Any]:
    """The public ``tool_search_call`` for the model's call of the tool_search function."""
    try:
        args = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        args = {}
    return {
        "id": item_id,
        "type": "tool_search_call",
        "call_id": call_id,
        "arguments": args if isinstance(args, dict) else {},
        "execution": "client",
        "status": "completed",
    }


# --- the client-owned apply_patch and local_shell tools ------------------------------------------

# Both work like ``shell``: a function for the model, the public call item for the client.
APPLY_PATCH_FUNCTION = "apply_patch"
APPLY_PATCH_DECLARATION: dict[str, Any] = {
    "description": "Create, update or delete one file of the user's workspace with a diff.",
    "parameters": {
        "type": "object",
        "properties": {
            "type": {
                "type": "string",
                "enum": ["create_file", "update_file", "delete_file"],
                "description": "What to do with the file.",
            },
            "path": {"type": "string", "description": "The file's path, relative to the workspace root."},
            "diff": {"type": "string", "description": "The diff to apply (not for delete_file)."},
        },
        "required": ["type", "path"],
    },
}
LOCAL_SHELL_FUNCTION = "local_shell"
LOCAL_SHELL_DECLARATION: dict[str, Any] = {
    "description": "Run one command on the user's machine and get its output.",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The command and its arguments (argv).",
            },
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Environment variables to set.",
            },
            "timeout_ms": {"type": "integer", "description": "Optional time limit."},
            "working_directory": {"type": "string", "description": "Optional working directory."},
            "user": {"type": "string", "description": "Optional user to run the command as."},
        },
        "required": ["command"],
    },
}


def _arguments(arguments: str) -> dict[str, Any]:
    try:
        args = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def apply_patch_call_item(item_id: str, call_id: str, arguments: str) -> dict[str, Any]:
    """The public ``apply_patch_call`` for the model's call of the apply_patch function."""
    args = _arguments(arguments)
    kind = args.get("type")
    operation: dict[str, Any] = {
        "type": kind if kind in ("create_file", "update_file", "delete_file") else "update_file",
        "path": args["path"] if isinstance(args.get("path"), str) else "",
    }
    if operation["type"] != "delete_file":
        operation["diff"] = args["diff"] if isinstance(args.get("diff"), str) else ""
    return {
        "id": item_id,
        "type": "apply_patch_call",
        "call_id": call_id,
        "operation": operation,
        "status": "completed",
    }


def local_shell_call_item(item_id: str, call_id: str, arguments: str) -> dict[str, Any]:
    """The public ``local_shell_call`` for the model's call of the local_shell function."""
    args = _arguments(arguments)
    command = args.get("command")
    if isinstance(command, str):
        command = [command]
    env = args.get("env")
    action: dict[str, Any] = {
        "type": "exec",
        "command": [c for c in command if isinstance(c, str)] if isinstance(command, list) else [],
        "env": {k: v for k, v in env.items() if isinstance(v, str)} if isinstance(env, dict) else {},
    }
    timeout = args.get("timeout_ms")
    action["timeout_ms"] = timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else None
    for key in ("user", "working_directory"):
        action[key] = args[key] if isinstance(args.get(key), str) else None
    return {
        "id": item_id,
        "type": "local_shell_call",
        "call_id": call_id,
        "action": action,
        "status": "completed",
    }


# Client tools with a fixed function: the tool type → (the function's name, its declaration).
FIXED_FUNCTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "shell": (SHELL_FUNCTION, SHELL_DECLARATION),
    "apply_patch": (APPLY_PATCH_FUNCTION, APPLY_PATCH_DECLARATION),
    "local_shell": (LOCAL_SHELL_FUNCTION, LOCAL_SHELL_DECLARATION),
}
# Their public call items → (the tool type, the field the model's arguments are rebuilt from).
FIXED_CALLS: dict[str, tuple[str, str]] = {
    "shell_call": ("shell", "action"),
    "apply_patch_call": ("apply_patch", "operation"),
    "local_shell_call": ("local_shell", "action"),
}

# Client tool kind → (public item type, builder) for calls buffered whole and streamed as one item.
WHOLE_CALLS = {
    "shell": ("shell_call", shell_call_item),
    "apply_patch": ("apply_patch_call", apply_patch_call_item),
    "local_shell": ("local_shell_call", local_shell_call_item),
    "tool_search": ("tool_search_call", tool_search_call_item),
}
