"""Server-executed ``tool_search``: the gateway searches the request's deferred tools itself.

The model sees one ``tool_search`` function; a call ranks the ``defer_loading`` tools by the query's
words in names (weighted most) and descriptions. The tool loop emits ``tool_search_call`` /
``tool_search_output`` and loads the matches for the next rounds (and again on a continuation).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core.ids import new_id
from responses_app.engine.translate import ID_PREFIX, TOOL_SEARCH_DECLARATION, TOOL_SEARCH_FUNCTION

# Matches returned per search: enough for a task's next step, few enough to keep the model's
# tool list short.
MAX_RESULTS = 5
NAME_WEIGHT = 3  # a query word in the tool's (or its namespace's) name
DESCRIPTION_WEIGHT = 1  # a query word in a description
_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")


def words(text: Any) -> set[str]:
    """The words of ``text``: snake_case, kebab-case and camelCase split, lowercased, a plural
    ``s`` dropped (``files`` finds ``file``)."""
    if not isinstance(text, str):
        return set()
    out = set()
    for word in _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower()):
        out.add(word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word)
    return out


@dataclass(frozen=True)
class Candidate:
    """One deferred tool: as declared, and the namespace holding it (None at top level)."""

    tool: dict[str, Any]
    namespace: dict[str, Any] | None
    order: int

    def score(self, query: set[str]) -> int:
        name = words(self.tool.get("name"))
        text = words(self.tool.get("description"))
        if self.namespace is not None:
            name |= words(self.namespace.get("name"))
            text |= words(self.namespace.get("description"))
        return sum(NAME_WEIGHT if w in name else DESCRIPTION_WEIGHT if w in text else 0 for w in query)


@dataclass(frozen=True)
class ServerToolSearch:
    """The request's server-executed tool search: its function and the deferred tools it searches."""

    description: str
    candidates: tuple[Candidate, ...]

    @classmethod
    def from_tools(cls, tools: Iterable[Any] | None) -> ServerToolSearch | None:
        """The search a request declares (``tool_search`` without ``execution: "client"``), or None."""
        tools = [t for t in tools or () if isinstance(t, Mapping)]
        declared = next(
            (t for t in tools if t.get("type") == "tool_search" and t.get("execution") != "client"), None
        )
        if declared is None:
            return None
        candidates: list[Candidate] = []
        for tool in tools:
            if tool.get("type") in ("function", "custom") and tool.get("defer_loading") is True:
                candidates.append(Candidate(dict(tool), None, len(candidates)))
            elif tool.get("type") == "namespace":
                for member in tool.get("tools") or ():
                    if isinstance(member, Mapping) and member.get("defer_loading") is True:
                        candidates.append(Candidate(dict(member), dict(tool), len(candidates)))
        description = declared.get("description")
        return cls(
            description
            if isinstance(description, str) and description
            else TOOL_SEARCH_DECLARATION["description"],
            tuple(candidates),
        )

    @property
    def name(self) -> str:
        return TOOL_SEARCH_FUNCTION

    def search(self, query: str) -> list[dict[str, Any]]:
        """The best matches for ``query``, as ``tool_search_output.tools``: top-level tools as
        declared, namespace members inside their namespace (one entry per namespace)."""
        wanted = words(query)
        scored = [(c.score(wanted), c) for c in self.candidates]
        best = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1].order))[:MAX_RESULTS]
        out: list[dict[str, Any]] = []
        namespaces: dict[str, dict[str, Any]] = {}
        for _, candidate in best:
            if candidate.namespace is None:
                out.append(candidate.tool)
                continue
            key = str(candidate.namespace.get("name"))
            if key not in namespaces:
                namespaces[key] = {k: v for k, v in candidate.namespace.items() if k != "tools"} | {
                    "tools": []
                }
                out.append(namespaces[key])
            namespaces[key]["tools"].append(candidate.tool)
        return out


def query_of(arguments: str) -> tuple[dict[str, Any], str]:
    """The model's arguments as an object, and the text to search for (``query``, else every
    string argument)."""
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}, arguments
    if not isinstance(value, dict):
        return {}, str(value)
    query = value.get("query")
    if isinstance(query, str):
        return value, query
    return value, " ".join(v for v in value.values() if isinstance(v, str))


def items(call_id: str, arguments: dict[str, Any], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's ``tool_search_call`` and ``tool_search_output`` for one server-run search."""
    return [
        {
            "id": new_id(ID_PREFIX["tool_search_call"]),
            "type": "tool_search_call",
            "call_id": call_id,
            "arguments": arguments,
            "execution": "server",
            "status": "completed",
        },
        {
            "id": new_id(ID_PREFIX["tool_search_output"]),
            "type": "tool_search_output",
            "call_id": call_id,
            "execution": "server",
            "status": "completed",
            "tools": tools,
        },
    ]
