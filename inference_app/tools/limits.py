"""``max_tool_calls``: validation and the per-response counter the tool loop keeps.

Exactly as the spec's "max_tool_calls" section says: an integer from 1 to 9223372036854775807
(a JSON boolean is not an integer), counting dispatched built-in calls (web search, MCP calls, code
interpreter) across every round, failed ones included; MCP listing and client calls do not count.
The messages are the OpenAI reference's, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.core.errors import BadRequest, json_type_name

MAX_TOOL_CALLS_MIN = 1
MAX_TOOL_CALLS_MAX = 9223372036854775807
PARAM = "max_tool_calls"
# Kinds whose first refused call stays in the output (web_search_call at "searching",
# code_interpreter_call at "interpreting"); a refused MCP call is omitted.
KEPT_REFUSED_KINDS = frozenset({"web_search", "code_interpreter"})


def validate_max_tool_calls(value: Any) -> int | None:
    """The validated ``max_tool_calls`` (``None`` when absent/null) or :class:`BadRequest`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(
            f"Invalid type for '{PARAM}': expected an integer, but got {json_type_name(value)} instead.",
            param=PARAM,
            code="invalid_type",
        )
    if value < MAX_TOOL_CALLS_MIN:
        raise BadRequest(
            f"Invalid '{PARAM}': integer below minimum value. "
            f"Expected a value >= {MAX_TOOL_CALLS_MIN}, but got {value} instead.",
            param=PARAM,
            code="integer_below_min_value",
        )
    if value > MAX_TOOL_CALLS_MAX:
        raise BadRequest(
            f"Invalid '{PARAM}': integer above maximum value. "
            f"Expected a value <= {MAX_TOOL_CALLS_MAX}, but got {value} instead.",
            param=PARAM,
            code="integer_above_max_value",
        )
    return value


def limit_output(limit: int) -> str:
    """The tool output the model receives for a call over the limit."""
    return orjson.dumps({"error": f"UserError: Reached tool call limit of {limit}"}).decode()


@dataclass
class ToolCallBudget:
    """Per-response ``max_tool_calls`` accounting: :meth:`admit` each gateway call in order. A refused
    call is not run; the model gets :attr:`refusal_output`, and from then on no gateway tools are
    offered (:attr:`offer_gateway_tools`)."""

    limit: int | None
    dispatched: int = 0
    refused: int = 0
    kept_refused_item: bool = field(default=False)

    def admit(self) -> bool:
        if self.limit is not None and self.dispatched >= self.limit:
            self.refused += 1
            return False
        self.dispatched += 1
        return True

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.dispatched >= self.limit

    @property
    def refuse_next(self) -> bool:
        """Whether the next gateway call would be refused (the limit is used up)."""
        return self.exhausted

    @property
    def offer_gateway_tools(self) -> bool:
        return self.refused == 0

    @property
    def refusal_output(self) -> str:
        assert self.limit is not None, "no call is refused without a limit"
        return limit_output(self.limit)

    def keep_refused_item(self, kind: str) -> bool:
        """Whether a refused call of ``kind`` keeps its public item (only the first such call)."""
        if kind in KEPT_REFUSED_KINDS and not self.kept_refused_item:
            self.kept_refused_item = True
            return True
        return False
