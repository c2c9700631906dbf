"""The gateway tool loop of the Responses executor: built-in tool calls between inference rounds.

:meth:`ToolLoop.prepare` classifies and validates the tools (and discovers MCP tools) before any
streamed byte, so every refusal is a 400; :meth:`ToolLoop.on_gateway_call` decides approval and
``max_tool_calls`` and emits the public item; :meth:`ToolLoop.execute_round` runs a round's calls
concurrently. The model sees each built-in item as a function call and output
(:meth:`ToolLoop.model_items`); the text it saw is stored under :data:`PRIVATE_KEY`, never returned.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from gateway.core import errors
from gateway.core.config import Config
from gateway.core.ids import new_id
from inference_app.tools import (
    FunctionDef,
    McpListing,
    ToolCall,
    ToolCallBudget,
    ToolResult,
    ToolSet,
    call_requires_approval,
    classify_tools,
    discover_mcp_tools,
    listings_from_items,
    run_gateway_calls,
    validate_max_tool_calls,
)
from inference_app.tools.base import (
    FILE_SEARCH_FUNCTION,
    GATEWAY_TOOL_TYPES,
    WEB_SEARCH_TYPES,
    error_output,
    mcp_function_name,
)
from inference_app.tools.file_search import model_output, queries_of
from inference_app.tools.mcp import check_server_allowed
from responses_app.engine import tool_search, translate
from responses_app.features import compaction
from responses_app.protocol.multi_agent_config import single_agent_view
from responses_app.storage.input_files import INPUT_FILES, model_message

if TYPE_CHECKING:
    from gateway.core.sse import Event
    from responses_app.engine.domain import Emitting, Prepared

# The model's view of a built-in item, stored with the item and stripped from everything returned.
PRIVATE_KEY = "_gateway"
GATEWAY_ITEM_TYPES = frozenset({"web_search_call", "code_interpreter_call", "file_search_call", "mcp_call"})
SOURCES_INCLUDE = "web_search_call.action.sources"
OUTPUTS_INCLUDE = "code_interpreter_call.outputs"
RESULTS_INCLUDE = "file_search_call.results"
# incomplete_details.reason when [responses] max_rounds rounds all ended in gateway tool calls: the
# loop ran out of its output budget, the reason OpenAI reports when its own tool loop stops.
ROUND_CAP_REASON = "max_output_tokens"
ID_PREFIX = {
    "web_search_call": "ws",
    "code_interpreter_call": "ci",
    "file_search_call": "fs",
    "mcp_call": "mcp",
    "mcp_list_tools": "mcpl",
    "mcp_approval_request": "mcpr",
}


def public_item(data: dict[str, Any]) -> dict[str, Any]:
    """An item as the API returns it: without the model's private view."""
    if PRIVATE_KEY in data:
        return {k: v for k, v in data.items() if k != PRIVATE_KEY}
    return data


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def denied_output(reason: Any) -> str:
    message = "The user denied this tool call; it was not run."
    if isinstance(reason, str) and reason:
        message += f" Reason: {reason}"
    return error_output(message)


def web_search_available(config: Config) -> bool:
    """Whether a search provider is usable; without one ``web_search`` is withheld from the model
    (the request proceeds without it, as Codex expects)."""
    ws = config.web_search
    if ws.provider in ("brave", "tavily"):
        return bool(config.web_search_api_key.get_secret_value())
    return bool(ws.base_url)


@dataclass
class _Pending:
    """A dispatched call of this round, its public item at ``index`` of the output."""

    fn: FunctionDef
    call: ToolCall
    index: int
    approval_request_id: str | None = None


@dataclass
class ToolLoop:
    toolset: ToolSet
    budget: ToolCallBudget
    config: Config
    include: frozenset[str] = frozenset()
    listings: list[McpListing] = field(default_factory=list)  # discovered for this response
    approvals: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    # item id -> {"call_id", "name", "arguments", "output"}: what the model saw for this response's items.
    model_calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (output position, model items) for refused calls whose public item is omitted.
    hidden: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)
    pending: list[_Pending] = field(default_factory=list)
    ends_response: bool = False  # an approval request was emitted this round
    round_calls: int = 0  # gateway calls the model made this round (run or refused)
    search: tool_search.ServerToolSearch | None = None  # a server-executed tool_search, if declared

    # --- before the response starts ------------------------------------------------------------

    @classmethod
    async def prepare(cls, prepared: Prepared, config: Config, *, discover: bool = True) -> ToolLoop:
        """Validate and classify the tools; discover MCP tools (400s before any byte). ``discover=False``
        only checks (a background request discovers when it runs)."""
        raw = prepared.raw
        budget = ToolCallBudget(validate_max_tool_calls(raw.get("max_tool_calls")))
        declared = raw.get("tools")
        if isinstance(declared, list) and not web_search_available(config):
            # No search provider: web_search is withheld from the model (ToolMap does the same).
            declared = [
                t for t in declared if not (isinstance(t, dict) and t.get("type") in WEB_SEARCH_TYPES)
            ]
        toolset = classify_tools(declared, config=config, owner=prepared.owner)
        approvals = _approvals(prepared.history, prepared.new_items)
        include = frozenset(prepared.request.include or ())
        search = _server_search(prepared)
        if not toolset.mcp_servers:
            return cls(toolset, budget, config, include, approvals=approvals, search=search)
        if not discover:
            for server in toolset.mcp_servers:
                await check_server_allowed(server, config)
            return cls(toolset, budget, config, include, approvals=approvals, search=search)
        declared = {server.label for server in toolset.mcp_servers}
        # One mcp_list_tools item per server label per history: earlier listings are re-offered.
        prior = [
            listing
            for listing in listings_from_items([*prepared.history, *prepared.new_items])
            if listing.server_label in declared
        ]
        listings = await discover_mcp_tools(
            toolset, config=config, skip_labels={listing.server_label for listing in prior}
        )
        total = sum(len(listing.tools) for listing in (*prior, *listings))
        if total > config.mcp.max_tools:
            raise errors.BadRequest(
                f"Too many MCP tools: the declared servers offer {total}, at most {config.mcp.max_tools} "
                "are allowed per request. Narrow them with allowed_tools.",
                param="tools",
                code="array_above_max_length",
            )
        toolset = toolset.with_mcp_tools([*prior, *listings])
        if search is not None and search.name in toolset.functions:
            raise _search_collision(toolset.functions[search.name].tool_index)
        return cls(toolset, budget, config, include, listings=listings, approvals=approvals, search=search)

    # --- what goes upstream --------------------------------------------------------------------

    def start_round(self) -> None:
        self.ends_response = False
        self.round_calls = 0

    def is_gateway(self, name: str) -> bool:
        if self.search is not None and name == self.search.name:
            return True
        return self.toolset.owner(name) == "gateway"

    def _functions(self) -> list[FunctionDef]:
        if not self.budget.offer_gateway_tools:
            return []
        functions = self.toolset.model_functions()
        if self.search is not None:
            functions.append(
                FunctionDef(
                    self.search.name,
                    "tool_search",
                    self.search.description,
                    translate.TOOL_SEARCH_DECLARATION["parameters"],
                    -1,
                )
            )
        return functions

    def responses_tools(self, declared: Iterable[Any] | None) -> list[dict[str, Any]]:
        """The ``tools`` of a ``/v1/responses`` round: declared tools without the gateway's built-ins,
        plus one plain function per gateway tool while ``max_tool_calls`` allows."""
        out = [t for t in declared or () if not (isinstance(t, dict) and t.get("type") in GATEWAY_TOOL_TYPES)]
        return out + [f.as_responses_tool() for f in self._functions()]

    def chat_tools(self) -> list[dict[str, Any]]:
        """The gateway functions of a ``/v1/chat/completions`` round (client tools are added apart)."""
        return [f.as_chat_tool() for f in self._functions()]

    def tool_choice(self, choice: Any) -> Any:
        """``tool_choice`` naming a built-in tool, as the function the model sees."""
        if not isinstance(choice, dict):
            return choice
        kind = choice.get("type")
        name: str | None = None
        if kind in WEB_SEARCH_TYPES:
            name = "web_search"
        elif kind == "code_interpreter":
            name = "code_interpreter"
        elif kind == "file_search":
            name = FILE_SEARCH_FUNCTION
        elif kind == "mcp":
            label, tool = choice.get("server_label"), choice.get("name")
            if not isinstance(tool, str):
                return "required" if self._functions() else "auto"
            name = mcp_function_name(str(label), tool)
        else:
            return choice
        offered = {f.name for f in self._functions()}
        return {"type": "function", "name": name} if name in offered else "auto"

    def upstream_include(self, include: Any) -> list[str] | None:
        """``include`` entries about built-in items are the gateway's business, not the model's."""
        if not isinstance(include, list):
            return None
        kept = [i for i in include if not (isinstance(i, str) and i.split(".", 1)[0] in GATEWAY_ITEM_TYPES)]
        return kept or None

    def model_items(self, prior: list[dict[str, Any]], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """History and this response's output as the model sees them (function-call form)."""
        requests = {
            i["id"]: i for i in (*prior, *output) if i.get("type") == "mcp_approval_request" and "id" in i
        }
        out: list[dict[str, Any]] = []
        for item in prior:
            out += model_view(item, item.get(PRIVATE_KEY), requests)
        hidden = sorted(self.hidden, key=lambda h: h[0])
        for position, item in enumerate(output):
            for at, items in hidden:
                if at == position:
                    out += items
            out += model_view(item, self.model_calls.get(item.get("id", "")), requests)
        for at, items in hidden:
            if at >= len(output):
                out += items
        return out

    def stored_items(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The output items to store: public items plus the model's view of built-in ones."""
        stored = []
        for item in output:
            view = self.model_calls.get(item.get("id", ""))
            stored.append({**item, PRIVATE_KEY: view} if view is not None else item)
        return stored

    # --- events --------------------------------------------------------------------------------

    def listing_events(self, ex: Emitting) -> list[Event]:
        """One ``mcp_list_tools`` item per newly listed server (in_progress → completed/failed)."""
        out: list[Event] = []
        for listing in self.listings:
            item = {
                "id": new_id(ID_PREFIX["mcp_list_tools"]),
                "type": "mcp_list_tools",
                **listing.item_fields(),
                **ex.item_fields,
            }
            index = len(ex.output)
            ex.retain(listing.retained_bytes)
            added = {**item, "tools": [], "error": None}
            out.append(ex.sink.make("response.output_item.added", output_index=index, item=added))
            out.append(
                ex.sink.make("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=index)
            )
            kind = "completed" if listing.ok else "failed"
            out.append(
                ex.sink.make(f"response.mcp_list_tools.{kind}", item_id=item["id"], output_index=index)
            )
            out.append(ex.sink.make("response.output_item.done", output_index=index, item=item))
            ex.output.append(item)
        return out

    def on_gateway_call(self, ex: Emitting, call_id: str, name: str, arguments: str) -> list[Event]:
        """The model called gateway function ``name``: approval, budget, then the item's first events."""
        self.round_calls += 1
        if self.search is not None and name == self.search.name:
            return self._search(ex, call_id, name, arguments)
        fn = self.toolset.functions[name]
        if fn.kind == "mcp" and call_requires_approval(self.toolset, name):
            self.ends_response = True
            item = {
                "id": new_id(ID_PREFIX["mcp_approval_request"]),
                "type": "mcp_approval_request",
                "server_label": fn.server_label,
                "name": fn.mcp_tool_name,
                "arguments": arguments,
            }
            return ex.whole(item)
        if not self.budget.admit():
            return self._refuse(ex, fn, call_id, name, arguments)
        call = self.toolset.make_call(call_id, name, arguments)
        return self._start(ex, fn, call)

    def _search(self, ex: Emitting, call_id: str, name: str, arguments: str) -> list[Event]:
        """A server-run tool search: done at once (no I/O); its call and output items are emitted
        and the tools found are offered to the model from the next round on."""
        assert self.search is not None
        if not self.budget.admit():  # a built-in tool call: it counts against max_tool_calls
            view = {
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
                "output": self.budget.refusal_output,
            }
            self.hidden.append((len(ex.output), _function_pair(view)))
            return []
        args, query = tool_search.query_of(arguments)
        found = self.search.search(query)
        out: list[Event] = []
        for item in tool_search.items(call_id, args, found):
            out += ex.whole(item)
        ex.client_tools.load([ex.output[-1]])
        return out

    def _refuse(self, ex: Emitting, fn: FunctionDef, call_id: str, name: str, arguments: str) -> list[Event]:
        """Over ``max_tool_calls``: not run; the model gets the limit error; one item may stay."""
        view = {
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "output": self.budget.refusal_output,
        }
        if not self.budget.keep_refused_item(fn.kind):
            self.hidden.append((len(ex.output), _function_pair(view)))
            return []
        index = len(ex.output)
        item = {**self._new_item(fn, arguments), **ex.item_fields}
        out = self._opening_events(ex, item, index, arguments)
        out += self._dispatch_events(ex, item, index)
        # Left at "searching" / "interpreting", without a completed event (OpenAI's behaviour).
        item = {**item, "status": "searching" if fn.kind == "web_search" else "interpreting"}
        if fn.kind == "code_interpreter":
            item["code"] = _code_of(arguments)
        out.append(ex.sink.make("response.output_item.done", output_index=index, item=item))
        ex.retain(len(orjson.dumps(item)))
        ex.output.append(item)
        self.model_calls[item["id"]] = view
        return out

    def _start(
        self, ex: Emitting, fn: FunctionDef, call: ToolCall, approval_request_id: str | None = None
    ) -> list[Event]:
        index = len(ex.output)
        item = {**self._new_item(fn, call.arguments, approval_request_id), **ex.item_fields}
        out = self._opening_events(ex, item, index, call.arguments)
        if fn.kind == "code_interpreter":
            item["code"] = _code_of(call.arguments)
        ex.output.append(item)
        self.pending.append(_Pending(fn, call, index, approval_request_id))
        return out

    def _new_item(
        self, fn: FunctionDef, arguments: str, approval_request_id: str | None = None
    ) -> dict[str, Any]:
        if fn.kind == "web_search":
            return {
                "id": new_id(ID_PREFIX["web_search_call"]),
                "type": "web_search_call",
                "status": "in_progress",
                "action": _search_action(arguments),
            }
        if fn.kind == "file_search":
            return {
                "id": new_id(ID_PREFIX["file_search_call"]),
                "type": "file_search_call",
                "status": "in_progress",
                "queries": queries_of(arguments),
                "results": None,
            }
        if fn.kind == "code_interpreter":
            return {
                "id": new_id(ID_PREFIX["code_interpreter_call"]),
                "type": "code_interpreter_call",
                "status": "in_progress",
                "code": "",
                "container_id": new_id("cntr"),  # a fresh sandbox per call
                "outputs": None,
            }
        return {
            "id": new_id(ID_PREFIX["mcp_call"]),
            "type": "mcp_call",
            "status": "in_progress",
            "server_label": fn.server_label,
            "name": fn.mcp_tool_name,
            "arguments": arguments,
            "output": None,
            "error": None,
            "approval_request_id": approval_request_id,
        }

    def _opening_events(self, ex: Emitting, item: dict[str, Any], index: int, arguments: str) -> list[Event]:
        """``output_item.added`` and what is known before the call runs (the code, the arguments)."""
        sink, item_id, kind = ex.sink, item["id"], item["type"]
        added = dict(item)
        if kind == "mcp_call":
            added["arguments"] = ""
        out = [sink.make("response.output_item.added", output_index=index, item=added)]
        if kind in ("web_search_call", "file_search_call"):
            out.append(sink.make(f"response.{kind}.in_progress", item_id=item_id, output_index=index))
        elif kind == "code_interpreter_call":
            code = _code_of(arguments)
            out.append(
                sink.make("response.code_interpreter_call.in_progress", item_id=item_id, output_index=index)
            )
            if code:
                out.append(
                    sink.make(
                        "response.code_interpreter_call_code.delta",
                        item_id=item_id,
                        output_index=index,
                        delta=code,
                    )
                )
            out.append(
                sink.make(
                    "response.code_interpreter_call_code.done", item_id=item_id, output_index=index, code=code
                )
            )
        else:
            if arguments:
                out.append(
                    sink.make(
                        "response.mcp_call_arguments.delta",
                        item_id=item_id,
                        output_index=index,
                        delta=arguments,
                    )
                )
            out.append(
                sink.make(
                    "response.mcp_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    arguments=arguments,
                )
            )
        return out

    def _dispatch_events(self, ex: Emitting, item: dict[str, Any], index: int) -> list[Event]:
        """The events that say the call is running (or, refused, would have run)."""
        sink, item_id, kind = ex.sink, item["id"], item["type"]
        if kind in ("web_search_call", "file_search_call"):
            return [sink.make(f"response.{kind}.searching", item_id=item_id, output_index=index)]
        if kind == "code_interpreter_call":
            return [
                sink.make("response.code_interpreter_call.interpreting", item_id=item_id, output_index=index)
            ]
        return [sink.make("response.mcp_call.in_progress", item_id=item_id, output_index=index)]

    # --- the round boundary --------------------------------------------------------------------

    def has_boundary_work(self) -> bool:
        """Whether :meth:`run_approvals` or :meth:`execute_round` has anything to do: approved calls
        to run, or gateway calls of the round waiting."""
        return bool(self.approvals or self.pending)

    async def run_approvals(self, ex: Emitting) -> AsyncIterator[Event]:
        """Approved MCP calls (``mcp_approval_response`` inputs) run before the first round."""
        for request, _response in self.approvals:
            name = mcp_function_name(str(request.get("server_label")), str(request.get("name")))
            arguments = str(request.get("arguments") or "")
            if not self.is_gateway(name) or self.toolset.functions[name].kind != "mcp":
                # The continuation must declare the server again (credentials are never stored).
                for event in self._unavailable(ex, request, name, arguments):
                    yield event
                continue
            fn = self.toolset.functions[name]
            if not self.budget.admit():
                for event in self._refuse(ex, fn, request["id"], name, arguments):
                    yield event
                continue
            call = self.toolset.make_call(request["id"], name, arguments)
            for event in self._start(ex, fn, call, approval_request_id=request["id"]):
                yield event
        async for event in self.execute_round(ex):
            yield event

    def _unavailable(self, ex: Emitting, request: dict[str, Any], name: str, arguments: str) -> list[Event]:
        message = (
            f"MCP server '{request.get('server_label')}' with tool '{request.get('name')}' is not declared "
            "in this request: declare the server again (with its credentials) to run an approved call."
        )
        index = len(ex.output)
        item = {
            "id": new_id(ID_PREFIX["mcp_call"]),
            "type": "mcp_call",
            "status": "failed",
            "server_label": request.get("server_label"),
            "name": request.get("name"),
            "arguments": arguments,
            "output": None,
            "error": {"type": "mcp_protocol_error", "code": -32601, "message": message},
            "approval_request_id": request["id"],
            **ex.item_fields,
        }
        out = [
            ex.sink.make(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "error": None},
            ),
            ex.sink.make("response.mcp_call.failed", item_id=item["id"], output_index=index),
            ex.sink.make("response.output_item.done", output_index=index, item=item),
        ]
        ex.retain(len(orjson.dumps(item)))
        ex.output.append(item)
        self.model_calls[item["id"]] = {
            "call_id": request["id"],
            "name": name,
            "arguments": arguments,
            "output": error_output(message),
        }
        return out

    async def execute_round(self, ex: Emitting) -> AsyncIterator[Event]:
        """Run this round's calls concurrently; finish their items in call order."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        for p in pending:
            for event in self._dispatch_events(ex, ex.output[p.index], p.index):
                yield event
        results = await run_gateway_calls([p.call for p in pending], config=self.config)
        for p, result in zip(pending, results, strict=True):
            item = self._finished_item(ex.output[p.index], p, result)
            ex.output[p.index] = item
            view: dict[str, Any] = {
                "call_id": p.call.call_id,
                "name": p.call.name,
                "arguments": p.call.arguments,
                "output": result.output,
            }
            if result.results is not None:
                # Kept with the stored item: a retrieve with include shows them (api.resources).
                view["results"] = result.results
                for found in result.results:
                    ex.citable[found["file_id"]] = found["filename"]
            ex.retain(len(orjson.dumps(item)) + len(orjson.dumps(view)))
            self.model_calls[item["id"]] = view
            kind = item["type"]
            if kind == "mcp_call":
                state = "completed" if result.ok else "failed"
                yield ex.sink.make(f"response.mcp_call.{state}", item_id=item["id"], output_index=p.index)
            elif result.ok:
                yield ex.sink.make(f"response.{kind}.completed", item_id=item["id"], output_index=p.index)
            yield ex.sink.make("response.output_item.done", output_index=p.index, item=item)

    def _finished_item(self, item: dict[str, Any], p: _Pending, result: ToolResult) -> dict[str, Any]:
        item = {**item, "status": result.status}
        kind = item["type"]
        if kind == "web_search_call":
            action = dict(result.action or item["action"])
            if SOURCES_INCLUDE not in self.include:
                action.pop("sources", None)
            item["action"] = action
        elif kind == "file_search_call":
            if result.queries is not None:
                item["queries"] = result.queries
            item["results"] = result.results if RESULTS_INCLUDE in self.include and result.ok else None
        elif kind == "code_interpreter_call":
            if result.code is not None:
                item["code"] = result.code
            if OUTPUTS_INCLUDE in self.include:
                item["outputs"] = result.outputs
        else:
            item["output"] = result.mcp_output if result.ok else None
            if not result.ok:
                message = result.error or "the MCP call failed"
                if result.error_type == "tool_execution":
                    item["error"] = {
                        "type": "mcp_tool_execution_error",
                        "content": [{"type": "text", "text": message}],
                    }
                else:
                    item["error"] = {"type": "mcp_protocol_error", "code": -32603, "message": message}
        return item


def _search_collision(index: int) -> errors.BadRequest:
    name = translate.TOOL_SEARCH_FUNCTION
    return errors.BadRequest(
        f"Invalid 'tools[{index}]': tool '{name}' reaches the model under the same name as the "
        "server-executed tool search. Tool names must be unique.",
        param=f"tools[{index}]",
        code="tool_name_collision",
    )


def _server_search(prepared: Prepared) -> tool_search.ServerToolSearch | None:
    """The request's server-executed tool search; a client tool named like its function is refused."""
    search = tool_search.ServerToolSearch.from_tools(prepared.raw.get("tools"))
    if search is None:
        return None
    tool_map = prepared.tool_map
    taken = tool_map.by_upstream.get(search.name) if tool_map is not None else None
    if taken is not None:
        declared = prepared.raw.get("tools") or []
        index = next(
            (i for i, t in enumerate(declared) if isinstance(t, dict) and search.name in (t.get("name"),)),
            0,
        )
        raise _search_collision(index)
    return search


# --- the model's view: built-in items <-> function calls ------------------------------------------


def _function_pair(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function_call",
            "call_id": view["call_id"],
            "name": view["name"],
            "arguments": view["arguments"],
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": view["call_id"], "output": view["output"]},
    ]


def _reconstructed(item: dict[str, Any]) -> dict[str, Any] | None:
    """The model's view of a built-in item stored without one (replayed by a client, or older)."""
    kind = item.get("type")
    call_id = str(item.get("id") or new_id("call"))
    status = item.get("status")
    if kind == "web_search_call":
        action = item.get("action") or {}
        queries = action.get("queries") or ([action["query"]] if action.get("query") else [])
        sources = [str(s.get("url")) for s in action.get("sources") or () if isinstance(s, dict)]
        output = "Sources:\n" + "\n".join(sources) if sources else _json({"status": status})
        return {
            "call_id": call_id,
            "name": "web_search",
            "arguments": _json({"queries": queries}),
            "output": output,
        }
    if kind == "file_search_call":
        queries = [q for q in item.get("queries") or () if isinstance(q, str)]
        results = item.get("results")
        if isinstance(results, list):
            output = model_output(queries, [r for r in results if isinstance(r, dict) and "file_id" in r])
        else:
            output = _json({"status": status})
        return {
            "call_id": call_id,
            "name": FILE_SEARCH_FUNCTION,
            "arguments": _json({"queries": queries}),
            "output": output,
        }
    if kind == "code_interpreter_call":
        logs = [o.get("logs", "") for o in item.get("outputs") or () if isinstance(o, dict)]
        output = "".join(logs) if logs else _json({"status": status})
        return {
            "call_id": call_id,
            "name": "code_interpreter",
            "arguments": _json({"code": item.get("code") or ""}),
            "output": output,
        }
    if kind == "mcp_call":
        if item.get("output") is not None:
            output = str(item["output"])
        else:
            error = item.get("error")
            output = error_output(error if error is not None else status)
        return {
            "call_id": call_id,
            "name": mcp_function_name(str(item.get("server_label")), str(item.get("name"))),
            "arguments": str(item.get("arguments") or ""),
            "output": output,
        }
    return None


def model_view(
    item: dict[str, Any], view: dict[str, Any] | None, requests: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One history item as the model's input items."""
    kind = item.get("type")
    if kind in GATEWAY_ITEM_TYPES:
        view = view if isinstance(view, dict) else _reconstructed(item)
        return _function_pair(view) if view is not None else []
    if kind in ("mcp_list_tools", "mcp_approval_request"):
        return []  # the tools reach the model as functions; an approval shows as the call it became
    if kind == "mcp_approval_response":
        request = requests.get(str(item.get("approval_request_id")))
        if item.get("approve") is True or request is None:
            return []  # an approved call is the mcp_call item that follows
        name = mcp_function_name(str(request.get("server_label")), str(request.get("name")))
        return _function_pair(
            {
                "call_id": request["id"],
                "name": name,
                "arguments": str(request.get("arguments") or ""),
                "output": denied_output(item.get("reason")),
            }
        )
    if kind == "message" and isinstance(view, dict) and INPUT_FILES in view:
        return [model_message(item, view)]  # input files as the text the model was given
    if PRIVATE_KEY in item:
        return [public_item(item)]
    return [item]


def _approvals(
    history: list[dict[str, Any]], new_items: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Approved ``mcp_approval_response`` inputs with their requests; unknown requests are a 400."""
    requests = {i.get("id"): i for i in history if i.get("type") == "mcp_approval_request"}
    answered = {i.get("approval_request_id") for i in history if i.get("type") == "mcp_approval_response"}
    approved: list[tuple[dict[str, Any], dict[str, Any]]] = []
    seen: set[Any] = set()
    for index, item in enumerate(new_items):
        if item.get("type") != "mcp_approval_response":
            continue
        request_id = item.get("approval_request_id")
        if not isinstance(request_id, str) or request_id not in requests:
            raise errors.BadRequest(
                f"No MCP approval request found with id '{request_id}'.",
                param="input",
                code="invalid_value",
            )
        if not isinstance(item.get("approve"), bool):
            raise errors.BadRequest(
                "Missing required parameter: 'approve' (a boolean).",
                param=f"input[{index}].approve",
                code="missing_required_parameter",
            )
        if request_id in answered or request_id in seen:
            raise errors.BadRequest(
                f"MCP approval request '{request_id}' has already been answered.",
                param="input",
                code="invalid_value",
            )
        seen.add(request_id)
        if item["approve"]:
            approved.append((requests[request_id], item))
    return approved


def _search_action(arguments: str) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        value = {}
    queries = value.get("queries") if isinstance(value, dict) else None
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list):
        queries = []
    queries = [q for q in queries if isinstance(q, str)]
    return {"type": "search", "query": queries[0] if queries else "", "queries": queries}


def _code_of(arguments: str) -> str:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("code"), str):
        return str(value["code"])
    return arguments


def history_model_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored or replayed history as the upstream sees it outside a running response (the compact
    endpoint; here rather than in compaction, which tool_loop's importers reach): gateway tool items in their function-call form, client tools under flat names."""
    requests = {
        item["id"]: item
        for item in items
        if item.get("type") == "mcp_approval_request" and isinstance(item.get("id"), str)
    }
    viewed: list[dict[str, Any]] = []
    for item in single_agent_view(items):  # a multi-agent turn: the root's items only
        viewed += model_view(item, item.get(PRIVATE_KEY), requests)
    tool_map = translate.ToolMap.build(None)
    return [tool_map.upstream_item(item) for item in compaction.model_view(viewed)]
